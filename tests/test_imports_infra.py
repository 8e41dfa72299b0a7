"""``cluster create --help`` loads no google-cloud, and only ``core/clients.py`` imports it."""

from __future__ import annotations

import subprocess
import sys


def test_help_runs_offline_without_google_imports():
    code = (
        "import sys; sys.argv=['rlctl', 'cluster', 'create', '--help']\n"
        "from rlctl.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code in (0, None)\n"
        "assert not any(m.startswith('google.cloud') for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_only_clients_module_imports_google():
    from pathlib import Path

    import rlctl

    root = Path(rlctl.__file__).parent
    offenders = []
    for p in root.rglob("*.py"):
        if p.name == "clients.py" or p.parent.name == "trainer":
            continue
        for line in p.read_text().splitlines():
            line = line.strip()
            if line.startswith(("import google", "from google")) and not line.startswith(
                "from google.api_core"  # core/gcp/errors.py maps api_core exceptions
            ):
                offenders.append(f"{p}: {line}")
    assert offenders == []
