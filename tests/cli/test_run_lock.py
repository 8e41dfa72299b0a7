"""One writer per run: while a process trains a run, a second ``resume`` of it stops
at once with exit 4 and one line naming the holder, and writes nothing."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from rlctl.cli.app import app
from rlctl.core.store.base import SPEC, STATUS
from rlctl.core.store.local import LocalRunStore


@pytest.mark.slow
def test_a_second_resume_of_a_held_run_is_refused_and_writes_nothing(tmp_path):
    run = LocalRunStore(tmp_path).run("r1")
    run.write_text(SPEC, "name: r1\nalgorithm: grpo\n")
    # the state a first resume sees during model load: not yet 'running'
    run.write_json(STATUS, {"phase": "starting", "step": 0, "backend": "local"})
    before = (run.path / STATUS).read_bytes()
    with run.lock():
        r = CliRunner().invoke(app, ["resume", "r1", "--runs-dir", str(tmp_path)])
    assert r.exit_code == 4, r.output
    assert f"in use by pid {os.getpid()}" in r.stderr and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) <= 2  # the error and its hint
    assert (run.path / STATUS).read_bytes() == before


@pytest.mark.slow
def test_a_name_taken_while_starting_is_refused_before_any_write(tmp_path):
    run = LocalRunStore(tmp_path).run("dup")
    run.write_text(SPEC, "name: dup\n")
    r = CliRunner().invoke(
        app, ["train", "grpo", "--name", "dup", "--runs-dir", str(tmp_path), "-o", "json"]
    )
    assert r.exit_code == 4 and "already exists" in r.stderr, r.output
    assert sorted(os.listdir(run.path)) == [SPEC] and json.loads(r.stdout)["exit_code"] == 4
    json.dumps(r.stderr)  # plain text
