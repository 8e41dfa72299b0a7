"""What runs the programs and the process around them: compiles and their cache, memory
budgets, the numerics table, the devices of a distributed run, the typed events of a
run's phases and its stop signals."""
