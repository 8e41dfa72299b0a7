"""The trainer entrypoint of cluster pods: ``python -m rlctl.core.runs.pod --run URI``.

``URI`` is a run in a run store (``gs://BUCKET/PREFIX/RUN`` in a cluster, or a
local path). The spec is loaded from the store and run by the same code as
``rlctl resume``: the trainer restores the run's latest complete checkpoint, so
a restarted pod continues where the last one stopped. A run that is already
completed exits 0, so a restarted workload does not train twice.

In a multi-host workload every pod runs this entrypoint: it first joins the
other processes (``distributed.initialize``); process 0 then keeps the run's
status and files while the others train in lockstep and write nothing.

Progress goes to stdout as one JSON object per line (the pod's log) and, from the
process that keeps the run's files, as plain lines to the run store's ``train.log``
(what ``rlctl logs`` reads, whatever the backend); no environment value (the HF token
in particular) is ever printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def split_run_uri(uri: str) -> tuple[str, str]:
    """``gs://b/runs/RUN`` -> (``gs://b/runs``, ``RUN``)."""
    uri = uri.rstrip("/")
    root, sep, name = uri.rpartition("/")
    if not sep or not name or root in ("gs:", "gs:/"):
        from rlctl.core.errors import ConfigError

        raise ConfigError(f"{uri!r} does not name a run", hint="use gs://BUCKET/PREFIX/RUN")
    return root, name


def _log(event: dict[str, Any]) -> None:
    print(json.dumps(event, default=str), flush=True)


def _resume_when_free(root: str, name: str) -> Any:
    """resume_local, waiting out the lease of a predecessor pod that died without
    releasing it (it expires ttl seconds after its last renewal), then giving up."""
    import time

    from rlctl.core.errors import RunInUseError
    from rlctl.core.runs.local import resume_local
    from rlctl.core.store.gcs import lease_ttl_s

    deadline = time.monotonic() + lease_ttl_s() + 30
    while True:
        try:
            # its lines go to the run store's train.log too (RunLog), which 'rlctl logs'
            # reads for every backend; stdout (the pod's log) is the fallback
            return resume_local(root, name, progress=_log, command="pod")
        except RunInUseError as e:
            if time.monotonic() > deadline:
                raise
            _log({"event": "message", "message": f"waiting: {e}"})
            time.sleep(5)


def main(argv: list[str] | None = None) -> int:
    from rlctl.core.errors import RlctlError

    parser = argparse.ArgumentParser(prog="python -m rlctl.core.runs.pod", description=__doc__)
    parser.add_argument(
        "--run", default=os.environ.get("RLCTL_RUN"), help="the run's URI (default: $RLCTL_RUN)"
    )
    args = parser.parse_args(argv)
    if not args.run:
        parser.error("--run (or RLCTL_RUN) is required")
    try:
        from rlctl.core.phases import Phase
        from rlctl.core.runs.local import follow_run
        from rlctl.core.runs.status import read_status
        from rlctl.core.store import open_store
        from rlctl.core.trainer.api import agree, initialize

        root, name = split_run_uri(args.run)
        topo = initialize()  # before any JAX computation
        if topo.multi_process:
            _log(
                {
                    "event": "message",
                    "message": f"process {topo.process_index} of "
                    f"{topo.process_count}, {topo.device_count} devices in all",
                }
            )
        run = open_store(root).existing(name)
        if agree(read_status(run).get("phase") == Phase.COMPLETED, topo):
            _log({"event": "message", "message": f"run {name} is already completed"})
            return 0
        if topo.is_writer:
            record = _resume_when_free(root, name)
        else:
            record = follow_run(root, name, progress=_log)
    except RlctlError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    _log({"event": "done", "record": record.model_dump(mode="json")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
