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

        # Every command takes ``ctx: typer.Context``; typer passes parameters by name.
        ctx = kwargs.get("ctx")
        debug = bool(hasattr(ctx, "find_root") and state(ctx).debug)
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
