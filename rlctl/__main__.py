from rlctl.cli.app import main

main()
