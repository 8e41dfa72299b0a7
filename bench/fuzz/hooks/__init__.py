"""The named hooks the data files point at (bench/fuzz/registry.py), by what they
touch: the case's folder (files.py, contents.py), checks of a run's output
(checks.py), the run store (store.py), cases that are code (runners.py). Importing
this package registers them all."""

from bench.fuzz.hooks import checks, contents, files, runners, store

__all__ = ["checks", "contents", "files", "runners", "store"]
