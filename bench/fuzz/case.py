"""A case as the runner takes it (what bench/fuzz/loader.py builds from a data file's
entry, its hooks resolved to functions) and the outcome of running it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.fuzz.fixtures import Ctx
from bench.fuzz.proc import CMD_TIMEOUT, Run


@dataclass
class Outcome:
    cid: str
    family: str
    cmd: str = ""
    rc: Any = None
    expected: str = ""
    secs: float = 0.0
    traceback: bool = False
    unclear: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    skipped: str | None = None
    note: str = ""
    err_first: str = ""
    err_last: str = ""
    err_error: str = ""  # the first 'error:' line, when it is neither the first nor last

    def take(self, run: Run) -> None:
        """Show this run as the case's command (the last one taken wins)."""
        lines = [x.strip() for x in run.err.splitlines() if x.strip()]
        self.cmd, self.rc = run.cmd(), run.rc
        self.err_first = lines[0][:240] if lines else ""
        self.err_last = lines[-1][:240] if lines else ""
        self.err_error = next((x[:300] for x in lines if x.startswith("error:")), "")

    @property
    def bad(self) -> bool:
        return self.traceback or bool(self.unclear) or bool(self.lost)


Setup = Callable[[Ctx], object]  # what it returns is ignored
Judge = Callable[[Ctx, Run], list[str]]  # a check's or a post's problems
Runner = Callable[[Ctx, Outcome], None]
Skip = Callable[[Ctx], "str | None"]


@dataclass
class Case:
    cid: str
    argv: Callable[[Ctx], list[str]] | None = None
    expect: tuple[int | None, ...] = (2,)
    keywords: tuple = ()  # when it fails: each (or one of a tuple) must be on stderr
    ok_keywords: tuple = ()  # when it succeeds: on stdout or stderr
    forbid: tuple[str, ...] = ()  # regexes that must not match stdout + stderr
    env: dict[str, str | None] | Callable[[Ctx], dict[str, str | None]] | None = None
    setup: Setup | None = None
    post: Judge | None = None  # lost/wrong problems
    check: Judge | None = None  # extra unclear problems
    runner: Runner | None = None  # a custom case
    timeout: float = CMD_TIMEOUT
    needs: tuple[str, ...] = ()
    skip: Skip | None = None
    allow_traceback: bool = False
    one_line: bool = True
    train: bool = False  # exit 2 must leave no run folder in c.runs
    desc: str = ""
    runner_name: str = ""  # the custom runner's hook name, for --list

    @property
    def family(self) -> str:
        return self.cid.split("/", 1)[0]
