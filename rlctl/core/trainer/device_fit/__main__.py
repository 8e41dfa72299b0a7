"""``python -m rlctl.core.trainer.device_fit``: the fit check in a process of its own.

Reads one JSON request on stdin (``spec``, ``config``: the model's config.json,
``target``: a ``CompileTarget``, ``engine``), prints one JSON answer on stdout (a
``DeviceFit``, or ``{"error": ..., "hint": ..., "kind": ...}`` for an error a user can
act on), and progress lines on stderr prefixed ``PROGRESS`` (the rest of stderr is the
libraries' own: libtpu's start-up warnings among them). The run driver
(``rlctl.core.runs.fit``) starts it with ``JAX_PLATFORMS=cpu``.
"""

from __future__ import annotations

import json
import sys

PROGRESS = "rlctl-fit: "  # api.FIT_PROGRESS


def main() -> int:
    from rlctl.core.config.compile_targets import CompileTarget
    from rlctl.core.config.models import RunSpec
    from rlctl.core.errors import RlctlError

    request = json.loads(sys.stdin.read())

    def say(line: str) -> None:
        print(PROGRESS + line, file=sys.stderr, flush=True)

    try:
        from rlctl.core.trainer.device_fit.check import check

        report = check(
            RunSpec.model_validate(request["spec"]),
            request["config"],
            CompileTarget.model_validate(request["target"]),
            engine=request.get("engine", "vanilla"),
            say=say,
        )
    except RlctlError as e:
        print(json.dumps({"error": e.message, "hint": e.hint, "kind": type(e).__name__}))
        return 0
    print(report.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
