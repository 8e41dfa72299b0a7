"""The one output sink: JSON (or tables) on stdout, everything human on stderr.

With ``-o json`` stdout carries exactly one JSON document, so scripts can pipe
it; progress, warnings and errors always go to stderr. This is the only module
in rlctl that imports rich.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import typer
from rich.console import Console
from rich.table import Table

OutputFormat = Literal["table", "json"]


class Output:
    def __init__(self, fmt: OutputFormat = "table", verbose: int = 0, yes: bool = False) -> None:
        self.fmt = fmt
        self.verbose = verbose
        self.yes = yes
        self.out = Console(soft_wrap=True)
        self.err = Console(stderr=True, soft_wrap=True)

    @property
    def json(self) -> bool:
        return self.fmt == "json"

    # --- results (stdout) -------------------------------------------------
    def result(self, data: Any, human: Any = None) -> None:
        """Print the command's result: ``data`` as JSON, or ``human`` (text/Table) for people."""
        if self.json:
            sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
            sys.stdout.flush()
            return
        if human is None:
            human = json.dumps(data, indent=2, default=str)
        self.out.print(human)

    # --- chatter (stderr) -------------------------------------------------
    def info(self, msg: str) -> None:
        self.err.print(msg, highlight=False)

    def debug(self, msg: str) -> None:
        if self.verbose:
            self.err.print(f"[dim]{msg}[/dim]", highlight=False)

    def warn(self, msg: str) -> None:
        self.err.print(f"[yellow]warning:[/yellow] {msg}", highlight=False)

    def error(self, msg: str, hint: str | None = None) -> None:
        self.err.print(f"[red]error:[/red] {msg}", highlight=False, markup=True)
        if hint:
            self.err.print(f"[dim]hint:[/dim] {hint}", highlight=False)

    def confirm(self, question: str) -> None:
        """Ask before a change; outside a terminal, require --yes instead of hanging."""
        if self.yes:
            return
        if not sys.stdin.isatty():
            from rlctl.core.errors import ConfigError

            raise ConfigError(
                f"{question} needs confirmation and stdin is not a terminal",
                hint="pass --yes to proceed, or --dry-run to only show the plan",
            )
        if not typer.confirm(question, default=False, err=True):
            raise typer.Exit(1)

    def live(self):
        """A rich Live display on stderr (``status --watch``); stdout stays clean."""
        from rich.live import Live

        return Live(console=self.err, auto_refresh=False, transient=False)

    def yaml_documents(self, docs: list[Any]) -> str:
        """Kubernetes manifests as one multi-document YAML text (for humans)."""
        import yaml

        return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)

    def line(self, text: str) -> None:
        """One raw line on stdout, unstyled (log lines)."""
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def progress(self):
        """A rich Progress on stderr (a context manager)."""
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        return Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.err,
            transient=False,
        )


def make_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*("" if v is None else str(v) for v in r))
    return table
