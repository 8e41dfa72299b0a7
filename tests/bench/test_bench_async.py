"""bench_async's arithmetic: the gain difference, the staleness histogram, the wall ratio."""

from __future__ import annotations

import pytest

from bench.bench_async import summary


def _run(gain: float, wall: float, rows: list[dict]) -> dict:
    return {"gain": gain, "final": 0.0, "wall": wall, "rows": rows}


def test_the_summary_compares_each_variant_to_the_baseline():
    row = {
        "staleness": 1,
        "generator_busy": 0.5,
        "learner_busy": 1.0,
        "weight_push_seconds": 0.2,
        "weight_push_bytes": 10,
        "dropped_samples": 0,
    }
    first = {**row, "staleness": 0}
    results = {
        "sync": [_run(0.2, 100, [{}]), _run(0.4, 100, [{}])],
        "split1": [_run(0.25, 150, [first, row]), _run(0.25, 50, [first, row])],
    }
    s = summary(results)
    assert s["sync"]["mean_gain"] == pytest.approx(0.3)
    assert s["split1"]["diff_from_sync"] == pytest.approx(-0.05)
    assert s["split1"]["staleness"] == {0: 2, 1: 2}
    assert s["split1"]["wall_ratio_to_sync"] == pytest.approx(1.0)
    assert s["split1"]["push_seconds_median"] == pytest.approx(0.2)
