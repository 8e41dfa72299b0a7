"""Hop 1: the root command, the registry of command groups, and the error map.

Every command module is imported here, but none of them imports jax, tunix,
google-cloud or kubernetes at module level, so ``rlctl --help`` stays instant.
"""

from __future__ import annotations

from typing import Annotated

import typer

from rlctl import __version__
from rlctl.cli import checkpoint, cluster, image, network, runs, train
from rlctl.cli._logging import configure_library_logging
from rlctl.cli._options import AppState

app = typer.Typer(
    name="rlctl",
    help="RL post-training of LLMs (GRPO, GSPO): on this machine, or on GKE with TPUs/GPUs.\n\n"
    "Example: rlctl train grpo --steps 20",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, pwsh)
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,  # never print credentials held in locals
    # plain help: rich help shows every flag as "--dry-run <bool>", as if it took a value
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail.")] = 0,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks for errors.", envvar="RLCTL_DEBUG")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print version.")
    ] = False,
) -> None:
    """RL post-training of LLMs, from a laptop to GKE."""
    if ctx.obj is None:
        ctx.obj = AppState(verbose=verbose, debug=debug)
    else:
        ctx.obj.verbose = max(ctx.obj.verbose, verbose)
        ctx.obj.debug = ctx.obj.debug or debug
    configure_library_logging(ctx.obj.verbose)


app.add_typer(train.app, name="train")
app.add_typer(network.app, name="network")
app.add_typer(cluster.app, name="cluster")
app.add_typer(image.app, name="image")
app.command("status")(runs.status)
app.command("logs")(runs.logs)
app.command("resume")(runs.resume)
app.command("checkpoint-convert")(checkpoint.checkpoint_convert)

# `rlctl delete run|cluster|network`: the same functions as `cluster delete` and
# `network delete`, registered a second time under the verb-first spelling.
delete_app = typer.Typer(
    help="Delete a run's objects, or a cluster or network rlctl made."
    "\n\nExample: rlctl delete run my-first-run --yes",
    no_args_is_help=True,
)
delete_app.command("run")(runs.delete_run)
delete_app.command("cluster")(cluster.delete)
delete_app.command("network")(network.delete)
app.add_typer(delete_app, name="delete")


def main() -> None:
    """Console entry point (``rlctl``).

    Click's usage errors (an unknown flag, ``--dry-run true``, a missing argument)
    come back here instead of being drawn as a box by typer, so they read like every
    other error: one ``error:`` line, a ``hint:``, exit 2 (``_errors.usage_error``).

    An interrupted run (Ctrl-C, SIGTERM) has recorded its state and said so by the
    time it gets here; it then leaves with ``os._exit``, because the interpreter's
    teardown can crash (SIGSEGV) while XLA's threads are mid-compile, which would turn
    the documented exit 130 into -11."""
    import os
    import sys

    from rlctl.cli._errors import usage_error

    try:
        # not standalone: typer returns the exit code and raises click's errors to us
        code = app(standalone_mode=False)
    except typer.Abort:  # a confirmation prompt answered with Ctrl-C or end of input
        code = usage_error(None, sys.argv[1:])
    except typer.TyperException as e:
        code = usage_error(e, sys.argv[1:])
    except SystemExit as e:
        code = e.code
    except OSError as e:  # outside every command: typer's --install-completion writing
        code = _outside_a_command(e, sys.argv[1:])  # a read-only or full home
    code = code if isinstance(code, int) else 0
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)


def _outside_a_command(e: OSError, argv: list[str]) -> int:
    """An OSError raised before any command ran (no ``@guarded`` around it): typer's
    ``--install-completion`` cannot write the shell's startup file (a read-only or
    full home; #47: a 53-line traceback). One line and a hint that works without
    writing there; exit 1."""
    from rlctl.cli._errors import unexpected_message
    from rlctl.cli._output import Output

    where = f"{e.filename}: " if e.filename else ""
    why = e.strerror or unexpected_message(e)
    out = Output("table")
    if "--install-completion" in argv:
        out.failure(
            f"cannot install shell completion: {where}{why}",
            "print the script with 'rlctl --show-completion' and add it to your "
            "shell's startup file yourself",
            1,
        )
    else:
        out.failure(
            f"unexpected error: {where}{why}",
            "run again with --debug for the traceback, and report it",
            1,
        )
    return 1
