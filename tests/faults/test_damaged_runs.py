"""A damaged run is named, never resumed silently, and can be deleted; the other runs
of the store stay readable."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from rlctl.core.store.local import LocalRunStore
from tests.faults.conftest import metrics, one_error

pytestmark = pytest.mark.trainer


def test_a_run_folder_without_its_spec(cli, tiny_args, store):
    shutil.copytree(store / "ok", store / "nospec")
    (store / "nospec" / "spec.yaml").unlink()
    before = sorted(os.listdir(store / "nospec" / "checkpoints"))

    one_error(cli("resume", "nospec", "--runs-dir", str(store)), 2, "damaged", "spec.yaml")
    # a new spec must not adopt the old checkpoints (it would resume them silently)
    one_error(cli(*tiny_args(store, "nospec")), 4, "without its spec.yaml")
    assert sorted(os.listdir(store / "nospec" / "checkpoints")) == before

    r = cli("delete", "run", "nospec", "--runs-dir", str(store), "--yes")
    assert r.returncode == 0, r.stderr
    assert "checkpoints" in r.stdout and not (store / "nospec").exists()
    assert (store / "ok" / "spec.yaml").is_file()


def test_a_phase_that_is_no_phase_is_shown_as_damaged(cli, store):
    shutil.copytree(store / "ok", store / "odd")
    (store / "odd" / "status.json").write_text('{"phase": 42}')
    r = cli("status", "--runs-dir", str(store), "-o", "json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["odd"]["error"] == (
        "damaged: status.json: phase 42 is not a phase; continue with 'rlctl resume odd'"
    )
    assert rows["ok"]["phase"] == "completed" and rows["ok"]["error"] is None


class TestDeleteLocalRun:
    def test_dry_run_lists_what_goes_and_changes_nothing(self, cli, store):
        r = cli("delete", "run", "ok", "--runs-dir", str(store), "--dry-run", "-o", "json")
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        names = {c["name"]: c for c in plan["changes"]}
        assert names["checkpoints"]["fields"]["steps"] == [1, 2]
        assert {"spec.yaml", "status.json", "metrics.jsonl", "ok"} <= set(names)
        assert (store / "ok" / "spec.yaml").is_file()

    def test_without_yes_and_no_terminal_nothing_is_deleted(self, cli, store):
        r = cli("delete", "run", "ok", "--runs-dir", str(store))
        assert r.returncode != 0 and (store / "ok" / "spec.yaml").is_file()

    def test_a_run_being_trained_is_not_deleted(self, cli, store):
        with LocalRunStore(store).run("ok").lock():
            r = cli("delete", "run", "ok", "--runs-dir", str(store), "--yes")
        one_error(r, 4, "in use by pid")
        assert (store / "ok" / "spec.yaml").is_file()

    def test_the_name_is_free_afterwards(self, cli, tiny_args, store):
        r = cli("delete", "run", "ok", "--runs-dir", str(store), "--yes", "-o", "json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["result"]["applied"][-1] == "folder/ok"
        assert os.listdir(store) == []

    def test_an_unknown_run(self, cli, store):
        one_error(cli("delete", "run", "nope", "--runs-dir", str(store), "--yes"), 3, "nope")


@pytest.mark.parametrize("columns", ["40", "20"])
def test_status_on_a_narrow_terminal_folds_each_run_into_a_block(cli, store, columns):
    shutil.copytree(store / "ok", store / "second-run")
    r = cli("status", "--runs-dir", str(store), env={"COLUMNS": columns})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "ok" in lines and "second-run" in lines
    assert lines.count("  completed") == 2 and "  grpo step 2/2" in lines


@pytest.mark.parametrize(
    "damage",
    [
        ("status.json", b"\x00\xffgarbage"),
        ("status.json", b"[1, 2]"),
        ("status.json", b""),
        ("metrics.jsonl", None),
        ("eval/baseline.json", b'{"accuracy": 0.'),
    ],
)
def test_one_damaged_file_does_not_break_status_for_the_others(cli, store, damage):
    rel, content = damage
    shutil.copytree(store / "ok", store / "hurt")
    f = store / "hurt" / rel
    f.write_bytes(f.read_bytes() + b"\xff\xfe{not json\n" if content is None else content)
    r = cli("status", "--runs-dir", str(store), "-o", "json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["ok"]["phase"] == "completed" and rows["ok"]["error"] is None
    assert set(rows) == {"ok", "hurt"}
    one = cli("status", "hurt", "--runs-dir", str(store))
    assert one.returncode == 0 and "Traceback" not in one.stderr, one.stderr
    if rel == "status.json":
        assert "damaged: status.json" in one.stdout
    if rel == "metrics.jsonl":  # the bad line skipped, the good ones kept
        assert (
            json.loads(cli("status", "hurt", "--runs-dir", str(store), "-o", "json").stdout)[
                "latest_metrics"
            ]["step"]
            == 2
        )


def interrupted_after_step_1(run) -> None:
    """``run`` as a run stopped after step 1: checkpoint 1 only, phase interrupted."""
    shutil.rmtree(run / "checkpoints" / "2")
    status = json.loads((run / "status.json").read_text())
    status.update(phase="interrupted", step=1, latest_checkpoint=1)
    (run / "status.json").write_text(json.dumps(status))


class TestResumeRepairs:
    """What resume does with a damaged run it can still continue."""

    def test_an_empty_newest_checkpoint_leaves_the_older_one_alone(self, cli, store):
        run = store / "ok"
        interrupted_after_step_1(run)
        (run / "checkpoints" / "2").mkdir()  # a folder Orbax never filled
        r = cli("resume", "ok", "--runs-dir", str(store))
        assert r.returncode == 0, r.stderr
        assert "checkpoint 2 is incomplete (its folder is empty)" in r.stderr
        assert sorted(os.listdir(run / "checkpoints")) == ["1", "2", "2.damaged"]

    @pytest.mark.parametrize("order", [[1, 1, 2], [2, 1], [1, 2, 2]])
    def test_duplicated_or_reordered_metrics_come_out_one_row_per_step(self, cli, store, order):
        run = store / "ok"
        rows = {
            r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        }
        interrupted_after_step_1(run)
        (run / "metrics.jsonl").write_text("".join(json.dumps(rows[k]) + "\n" for k in order))
        r = cli("resume", "ok", "--runs-dir", str(store))
        assert r.returncode == 0, r.stderr
        assert [m["step"] for m in metrics(run)] == [1, 2]

    def test_a_cut_baseline_is_re_created(self, cli, store):
        run = store / "ok"
        before = json.loads((run / "eval" / "baseline.json").read_text())
        interrupted_after_step_1(run)
        (run / "eval" / "baseline.json").write_text('{"accuracy": 0.')
        shown = cli("status", "ok", "--runs-dir", str(store))
        assert "eval/baseline.json is unreadable" in shown.stdout
        assert cli("resume", "ok", "--runs-dir", str(store)).returncode == 0
        after = json.loads((run / "eval" / "baseline.json").read_text())
        assert after["accuracy"] == before["accuracy"] and after["n"] == before["n"]

    def test_a_live_but_unrelated_pid_does_not_hold_the_run(self, cli, store):
        """A killed run's pid, reused by another process: the run's free lock says
        it is stale, and resume continues it (before: 'running' for ever, refused)."""
        run = store / "ok"
        interrupted_after_step_1(run)
        (run / ".lock").touch()  # the trainer's lock file, left (released) by every run
        status = json.loads((run / "status.json").read_text())
        status.update(phase="running", pid=os.getppid())  # pytest's parent: alive
        (run / "status.json").write_text(json.dumps(status))
        shown = json.loads(cli("status", "ok", "--runs-dir", str(store), "-o", "json").stdout)
        assert shown["phase"] == "stale", shown
        r = cli("resume", "ok", "--runs-dir", str(store))
        assert r.returncode == 0, r.stderr
        assert [m["step"] for m in metrics(run)] == [1, 2]

    def test_a_cut_eval_file_is_shown_damaged_in_json(self, cli, store):
        (store / "ok" / "eval" / "final.json").write_text('{"accuracy": 0.')
        for args in (["status", "ok"], ["status"]):
            r = cli(*args, "--runs-dir", str(store), "-o", "json")
            shown = json.loads(r.stdout)
            row = shown if isinstance(shown, dict) else {x["name"]: x for x in shown}["ok"]
            assert "eval/final.json is unreadable" in (row["error"] or ""), row
            assert "final" not in row["eval"] or row["eval"]["final"] is None

    @pytest.mark.parametrize("content", ["", "- a list\n", "training:\n  steps: many\n"])
    def test_a_damaged_spec_is_named(self, cli, store, content):
        interrupted_after_step_1(store / "ok")
        (store / "ok" / "spec.yaml").write_text(content)
        one_error(cli("resume", "ok", "--runs-dir", str(store)), 2, "ok/spec.yaml")

    @pytest.mark.parametrize("folder", ["checkpoints", "tensorboard"])
    def test_a_file_where_the_run_keeps_a_folder(self, cli, store, folder):
        run = store / "ok"
        interrupted_after_step_1(run)
        shutil.rmtree(run / folder)
        (run / folder).write_text("x")
        one_error(cli("resume", "ok", "--runs-dir", str(store)), 2, f"ok/{folder} is a file")


class TestDamageNeverCostsData:
    """A run whose only checkpoints are damaged is never started over: resume refuses
    (every time, not only the first), metrics.jsonl keeps its rows, status.json never
    names a set-aside checkpoint, and the set-aside data can be recovered on request."""

    @staticmethod
    def only_checkpoint_1_with(run, damage: str) -> None:
        """``run`` stopped after step 1 with checkpoint 1 damaged: its manifest
        garbled (data intact), or (an older rlctl's, without a manifest) its largest
        data file, every data file or Orbax's OCDBT index cut in half."""
        interrupted_after_step_1(run)
        step = run / "checkpoints" / "1"
        if damage == "manifest":
            (step / "rlctl-manifest.json").write_bytes(b"\xff{not json")
        elif damage != "none":
            (step / "rlctl-manifest.json").unlink()
            files = sorted(p for p in step.rglob("*") if p.is_file())
            cut = (
                [step / "default" / "manifest.ocdbt"]
                if damage.endswith("index cut")
                else [p for p in files if p.parent.name == "d"]
                if damage.endswith("all cut")
                else [max(files, key=lambda p: p.stat().st_size)]
            )
            for p in cut:
                p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])

    @pytest.mark.parametrize(
        "damage",
        ["manifest", "no manifest, data cut", "no manifest, index cut", "no manifest, all cut"],
    )
    def test_resume_refuses_each_time_and_loses_nothing(self, cli, store, damage):
        run = store / "ok"
        self.only_checkpoint_1_with(run, damage)
        rows = (run / "metrics.jsonl").read_text()
        for attempt in (1, 2):
            r = cli("resume", "ok", "--runs-dir", str(store))
            one_error(r, 4, "checkpoints/1.damaged", "kept, not deleted")
            assert "hint: " in r.stderr and "--recover" in r.stderr, r.stderr
            assert "from the start" not in r.stderr and "step 1/2" not in r.stderr, r.stderr
            assert (run / "metrics.jsonl").read_text() == rows, attempt
            assert sorted(os.listdir(run / "checkpoints")) == ["1.damaged"], attempt
            status = json.loads((run / "status.json").read_text())
            assert status["latest_checkpoint"] is None, (attempt, status)
            # one line per fallback: no TensorStore or asyncio dump (index cut: 257
            # lines, all cut: 907, before they were silenced); the phase lines aside
            phases = (
                "loading libraries",
                "precision: ",
                "numerics: ",
                "compiling the update",
                "compiled ",
                "loaded ",
                "restoring checkpoint 1",
            )
            assert len([x for x in r.stderr.splitlines() if not x.startswith(phases)]) <= 6, (
                r.stderr
            )
            assert "Event loop is closed" not in r.stderr, r.stderr
        shown = json.loads(cli("status", "ok", "--runs-dir", str(store), "-o", "json").stdout)
        assert shown["latest_checkpoint"] is None
        assert "set aside: checkpoints/1.damaged" in (shown["error"] or ""), shown

    def test_a_damaged_manifest_over_intact_data_is_recovered_on_request(self, cli, store):
        run = store / "ok"
        self.only_checkpoint_1_with(run, "manifest")
        rows = (run / "metrics.jsonl").read_text().splitlines()
        assert cli("resume", "ok", "--runs-dir", str(store)).returncode == 4
        r = cli("resume", "ok", "--runs-dir", str(store), "--recover")
        assert r.returncode == 0, r.stderr
        assert "recovered checkpoint 1" in r.stderr and "resumed from checkpoint 1" in r.stderr
        assert [m["step"] for m in metrics(run)] == [1, 2]
        assert (run / "metrics.jsonl").read_text().splitlines()[0] == rows[0]
        assert sorted(os.listdir(run / "checkpoints")) == ["1", "2"]

    def test_recover_refuses_data_that_does_not_match_its_manifest(self, cli, store):
        run = store / "ok"
        self.only_checkpoint_1_with(run, "none")
        step = run / "checkpoints" / "1"
        p = max((p for p in step.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        p.write_bytes(p.read_bytes()[:100])
        rows = (run / "metrics.jsonl").read_text()
        one_error(cli("resume", "ok", "--runs-dir", str(store)), 4, "checkpoints/1.damaged")
        one_error(
            cli("resume", "ok", "--runs-dir", str(store), "--recover"), 4, "checkpoints/1.damaged"
        )
        assert (run / "metrics.jsonl").read_text() == rows
        assert sorted(os.listdir(run / "checkpoints")) == ["1.damaged"]
