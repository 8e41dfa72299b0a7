#!/usr/bin/env python3
"""Fuzz the installed ``rlctl`` CLI with bad input and faults, the way a new user or an
operator meets them, and count what goes wrong.

What it measures
----------------
Every case runs the installed console script (``.venv/bin/rlctl``) as a subprocess, from
its own temporary working directory, with no cloud credentials (``CLOUDSDK_CONFIG`` is an
empty folder, ``GOOGLE_APPLICATION_CREDENTIALS`` and every ``RLCTL_*`` variable unset) and
never with ``--debug`` (one case checks that ``--debug`` keeps the exit code). Each case
is put in at most three buckets:

* **traceback**: "Traceback (most recent call last)" on stdout or stderr.
* **unclear**: the exit code is not the one the README's table gives for the case (0 ok,
  1 unexpected, 2 bad input, 3 not found, 4 conflict, 5 permission denied, 6 quota,
  7 other cloud error, 8 missing extra, 130 interrupted); or the error is not one
  ``error: ...`` line (plus at most one ``hint: ...`` line after it; progress lines
  before it are fine); or it lacks the case's keyword (the file, field, or name to fix);
  or it says something the case forbids (a phase ``running`` for a dead process); or,
  with ``-o json``, stdout is neither empty nor one valid JSON document; or a library
  log line reaches stderr; or the command did not finish in its time limit.
* **lost/wrong**: a check of the run store after the command fails: an exit 2 ("nothing
  was changed") that left a run folder or a file behind, ``status`` that changed files,
  a good checkpoint or the other run changed or removed, ``status`` saying a dead
  process is active, metrics steps not 1..N exactly once and in order after a resume,
  a second writer that was not refused, and so on.

Families (``--list`` prints every case): names, hyperparams, config-files, data, model,
rewards, runs-dir, store-damage, cloud-no-creds, concurrency, signals, status-width; and
issue #47's: non-finite (a reward or a loss that goes NaN or inf, a NaN checkpoint's
export), spec-roundtrip (resume --steps bounded, nothing written that is not read
back), first-save (a disk twice the first checkpoint's size), store-truth (steps and
checkpoints from the files, stale runs' damage, --recover), messages (data files, hub
datasets offline, damaged checkpoints, gs:// endpoints and buckets) and reward-guest
(a reward that prints or exits, expression golds, shell completion).

Where the cases are
-------------------
The cases are data: ``bench/fuzz_cases/FAMILY.yaml``, one entry per case (its command
with placeholders, expected exit codes, keywords), read and checked by
``bench/fuzz/loader.py`` (bench/fuzz_cases/README.md says the form). What is code is
Python, named from the data: setups that damage a store or a model, checks of what a
command left, and custom runners (races, signals) in ``bench/fuzz/hooks/``. A case is
added by adding an entry, and a hook only when no existing one does what it needs.

Training cases use a tiny random Llama (``tests/fakes/tiny_model.py``) on 12 jsonl
problems with ``tests.fakes.rewards.digit_count``: one 2-step run takes ~15 s on 2 CPU
cores. Two such runs are trained once (``good``: completed, 2 steps; ``dmg``: 3 planned
steps, checkpoints 1 and 2, rolled back to "interrupted after step 2") and copied into
each store-damage case. Cases that need a read-only or a full file system mount a tmpfs
when ``mount`` works, and are skipped as root otherwise (chmod does not stop root).

How to run
----------
From the repository root (the whole run takes about 20 minutes on 2 CPU cores)::

    .venv/bin/python -m bench.fuzz_cli                      # every family
    .venv/bin/python -m bench.fuzz_cli --list               # the cases, without running
    .venv/bin/python -m bench.fuzz_cli --family store-damage
    .venv/bin/python -m bench.fuzz_cli --case lr-nan        # cases whose id contains it
    .venv/bin/python -m bench.fuzz_cli --json fuzz.json     # also every result as JSON

``--keep`` keeps the temporary folders, ``--seed N`` picks the signal moments. It prints
one row per family (cases, tracebacks, unclear, lost/wrong, skipped), a totals line,
then every case that was a traceback, unclear or lost (id, command, exit code, why,
first/last stderr line). Exit status 0 only with 0 tracebacks and 0 lost/wrong.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

from bench.fuzz.case import Case, Outcome
from bench.fuzz.fixtures import Ctx, Fixtures, Mounts
from bench.fuzz.loader import FAMILIES, CaseDataError, load_cases
from bench.fuzz.proc import CMD_TIMEOUT, RLCTL, TRAIN_TIMEOUT, Run
from bench.fuzz.runner import list_cases, report, run_case, short

# what scripts and ad-hoc checks imported from this module before its parts moved to
# bench/fuzz/ (the cases, as --list builds them: all_cases())
__all__ = [
    "CMD_TIMEOUT",
    "FAMILIES",
    "TRAIN_TIMEOUT",
    "Case",
    "Ctx",
    "Fixtures",
    "Mounts",
    "Run",
    "all_cases",
    "main",
]


def all_cases() -> list[Case]:
    """Every case of every family, in the order they run (as ``--list`` shows them)."""
    return load_cases()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        action="append",
        help="run only this family (repeatable)",
    )
    ap.add_argument("--case", action="append", help="run only cases whose id contains this")
    ap.add_argument("--json", metavar="PATH", help="write every result as JSON")
    ap.add_argument("--seed", type=int, default=0, help="seed of the signal moments")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders")
    args = ap.parse_args(argv)

    try:
        cases = all_cases()
    except CaseDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.family:
        cases = [c for c in cases if c.family in args.family]
    if args.case:
        cases = [c for c in cases if any(s in c.cid for s in args.case)]
    if args.list:
        list_cases(cases)
        return 0
    if not cases:
        print("no cases selected", file=sys.stderr)
        return 2

    # A shell's background job inherits SIGINT ignored, and so would every rlctl we
    # start: catch it here, so that exec gives the children the default again.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    root = Path(tempfile.mkdtemp(prefix="rlctl-fuzz-"))
    fx = Fixtures(root)
    fx.gcloud.mkdir(parents=True)
    t0 = time.monotonic()
    outcomes: list[Outcome] = []
    print(f"rlctl fuzz: {len(cases)} cases, {RLCTL}, temp {root}", flush=True)
    try:
        for i, case in enumerate(cases, 1):
            o = run_case(case, fx, root, args.seed, args.keep)
            outcomes.append(o)
            mark = (
                "SKIP"
                if o.skipped
                else "TB"
                if o.traceback
                else "LOST"
                if o.lost
                else "UNCLEAR"
                if o.unclear
                else "ok"
            )
            print(f"[{i:3}/{len(cases)}] {mark:7} {o.cid}  ({o.secs:.1f}s)", flush=True)
    except KeyboardInterrupt:
        print("interrupted: reporting the cases run so far", file=sys.stderr)
    finally:
        fx.mounts.release_under(root)
        fx.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    secs = time.monotonic() - t0
    report(outcomes, root, secs, fx)
    if args.json:
        data = {
            "seconds": round(secs, 1),
            "seed": args.seed,
            "rlctl": str(RLCTL),
            "tiny_train_seconds": fx.train_secs,
            "fixture_errors": fx.errors,
            "cases": [
                {
                    **o.__dict__,
                    "cmd": short(o.cmd, root),
                    "unclear": [short(x, root) for x in o.unclear],
                    "lost": [short(x, root) for x in o.lost],
                }
                for o in outcomes
            ],
        }
        Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    tbs = sum(o.traceback for o in outcomes)
    lost = sum(bool(o.lost) for o in outcomes)
    return 0 if tbs == 0 and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
