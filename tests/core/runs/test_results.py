"""The typed results: one ``Phase`` with one finished and one active set, and ``-o json``
as the models' dump (the same keys and values status.json and the commands had)."""

from __future__ import annotations

import json
import os
import socket

import pytest

from rlctl.core.config.load import dump_yaml
from rlctl.core.errors import ConflictError
from rlctl.core.k8s.diagnose import Diagnosis
from rlctl.core.runs.results import ClusterRunInfo, RunInfo, SubmitResult, TrainResult
from rlctl.core.runs.spec import resolve_run_spec
from rlctl.core.runs.status import describe_run
from rlctl.core.store.base import ACTIVE, FINISHED, SPEC, STATUS, Phase
from rlctl.core.store.local import LocalRunStore


class TestPhase:
    def test_members_are_the_strings_status_json_holds(self):
        assert Phase("interrupted") is Phase.INTERRUPTED
        assert json.dumps({"phase": Phase.RUNNING}) == '{"phase": "running"}'
        assert f"{Phase.FAILED}" == str(Phase.FAILED) == "failed"
        assert Phase.parse("no-such-phase") is Phase.UNKNOWN and Phase.parse(None) is Phase.UNKNOWN

    def test_one_finished_set_and_one_active_set(self):
        assert Phase.INTERRUPTED.finished  # a local run stopped by Ctrl-C: only resume moves it
        assert {p.value for p in FINISHED} == {
            "completed",
            "failed",
            "interrupted",
            "suspended",
            "absent",
            "stale",
        }
        assert {p.value for p in ACTIVE} == {"pending", "starting", "evaluating", "running"}
        assert not FINISHED & ACTIVE and Phase.UNKNOWN not in FINISHED | ACTIVE
        assert "absent" in FINISHED  # a workload's phase string compares as it is


class TestDumps:
    def test_run_info_leaves_out_evals_not_run_yet(self, tmp_path):
        run = LocalRunStore(tmp_path).run("r1")
        run.write_text(SPEC, "name: r1\n")
        run.write_json(STATUS, {"phase": "interrupted", "step": 3, "total_steps": 5})
        run.write_text("metrics.jsonl", "".join(f'{{"step": {k}}}\n' for k in (1, 2, 3)))
        run.write_json(
            "eval/baseline.json",
            {"which": "baseline", "n": 2, "accuracy": 0.5, "format_rate": 1.0, "mean_reward": 0.25},
        )
        info = describe_run(run)
        assert info.phase is Phase.INTERRUPTED and info.finished
        doc = info.model_dump(mode="json")
        assert list(doc) == [
            "name",
            "path",
            "phase",
            "algorithm",
            "step",
            "steps_after_checkpoint",
            "total_steps",
            "latest_checkpoint",
            "checkpoint_bytes",
            "disk_bytes",
            "processes",
            "devices",
            "resizes",
            "engine",
            "precision",
            "sampling_precision",
            "rollout",
            "compiles",
            "last_save",
            "peak_device_bytes",
            "created",
            "updated",
            "damaged",
            "error",
            "latest_metrics",
            "eval",
        ]
        # no checkpoint: 0 steps done, rows 1-3 after it (#57)
        assert (doc["phase"], doc["step"], doc["steps_after_checkpoint"]) == ("interrupted", 0, 3)
        # no checkpoint yet: its size is null; the folder's is what is there
        assert doc["checkpoint_bytes"] is None and doc["disk_bytes"] > 0
        assert doc["eval"] == {
            "baseline": {
                "accuracy": 0.5,
                "format_rate": 1.0,
                "mean_reward": 0.25,
                "rewards": None,
                "n": 2,
            }
        }

    def test_compiles_and_the_device_peak_are_read_back_and_shown(self, tmp_path):
        """What the trainer records in status.json: each program's compile seconds and
        the allocator's peak; ``status`` shows both, a damaged record is left out."""
        from rlctl.cli.runs import _run_view

        run = LocalRunStore(tmp_path).run("r1")
        run.write_text(SPEC, "name: r1\n")
        run.write_json(
            STATUS,
            {
                "phase": "running",
                "step": 1,
                "compiles": {"step": 41.2, "sample_groups": 3, "x": "?"},
                "peak_device_bytes": 3 * 2**30,
            },
        )
        info = describe_run(run)
        assert info.compiles == {"step": 41.2, "sample_groups": 3.0}
        doc = info.model_dump(mode="json")
        assert doc["peak_device_bytes"] == 3 * 2**30
        view = _run_view(info)
        assert "  compiled    update 41.2 s, sampler 3.0 s" in view, view
        assert "  device mem  3.00 GiB at its peak" in view, view
        run.write_json(STATUS, {"phase": "running", "compiles": [1, 2]})
        assert describe_run(run).compiles is None

    def test_a_missing_status_is_unknown(self, tmp_path):
        run = LocalRunStore(tmp_path).run("r1")
        run.write_text(SPEC, "name: r1\n")
        info = describe_run(run)
        assert (info.phase, info.step, info.eval.model_dump()) == (Phase.UNKNOWN, 0, {})
        assert not info.finished

    def test_a_cluster_run_is_finished_when_its_workload_is(self):
        base = RunInfo(name="r", path="gs://b/runs/r", phase=Phase.RUNNING)
        info = ClusterRunInfo(**dict(base), workload=Diagnosis(phase="absent"))
        assert info.finished
        assert not info.model_copy(update={"workload": Diagnosis(phase="running")}).finished
        assert info.model_dump(mode="json")["workload"] == {
            "phase": "absent",
            "reason": None,
            "pods": {},
        }

    def test_train_result_keeps_the_trainers_eval_record(self):
        ev = {
            "which": "final",
            "step": 4,
            "n": 2,
            "accuracy": 0.5,
            "format_rate": 1.0,
            "mean_reward": 0.1,
            "greedy": True,
            "seconds": 1.5,
            "samples": [{"question": "q", "gold": 1, "completion": "1", "correct": True}],
            "added_later": 7,
        }
        r = TrainResult(
            name="r",
            path="/runs/r",
            phase=Phase.COMPLETED,
            step=4,
            latest_checkpoint=4,
            baseline=None,
            final=ev,
        )
        assert r.model_dump(mode="json") == {
            "name": "r",
            "path": "/runs/r",
            "phase": "completed",
            "step": 4,
            "latest_checkpoint": 4,
            "baseline": None,
            "final": ev,
        }

    def test_submit_result_names_its_run_store(self):
        r = SubmitResult(name="r1", path="gs://b/runs/r1", backend="jobset", applied=[])
        assert r.runs_dir == "gs://b/runs"
        assert "runs_dir" not in r.model_dump()


@pytest.mark.slow
def test_resume_refuses_a_live_run_in_any_active_phase(tmp_path):
    """A run evaluating its baseline is as alive as a running one: a second process
    must not train it at the same time (resume used to check only 'running'). What
    decides is the run's lock, held by its trainer in every phase, not the recorded
    pid (tests/faults/test_damaged_runs.py: a reused pid holds nothing)."""
    pytest.importorskip("tunix")
    from rlctl.core.runs.local import resume_local

    spec = resolve_run_spec("grpo", overrides=[f"output.root={tmp_path}", "name=r1"])
    run = LocalRunStore(tmp_path).run("r1")
    run.write_text(SPEC, dump_yaml(spec))
    with run.lock():  # the live trainer: this process, another descriptor
        for phase in ("starting", "evaluating", "running"):
            run.write_json(
                STATUS, {"phase": phase, "pid": os.getppid(), "host": socket.gethostname()}
            )
            with pytest.raises(ConflictError, match="is in use by pid"):
                resume_local(str(tmp_path), "r1")
