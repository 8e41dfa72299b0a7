"""Turn every exception that reaches a command into one line on stderr plus the
documented exit code (README "Exit codes").

Applied to every command (``@guarded``), so the behaviour is the same under the
console script and under ``typer.testing.CliRunner``. rlctl's own errors carry
their message, hint and code; anything else is a bug or an environment problem
we did not foresee: exit 1 with its first line and "run again with --debug",
never a traceback. ``--debug`` adds the traceback (and keeps the exit code), so it
is one flag away.
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
        "click", "typer")


def guarded(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from rlctl.cli._options import state
        from rlctl.cli._output import Output
        from rlctl.core.errors import RlctlError

        # Every command takes ``ctx: typer.Context``; typer passes parameters by name.
        ctx = kwargs.get("ctx")
        debug = bool(hasattr(ctx, "find_root") and state(ctx).debug)
        try:
            return fn(*args, **kwargs)
        except RlctlError as e:
            if debug:  # the traceback too, but the same exit code: scripts rely on it
                traceback.print_exc()
            Output().error(e.message, e.hint)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            if debug:
                traceback.print_exc()
            Output().error("interrupted")
            raise typer.Exit(130) from None
        except Exception as e:
            if debug or _is_cli_flow(e):
                raise
            Output().error(f"unexpected error: {unexpected_message(e)}",
                           "run again with --debug for the traceback, and report it")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]
