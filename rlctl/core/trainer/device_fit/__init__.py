"""The fit check: a run's programs compiled for an accelerator that is not here
(``check.py``; its process: ``__main__.py``), and what it found (``report.py``)."""
