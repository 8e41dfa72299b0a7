"""bench/fuzz_cli.py's parts: the fuzzer runs the cases of bench/fuzz_cases/*.yaml.

* proc.py: rlctl as a subprocess, as a user without credentials runs it;
* judge.py: what makes one run's error unclear (or a traceback);
* files.py: writing, fingerprinting and reading back a case's files and run store;
* fixtures.py: the tiny model, the trained store, the fake GCS, mounts, ``Ctx``;
* case.py: ``Case`` (what the runner takes) and ``Outcome`` (what it found);
* templates.py: the placeholders of the data (``{tmp}``, ``{train}``, ...);
* registry.py and hooks/: the Python a case names (setups, checks, custom runners);
* loader.py: the data files read into cases, checked as they are read;
* runner.py: one case run and judged, ``--list``, the report.
"""
