"""The one output sink: JSON (or tables) on stdout, everything human on stderr.

With ``-o json`` stdout carries exactly one JSON document, so scripts can pipe
it; progress, warnings and errors always go to stderr. This is the only module
in rlctl that imports rich.

Text is never read as rich markup: messages, hints, paths and table cells are
user or API data, and a ``[gcp]`` in a hint or a ``[/x]`` in a path must print as
written (markup would eat the first and raise on the second). Styling is applied
to our own words only, through ``styled``.

Outside a terminal (CI, ``nohup``, a log file) a live progress bar would print
one truncated line at the very end, so ``progress()`` then prints plain lines. A
table printed into a pipe gets its natural width: rich's 80 columns there would cut
run names to ``grpo-202…``, and ``grep`` must find the whole row.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import typer
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

OutputFormat = Literal["table", "json"]


def styled(text: str, style: str) -> Text:
    """Our own words in a style (never parsed as markup)."""
    return Text(str(text), style=style)


def _text(value: Any) -> Any:
    """A str as literal text; rich renderables (tables, styled Text) as they are."""
    return Text(value) if isinstance(value, str) else value


class Output:
    def __init__(self, fmt: OutputFormat = "table", verbose: int = 0, yes: bool = False) -> None:
        self.fmt = fmt
        self.verbose = verbose
        self.yes = yes
        self.out = Console(soft_wrap=True, markup=False, highlight=False)
        self.err = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)

    @property
    def json(self) -> bool:
        return self.fmt == "json"

    @property
    def interactive(self) -> bool:
        """Whether stderr is a terminal (live progress) or a pipe/file (plain lines)."""
        return self.err.is_terminal

    @property
    def watching_person(self) -> bool:
        """Whether both streams are terminals: a live display (``status --watch``) is
        for a person; into a pipe or a log it would show nothing until the end."""
        return self.out.is_terminal and self.err.is_terminal

    @property
    def width(self) -> int:
        """Columns of stdout: the terminal's, else $COLUMNS, else 80."""
        return self.out.width

    def fits(self, renderable: RenderableType) -> bool:
        """Whether ``renderable`` shows whole on a terminal's stdout (False in a pipe,
        where a wide table is one long line per row)."""
        return self.out.is_terminal and self.natural_width(renderable) <= self.width

    def natural_width(self, renderable: RenderableType) -> int:
        """Columns ``renderable`` takes when nothing has to wrap or be cut."""
        wide = self.out.options.update(max_width=100_000)
        return Measurement.get(self.out, wide, renderable).maximum

    # --- results (stdout) -------------------------------------------------
    def result(self, data: Any, human: Any = None) -> None:
        """Print the command's result: ``data`` as JSON, or ``human`` (text/Table) for people."""
        if self.json:
            sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
            sys.stdout.flush()
            return
        if human is None:
            human = json.dumps(data, indent=2, default=str)
        if isinstance(human, Table) and not self.out.is_terminal:
            # print(width=) is capped at the console's width: a console as wide as the table
            wide = Console(
                width=self.natural_width(human), soft_wrap=True, markup=False, highlight=False
            )
            wide.print(human)
            return
        self.out.print(_text(human))

    # --- chatter (stderr) -------------------------------------------------
    def info(self, msg: str) -> None:
        self.err.print(_text(msg))

    @contextlib.contextmanager
    def phases(self, first: str) -> Iterator[Callable[[str], None]]:
        """A phase of a command that takes seconds to minutes (the fit check's
        compiles): on a terminal a spinner whose text each call changes, elsewhere one
        plain line per call."""
        if not self.interactive:
            self.info(first)
            yield self.info
            return
        with self.err.status(Text(first)) as status:
            yield lambda msg: status.update(Text(msg))

    def debug(self, msg: str) -> None:
        if self.verbose:
            self.err.print(styled(msg, "dim"))

    def error(self, msg: str, hint: str | None = None) -> None:
        self.err.print(Text.assemble(styled("error:", "red"), " ", msg))
        if hint:
            self.err.print(Text.assemble(styled("hint:", "dim"), " ", hint))

    def failure(self, msg: str, hint: str | None, exit_code: int) -> None:
        """A command's error: the ``error:``/``hint:`` lines on stderr and, with
        ``-o json``, the same as one JSON object on stdout (the document a script
        parses, on failure as on success)."""
        self.error(msg, hint)
        if self.json:
            self.result({"error": msg, "hint": hint, "exit_code": exit_code})

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

    @contextlib.contextmanager
    def stdout_for_json_only(self) -> Iterator[None]:
        """With ``-o json``, whatever else writes to stdout while the block runs (a
        reward's ``print``, a library's, a child process it starts) goes to stderr,
        so stdout carries the result's one document alone; a no-op otherwise. Both
        Python's ``sys.stdout`` and file descriptor 1 are moved (a test runner's
        stdout is not descriptor 1)."""
        if not self.json:
            yield
            return
        import os

        sys.stdout.flush()
        try:
            saved = os.dup(1)
            os.dup2(2, 1)
        except OSError:  # no descriptor 1 or 2 (a daemon): Python's stream alone
            saved = None
        try:
            with contextlib.redirect_stdout(sys.stderr):
                yield
        finally:
            sys.stdout.flush()
            if saved is not None:
                os.dup2(saved, 1)
                os.close(saved)

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

    def progress(self) -> Any:
        """A progress display on stderr (a context manager with rich's Progress API):
        a live bar on a terminal, one plain line per update elsewhere."""
        if not self.interactive:
            return PlainProgress(self.err)
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        return Progress(
            TextColumn("{task.description}", markup=False, style="bold"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}", markup=False),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.err,
            transient=False,
        )

    def train_bar(self) -> Any:
        """The live display of a training run (a terminal only): a spinner, the
        phase or run, a bar, ``k/n``, metrics, elapsed, and an ETA that the caller
        computes from step times (rich's own estimate needs several updates within
        its window and shows -:--:-- for most of a run of slow steps)."""
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        class Spinner(SpinnerColumn):
            """Spins on after the last step: the final eval and save are work too."""

            def render(self, task: Any) -> Any:
                return self.spinner.render(task.get_time())

        class Elapsed(TimeElapsedColumn):
            """The run's clock, running until the display ends: rich stops a task's
            clock once its bar is full, so it froze through the final eval (#53)."""

            def render(self, task: Any) -> Any:
                from datetime import timedelta

                from rich.text import Text

                if task.elapsed is None:
                    return Text("-:--:--", style="progress.elapsed")
                return Text(str(timedelta(seconds=int(task.elapsed))), style="progress.elapsed")

        return Progress(
            Spinner(),
            TextColumn("{task.description}", markup=False, style="bold"),
            BarColumn(),
            TextColumn("{task.fields[count]}", markup=False),
            TextColumn("{task.fields[info]}", markup=False),
            Elapsed(),
            TextColumn("{task.fields[eta]}", markup=False),
            console=self.err,
            transient=False,
        )


class PlainProgress:
    """The subset of rich's ``Progress`` rlctl uses, as one line per change: what a
    log file or CI console can show (a live bar there ends as one cut line)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._tasks: dict[int, dict[str, Any]] = {}

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def add_task(
        self, description: str, total: float | None = None, completed: float = 0, **fields: Any
    ) -> int:
        task_id = len(self._tasks)
        self._tasks[task_id] = {
            "description": description,
            "total": total,
            "completed": completed,
            "info": fields.get("info", ""),
        }
        return task_id

    def update(self, task_id: int, completed: float | None = None, **fields: Any) -> None:
        t = self._tasks[task_id]
        before = (t["completed"], t["info"])
        if completed is not None:
            t["completed"] = completed
        if "info" in fields:
            t["info"] = fields["info"]
        if (t["completed"], t["info"]) == before:
            return
        total = "?" if t["total"] is None else f"{t['total']:g}"
        self.console.print(
            Text(f"{t['description']}: {t['completed']:g}/{total}  {t['info']}".rstrip())
        )


def make_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    table = Table(
        title=None if title is None else Text(title), title_justify="left", header_style="bold"
    )
    for c in columns:  # a narrow terminal wraps a long value; it never cuts it to "…"
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(
            *(Text("") if v is None else _text(v if isinstance(v, Text) else str(v)) for v in r)
        )
    return table
