"""Turn rlctl errors into one line on stderr plus the documented exit code.

Applied to every command (``@guarded``), so the behaviour is the same under the
console script and under ``typer.testing.CliRunner``. ``--debug`` re-raises.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])


def guarded(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from rlctl.cli._options import state
        from rlctl.cli._output import Output
        from rlctl.core.errors import RlctlError

        # typer 0.29.2 has no get_current_context: every command takes ctx as a parameter
        ctx = next((a for a in (*args, *kwargs.values()) if isinstance(a, typer.Context)), None)
        debug = bool(ctx and state(ctx).debug)
        try:
            return fn(*args, **kwargs)
        except RlctlError as e:
            if debug:
                raise
            Output().error(e.message, e.hint)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            if debug:
                raise
            Output().error("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]
