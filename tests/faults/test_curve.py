"""``rlctl status RUN`` on a finished tiny run draws its learning curve, in a pipe as
plain text; ``--plot`` writes it as a PNG, and a bad ``--plot`` path is one line."""

from __future__ import annotations

import json

import pytest

from tests.faults.conftest import one_error


def test_status_draws_the_curve_in_a_pipe(cli, store):
    r = cli("status", "ok", "--runs-dir", str(store), env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    chart = lines[lines.index("  learning curve, steps 1-2") :]
    assert all(len(x) <= 80 for x in chart), chart
    assert "\x1b" not in r.stdout  # no colour codes outside a terminal
    # trained on digit_count only: that reward under the total, no accuracy, no loss
    for label in ("reward", "digit_count", "entropy"):  # reward names whole (#45)
        assert any(x.split()[:1] == [label] and "last" in x for x in chart), (label, chart)
    assert not any(x.split()[:1] in (["accuracy"], ["loss"]) for x in chart), chart
    held = next(x for x in chart if x.strip().startswith("held-out"))
    assert "baseline" in held and "final" in held


def test_json_has_the_series(cli, store):
    r = cli("status", "ok", "--runs-dir", str(store), "-o", "json")
    curve = json.loads(r.stdout)["curve"]
    assert curve["step"] == [1, 2] and len(curve["reward_mean"]) == 2
    assert [e["which"] for e in curve["eval"]] == ["baseline", "final"]


def test_plot_writes_a_png(cli, store, tmp_path):
    out = tmp_path / "curve.png"
    r = cli("status", "ok", "--runs-dir", str(store), "--plot", str(out), "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["name"] == "ok"  # stdout stays one JSON document
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and out.stat().st_size > 10_000
    assert str(out) in r.stderr


def test_plot_in_a_missing_folder_is_one_line(cli, store, tmp_path):
    r = cli("status", "ok", "--runs-dir", str(store), "--plot", str(tmp_path / "no" / "c.png"))
    one_error(r, 2, "does not exist")
    assert not (tmp_path / "no").exists()


def test_plot_without_a_run_is_one_line(cli, store):
    one_error(cli("status", "--runs-dir", str(store), "--plot", "c.png"), 2, "name the run")


def test_tensorboard_reads_the_runs_events(store):
    """What `tensorboard --logdir runs` shows (docs/local-runs.md): per-step and eval scalars."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(store / "ok" / "tensorboard"))
    events.Reload()
    assert {
        "train/reward_mean",
        "train/loss",
        "eval_baseline/accuracy",
        "eval_final/accuracy",
    } <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("train/reward_mean")] == [1, 2]
