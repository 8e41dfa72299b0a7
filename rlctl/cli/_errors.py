"""Turn every exception that reaches a command into one line on stderr plus the
documented exit code (README "Exit codes").

Applied to every command (``@guarded``), so the behaviour is the same under the
console script and under ``typer.testing.CliRunner``. rlctl's own errors carry
their message, hint and code; anything else is a bug or an environment problem
we did not foresee: exit 1 with its first line and "run again with --debug",
never a traceback. ``--debug`` adds the traceback (and keeps the exit code), so it
is one flag away.

With ``-o json`` the same error is also one JSON object on stdout,
``{"error": ..., "hint": ..., "exit_code": N}``: a script that parses stdout gets a
document on failure too, not an empty string. Errors click raises while it parses the
command line come before any command runs; ``app.main`` reports those.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])
MAX_MESSAGE = 300  # a TensorStore or API error can run to 60 lines: keep the gist


def unexpected_message(e: BaseException) -> str:
    """``Type: first line of the message``, cut to a readable length."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _is_cli_flow(e: BaseException) -> bool:
    """typer's own exits and usage errors: typer reports them itself."""
    return isinstance(e, (typer.Exit, typer.Abort)) or type(e).__module__.split(".")[0] in (
        "click",
        "typer",
    )


def guarded(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from rlctl.cli._options import state
        from rlctl.cli._output import Output
        from rlctl.core.errors import RlctlError

        # Every command takes ``ctx: typer.Context``; typer passes parameters by name.
        ctx = kwargs.get("ctx")
        debug = bool(ctx is not None and hasattr(ctx, "find_root") and state(ctx).debug)
        # the raw flag, not make_output's check: '-o xml' is itself an error to report
        out = Output("json" if str(kwargs.get("output") or "").lower() == "json" else "table")
        try:
            return fn(*args, **kwargs)
        except RlctlError as e:
            if debug:  # the traceback too, but the same exit code: scripts rely on it
                traceback.print_exc()
            out.failure(e.message, e.hint, e.exit_code)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt as e:
            if debug:
                traceback.print_exc()
            why = str(e)  # a reward's own KeyboardInterrupt names the reward
            out.failure(f"interrupted: {why}" if why else "interrupted", None, 130)
            raise typer.Exit(130) from None
        except Exception as e:
            if debug or _is_cli_flow(e):
                raise
            out.failure(
                f"unexpected error: {unexpected_message(e)}",
                "run again with --debug for the traceback, and report it",
                1,
            )
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]  # wraps keeps fn's signature: an F


def _json_requested(argv: list[str]) -> bool:
    """Whether the command line asked for ``-o json``, read from the raw words: when
    click's parsing failed there are no parsed options to ask."""
    import os

    for i, a in enumerate(argv):
        if a == "--":
            break
        if a in ("-o", "--output") and i + 1 < len(argv):
            if argv[i + 1].lower() == "json":
                return True
        elif a.lower() in ("-ojson", "--output=json"):
            return True
    return os.environ.get("RLCTL_OUTPUT", "").lower() == "json"


def usage_error(e: Any, argv: list[str]) -> int:
    """Report an error click raised while parsing (``e``; None: the user aborted a
    prompt) as one line plus a hint naming the command's --help; return the exit code.

    ``rlctl`` alone (no command) is typer's "no arguments: show the help", raised as a
    usage error too: that one prints the help as it always did.
    """
    from rlctl.cli._output import Output

    out = Output("json" if _json_requested(argv) else "table")
    if e is None:
        out.failure("aborted", None, 1)
        return 1
    if type(e).__name__ == "NoArgsIsHelpError":
        e.show()
        return int(e.exit_code)
    ctx = getattr(e, "ctx", None)
    command = getattr(ctx, "command_path", None) or "rlctl"
    hint = f"see '{command} --help'" if ctx is not None else None
    out.failure(e.format_message() + _given(e, argv), hint, int(e.exit_code))
    return int(e.exit_code)


def _given(e: Any, argv: list[str]) -> str:
    """`` (given: VALUE)`` for a bad option value, from the command line: click's
    message names the option but not always what was typed ("Input should be a
    valid integer" for ``--steps 1.5``)."""
    opts = getattr(getattr(e, "param", None), "opts", None) or []
    for i, arg in enumerate(argv):
        for opt in opts:
            if arg == opt and i + 1 < len(argv):
                value = argv[i + 1]
            elif opt.startswith("--") and arg.startswith(opt + "="):
                value = arg[len(opt) + 1 :]
            else:
                continue
            return "" if repr(value) in e.format_message() else f" (given: {value!r})"
    return ""
