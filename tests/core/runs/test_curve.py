"""A run's learning curve: built from metrics.jsonl and eval/, in ``status RUN -o json``
only, and drawn as a PNG by ``--plot``."""

from __future__ import annotations

import json
import math
import os

import pytest

from rlctl.core.errors import ConfigError
from rlctl.core.runs.curve import build_curve
from rlctl.core.runs.plot import check_plot_path, render_png, write_plot
from rlctl.core.runs.status import describe_run, list_runs
from rlctl.core.store.base import METRICS, SPEC, STATUS
from rlctl.core.store.local import LocalRunStore

PNG = b"\x89PNG\r\n\x1a\n"


def make_run(tmp_path):
    run = LocalRunStore(tmp_path).run("r1")
    run.write_text(SPEC, "name: r1\n")
    run.write_json(STATUS, {"phase": "completed", "step": 3, "total_steps": 3})
    run.write_text(
        METRICS,
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"step": 1, "reward_mean": 0.1, "accuracy": 0.0, "loss": 0.5},
                {"step": 2, "reward_mean": 0.2, "accuracy": 0.5, "loss": 0.4},
                {
                    "step": 2,
                    "reward_mean": 0.25,
                    "accuracy": 0.5,
                    "loss": 0.4,
                },  # re-written: last wins
                {"step": 3, "reward_mean": 0.3, "accuracy": 1.0, "loss": 0.3},
            ]
        ),
    )
    run.write_json("eval/final.json", {"which": "final", "step": 3, "n": 2, "accuracy": 1.0})
    run.write_json("eval/baseline.json", {"which": "baseline", "step": 0, "n": 2, "accuracy": 0.0})
    run.write_json("eval/step-2.json", {"which": "step-2", "step": 2, "n": 2, "accuracy": 0.5})
    run.write_text("eval/step-9.json", '{"which": "step-9", "acc')  # cut: left out
    return run


class TestBuildCurve:
    def test_from_the_store(self, tmp_path):
        curve = describe_run(make_run(tmp_path), curve=True).curve
        assert curve.step == [1, 2, 3]
        assert curve.reward_mean == [0.1, 0.25, 0.3]
        assert [(e.which, e.step, e.accuracy) for e in curve.eval] == [
            ("baseline", 0, 0.0),
            ("step-2", 2, 0.5),
            ("final", 3, 1.0),
        ]

    def test_eval_steps_from_their_names_when_the_record_has_none(self):
        curve = build_curve(
            [],
            {
                "final": {"accuracy": 1},
                "step-4": {"accuracy": 0.5},
                "baseline": {"accuracy": 0.1},
                "other": {"accuracy": 1},
            },
        )
        assert [(e.which, e.step) for e in curve.eval] == [("baseline", 0), ("step-4", 4)]

    def test_non_finite_values_are_none_and_the_json_is_strict(self):
        curve = build_curve([{"step": 1, "loss": math.inf, "reward_mean": True}], {})
        assert curve.loss == [None] and curve.reward_mean == [None]
        json.loads(curve.model_dump_json(), parse_constant=pytest.fail)

    def test_rows_without_a_step_are_skipped(self):
        assert build_curve([{"loss": 1}, {"step": "2"}, {"step": 0}], {}).step == []


class TestJson:
    def test_one_run_carries_its_curve_and_a_listing_does_not(self, tmp_path):
        run = make_run(tmp_path)
        one = describe_run(run, curve=True).model_dump(mode="json")
        assert list(one)[-1] == "curve"
        assert one["curve"]["step"] == [1, 2, 3]
        assert one["curve"]["eval"][0] == {
            "which": "baseline",
            "step": 0,
            "accuracy": 0.0,
            "reward": None,
            "rewards": {},
        }
        assert "curve" not in describe_run(run).model_dump(mode="json")
        assert all(
            "curve" not in r.model_dump(mode="json") for r in list_runs(LocalRunStore(tmp_path))
        )


class TestPlotPath:
    @pytest.mark.parametrize(
        "name,words",
        [
            ("missing/curve.png", "does not exist"),
            (".", "is a folder"),
            ("curve.pdf", "name the file *.png"),
            ("/proc/curve.png", "kernel file system"),
            (" ", "empty"),
        ],
    )
    def test_refused_before_anything_is_read(self, tmp_path, monkeypatch, name, words):
        monkeypatch.chdir(tmp_path)
        with pytest.raises(ConfigError, match=words.replace("*", r"\*")):
            check_plot_path(name)
        assert not (tmp_path / "missing").exists()

    def test_a_folder_under_a_file(self, tmp_path):
        (tmp_path / "f").write_text("x")
        with pytest.raises(ConfigError, match="is not a folder"):
            check_plot_path(str(tmp_path / "f" / "c.png"))

    def test_an_unwritable_folder(self, tmp_path, monkeypatch):
        # chmod does not stop root (CI): the access check itself says no
        monkeypatch.setattr(os, "access", lambda path, mode: False)
        with pytest.raises(ConfigError, match="not writable"):
            check_plot_path(str(tmp_path / "c.png"))

    def test_a_good_path(self, tmp_path):
        assert check_plot_path(str(tmp_path / "c.PNG")) == tmp_path / "c.PNG"


class TestPng:
    def test_three_panels_written_whole(self, tmp_path):
        pytest.importorskip("matplotlib")
        curve = describe_run(make_run(tmp_path), curve=True).curve
        out = tmp_path / "c.png"
        write_plot(out, curve, "r1")
        data = out.read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".c.png")] == []

    def test_one_step_and_no_values(self):
        pytest.importorskip("matplotlib")
        assert render_png(build_curve([{"step": 1}], {}), "r").startswith(PNG)
        assert render_png(build_curve([], {}), "r").startswith(PNG)

    def test_without_matplotlib_exit_8_and_the_extra(self, monkeypatch):
        import importlib.util

        from rlctl.core.errors import MissingDependencyError

        real = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: None if name == "matplotlib" else real(name, *a),
        )
        with pytest.raises(MissingDependencyError) as e:
            render_png(build_curve([], {}), "r")
        from rlctl.core.install import extra_install_command

        # the hint fits how rlctl was installed (tests/core/test_install.py)
        hint = extra_install_command("plot", constrained=True)
        assert e.value.exit_code == 8 and e.value.hint == hint
        assert "[plot]" in e.value.hint
