"""Shell completion through typer's protocol, as the installed shell script drives it:
``_RLCTL_COMPLETE=complete_bash COMP_WORDS=... COMP_CWORD=...`` in a fresh process,
offline, without importing the heavy libraries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = (
    "jax",
    "tunix",
    "flax",
    "orbax",
    "google.cloud",
    "google.auth",
    "kubernetes",
    "matplotlib",
    "tensorboardX",
)
# what the `rlctl` console script does, with sys.argv[0] = "rlctl": typer names the
# completion variable after the program (_RLCTL_COMPLETE)
SCRIPT = (
    "import atexit, sys\n"
    f"HEAVY = {HEAVY!r}\n"
    "atexit.register(lambda: sys.stderr.write('heavy: %s\\n' % sorted("
    "m for m in sys.modules if m.split('.')[0] in HEAVY or m.startswith(HEAVY))))\n"
    "sys.argv[0] = 'rlctl'\n"
    "from rlctl.cli.app import main\n"
    "main()\n"
)


def complete(line: str, cwd: Path, **env: str) -> list[str]:
    """The suggestions for the last word of ``line`` (an empty one after a space)."""
    words = line.split(" ")
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "_RLCTL_COMPLETE": "complete_bash",
            "COMP_WORDS": line,
            "COMP_CWORD": str(len(words) - 1),
            **env,
        },
    )
    assert r.returncode == 0, r.stderr
    assert "heavy: []" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r.stdout.split()


@pytest.fixture
def runs(tmp_path) -> Path:
    for name in ("first-run", "second-run"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "spec.yaml").write_text(f"name: {name}\n")
    (tmp_path / "runs" / "not-a-run").mkdir()  # no spec.yaml
    return tmp_path / "runs"


class TestRunNames:
    def test_from_the_local_store(self, runs):
        assert complete("rlctl status ", runs.parent) == ["first-run", "second-run"]
        assert complete("rlctl resume fi", runs.parent) == ["first-run"]

    def test_from_runs_dir_given_before(self, runs, tmp_path):
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        assert complete(f"rlctl delete run --runs-dir {runs} s", elsewhere) == ["second-run"]

    def test_no_store_or_a_gs_store_is_no_suggestion_and_no_error(self, tmp_path):
        assert complete("rlctl status ", tmp_path) == []
        assert complete("rlctl logs --runs-dir gs://b/runs ", tmp_path) == []


class TestValues:
    def test_accelerators_from_the_catalog(self, tmp_path):
        got = complete("rlctl cluster create rl -a v6e-1", tmp_path)
        assert got and all(n.startswith("v6e-1") for n in got) and "v6e-16" in got

    def test_backends(self, tmp_path):
        assert complete("rlctl train grpo --backend ", tmp_path) == [
            "jobset",
            "lws",
            "pathways",
            "ray",
        ]
        assert complete("rlctl train grpo --backend pa", tmp_path) == ["pathways"]

    def test_set_keys_from_the_run_specs_schema(self, tmp_path):
        assert complete("rlctl train grpo --set mo", tmp_path) == [
            "model.source=",
            "model.dtype=",
            "model.compute_dtype=",
        ]
        got = complete("rlctl train gspo --set training.lo", tmp_path)
        assert got == [
            "training.loss_aggregation=",
            "training.lora_rank=",
            "training.lora_alpha=",
            "training.lora_target_modules=",
        ]
        assert "rewards=" in complete("rlctl train grpo --set re", tmp_path)

    def test_clusters_rlctl_remembered(self, tmp_path):
        from rlctl.core.gcp import known

        known.remember("p", ["rl-v6e", "rl-gpu"])
        known.remember("q", ["other"])
        known.forget("p", "rl-gpu")
        assert complete("rlctl status --cluster ", tmp_path) == ["other", "rl-v6e"]
        assert complete("rlctl cluster describe rl", tmp_path) == ["rl-v6e"]

    def test_a_damaged_cluster_file_is_no_suggestion(self, tmp_path):
        from rlctl.core.gcp import known
        from rlctl.core.paths import config_dir

        config_dir().mkdir(parents=True, exist_ok=True)
        (config_dir() / known.FILE).write_text("{not json")
        assert complete("rlctl status --cluster ", tmp_path) == []
        known.remember("p", ["rl"])  # and it is rewritten whole
        assert known.known_clusters() == ["rl"]


def test_cluster_commands_remember_and_forget_names(cli):
    """create and list remember a cluster's name, delete forgets it (the GCP fake)."""
    from rlctl.core.gcp import known
    from tests.cli.test_cluster import BASE, CREATE

    assert cli(*CREATE, "--yes").exit_code == 0
    assert known.known_clusters() == ["rl"]
    known.forget("p", "rl")
    assert cli("cluster", "list", "--project", "p").exit_code == 0
    assert known.known_clusters() == ["rl"]
    assert cli("cluster", "delete", "rl", *BASE[:4], "--yes").exit_code == 0
    assert known.known_clusters() == []


def test_show_completion_prints_the_script_for_rlctl(monkeypatch):
    """With the shell named: typer's own test switch makes ``--show-completion`` take it
    (as typer's tests do). Without it the option is a flag and typer asks shellingham for
    the calling shell, which a test process started without one (nohup, a loaded
    machine's ``ps``) does not always find: "Shell  not supported" (seen twice)."""
    from typer.testing import CliRunner

    from rlctl.cli.app import app

    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    r = CliRunner().invoke(app, ["--show-completion", "bash"], prog_name="rlctl")
    assert r.exit_code == 0 and "_RLCTL_COMPLETE=complete_bash" in r.output, (
        r.output,
        r.exception,
    )
