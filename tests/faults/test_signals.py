"""Killed, stopped and doubled commands through the real process boundary: a dead
run never shows as running, and every resumed run ends with the metrics of a run that
was never interrupted."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.faults.conftest import metrics, one_error

pytestmark = pytest.mark.trainer
STEPS = ("--steps", "6", "--set", "checkpoint.interval=2")


def same(a: list[dict], b: list[dict]) -> bool:
    """Same steps, every value within 1e-4 relative."""
    if [r["step"] for r in a] != [r["step"] for r in b]:
        return False
    return all(
        r.keys() == s.keys()
        and all(
            r[k] == pytest.approx(s[k], rel=1e-4, abs=1e-7)
            if isinstance(r[k], float)
            else r[k] == s[k]
            for k in r
        )
        for r, s in zip(a, b, strict=True)
    )


def rows(run: Path) -> int:
    f = run / "metrics.jsonl"
    return len(f.read_text().splitlines()) if f.exists() else 0


def wait_for_rows(run: Path, n: int, proc, timeout: float = 300) -> int:
    """Wait for at least ``n`` rows; the number seen (more than ``n`` when the tiny
    model's steps, tens of milliseconds once compiled, outran the 50 ms poll)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (seen := rows(run)) >= n:
            return seen
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{run} never reached {n} metrics rows")


@pytest.fixture(scope="module")
def whole(tmp_path_factory, tiny_args):
    from tests.faults.conftest import Cli

    root = tmp_path_factory.mktemp("whole")
    r = Cli(root)(*tiny_args(root, "whole", *STEPS))
    assert r.returncode == 0, r.stderr
    return metrics(root / "whole")


@pytest.mark.parametrize(
    "sig, after_rows",
    [(signal.SIGKILL, 3), (signal.SIGTERM, 3), (signal.SIGKILL, 1), (signal.SIGTERM, 5)],
)
def test_a_signalled_run_is_never_shown_running_and_resumes_to_the_same_metrics(
    cli, tiny_args, tmp_path, whole, sig, after_rows
):
    root = tmp_path / "runs"
    p = cli.start(*tiny_args(root, "k", *STEPS))
    wait_for_rows(root / "k", after_rows, p)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    if sig == signal.SIGTERM:
        assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    r = cli("status", "k", "--runs-dir", str(root), "-o", "json")
    info = json.loads(r.stdout)
    assert info["phase"] == ("stale" if sig == signal.SIGKILL else "interrupted"), info
    assert (
        not [n for n in (root / "k" / "checkpoints").iterdir() if "tmp" in n.name]
        or sig == signal.SIGKILL
    )  # a SIGKILLed save's leftovers go at the next start
    r = cli("resume", "k", "--runs-dir", str(root))
    assert r.returncode == 0, r.stderr
    assert same(metrics(root / "k"), whole)


def test_two_resumes_of_one_run_at_once(cli, tiny_args, tmp_path, whole):
    root = tmp_path / "runs"
    p = cli.start(*tiny_args(root, "two", *STEPS))
    wait_for_rows(root / "two", 3, p)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=120)
    first = cli.start("resume", "two", "--runs-dir", str(root))
    status = root / "two" / "status.json"
    end = time.monotonic() + 120
    while json.loads(status.read_text()).get("pid") != first.pid:  # it holds the lock
        assert time.monotonic() < end and first.poll() is None
        time.sleep(0.05)
    second = cli("resume", "two", "--runs-dir", str(root))
    one_error(second, 4, "in use by pid")
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert same(metrics(root / "two"), whole)


def test_two_trains_of_one_name_at_once(cli, tiny_args, tmp_path):
    root = tmp_path / "runs"
    procs = [cli.start(*tiny_args(root, "dup", "--steps", "2")) for _ in range(2)]
    results = sorted((p.wait(timeout=300), p.stderr.read()) for p in procs)
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    (ok, _), (refused, err) = results
    assert (ok, refused) == (0, 4), results
    assert "already exists" in err and "Traceback" not in err
    assert [m["step"] for m in metrics(root / "dup")] == [1, 2]
