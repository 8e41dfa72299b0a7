"""The run-store exchange between a learner and its generator process
(rollout/exchange.py): what each side writes is read whole by the other, once."""

from __future__ import annotations

import numpy as np
import pytest

from rlctl.core.store import open_store
from rlctl.core.trainer.rollout.exchange import Exchange, Trajectory, flat_state, load_flat


@pytest.fixture()
def exchange(tmp_path) -> Exchange:
    run = open_store(str(tmp_path)).run("r")
    run.write_json("status.json", {})
    x = Exchange(run)
    x.begin("attempt-1")
    return x


def test_a_new_attempt_drops_what_an_earlier_one_left(exchange):
    exchange.request(3, 1, 0)
    exchange.begin("attempt-2")
    assert exchange.attempt() == "attempt-2" and exchange.pending() == []


def test_weights_go_by_version_and_old_ones_are_dropped(exchange):
    flat = {"layers/0/w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert exchange.put_weights(0, flat) == 24
    exchange.put_weights(1, {"layers/0/w": flat["layers/0/w"] + 1})
    got = exchange.weights(1)
    assert got is not None and got["layers/0/w"][0, 0] == 1.0
    exchange.drop_weights(below=1)
    assert exchange.weights(0) is None and exchange.weights(1) is not None
    assert exchange.weights(7) is None  # never written: the generator waits for it


def test_a_request_is_answered_once_with_its_arrays_and_figures(exchange):
    exchange.request(2, 1, 5)
    exchange.request(1, 0, 4)
    assert [r["step"] for r in exchange.pending()] == [1, 2]  # by step
    assert exchange.result(1, 4) == (None, None)
    arrays = {"reward": np.array([0.5, 1.0], np.float32), "lengths": np.array([3, 4], np.int32)}
    exchange.answer({"step": 1, "attempt": 4, "version": 0}, Trajectory(arrays, {"m": {"a": 1}}))
    assert [r["step"] for r in exchange.pending()] == [2]
    got, error = exchange.result(1, 4)
    assert error is None and got is not None
    assert got.meta == {"m": {"a": 1}} and got.arrays["lengths"].tolist() == [3, 4]
    assert exchange.result(1, 4) == (None, None)  # taken: read once
    assert not list(exchange.root.rglob(".*.tmp"))  # no temporary left behind


def test_a_refused_request_carries_the_users_message_and_hint(exchange):
    exchange.request(0, 0, 0)
    exchange.refuse({"step": 0, "attempt": 0}, "reward 'mine' returned a string", "fix it")
    got, error = exchange.result(0, 0)
    assert got is None and error == {"message": "reward 'mine' returned a string", "hint": "fix it"}
    assert exchange.pending() == []


def test_stop_is_seen_by_the_generator(exchange):
    assert not exchange.stopped()
    exchange.stop()
    assert exchange.stopped()


@pytest.mark.slow
def test_a_models_state_goes_through_the_flat_form_and_back():
    pytest.importorskip("flax")
    from flax import nnx

    a = nnx.Linear(3, 4, rngs=nnx.Rngs(0))
    b = nnx.Linear(3, 4, rngs=nnx.Rngs(1))
    flat = flat_state(nnx.state(a))
    assert set(flat) == {"kernel", "bias"}
    load_flat(b, flat)
    assert np.array_equal(np.asarray(b.kernel[...]), np.asarray(a.kernel[...]))
