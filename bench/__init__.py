"""rlctl's benchmarks and soak tests, as a package: each script is a module of it.

Run one from the checkout's root as ``python -m bench.NAME`` (``tests`` and ``bench``
are then importable as the repo's packages, and ``rlctl`` is the checkout's), or by
its path, ``python bench/NAME.py``, which runs it again that way (``_by_path.py``).
A script imports its siblings as ``bench.NAME`` and the test fakes as ``tests.…``;
none edits ``sys.path`` or rebinds anything of ``rlctl``
(tests/bench/test_bench_hygiene.py).
"""
