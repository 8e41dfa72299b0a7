"""The run-store exchange between a learner and its generator process
(rollout/exchange.py): what each side writes is read whole by the other, once, on a
local run store and on gs:// (fake-gcs-server, the real storage client), each side
with a store handle of its own as two processes (or pods) have."""

from __future__ import annotations

import numpy as np
import pytest

from rlctl.core.store import open_store
from rlctl.core.trainer.rollout.exchange import Exchange, Trajectory, flat_state, load_flat


@pytest.fixture(params=["local", "gcs"])
def store(request, tmp_path):
    """A factory of handles on one run store, each as another process opens it."""
    if request.param == "local":
        return lambda: open_store(str(tmp_path / "runs"))
    from rlctl.core.store.gcs import GcsRunStore

    client, bucket = request.getfixturevalue("gcs")
    staging = iter(range(100))
    return lambda: GcsRunStore(
        f"gs://{bucket}/runs", client=client, staging_root=str(tmp_path / f"s{next(staging)}")
    )


@pytest.fixture()
def sides(store) -> tuple[Exchange, Exchange]:
    """(the learner's side, the generator's), each on a store handle of its own."""
    run = store().run("r")
    run.write_json("status.json", {})
    learner = Exchange(run)
    learner.begin("attempt-1")
    return learner, Exchange(store().run("r"))


def test_a_new_attempt_drops_what_an_earlier_one_left(sides):
    learner, generator = sides
    learner.request(3, 1, 0)
    learner.begin("attempt-2")
    assert generator.attempt() == "attempt-2" and generator.pending() == []


def test_weights_go_by_version_and_old_ones_are_dropped(sides):
    learner, generator = sides
    flat = {"layers/0/w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert learner.put_weights(0, flat) == 24
    learner.put_weights(1, {"layers/0/w": flat["layers/0/w"] + 1})
    got = generator.weights(1)
    assert got is not None and got["layers/0/w"][0, 0] == 1.0
    learner.drop_weights(below=1)
    assert generator.weights(0) is None and generator.weights(1) is not None
    assert generator.weights(7) is None  # never written: the generator waits for it


def test_a_request_is_answered_once_with_its_arrays_and_figures(sides):
    learner, generator = sides
    learner.request(2, 1, 5)
    learner.request(1, 0, 4)
    assert [r["step"] for r in generator.pending()] == [1, 2]  # by step
    assert learner.result(1, 4) == (None, None)
    arrays = {"reward": np.array([0.5, 1.0], np.float32), "lengths": np.array([3, 4], np.int32)}
    generator.answer({"step": 1, "attempt": 4, "version": 0}, Trajectory(arrays, {"m": {"a": 1}}))
    assert [r["step"] for r in generator.pending()] == [2]
    got, error = learner.result(1, 4)
    assert error is None and got is not None
    assert got.meta == {"m": {"a": 1}} and got.arrays["lengths"].tolist() == [3, 4]
    assert learner.result(1, 4) == (None, None)  # taken: read once
    for side in sides:
        assert not list(side.root.rglob(".*.tmp"))  # no temporary left behind


def test_a_refused_request_carries_the_users_message_and_hint(sides):
    learner, generator = sides
    learner.request(0, 0, 0)
    generator.refuse({"step": 0, "attempt": 0}, "reward 'mine' returned a string", "fix it")
    got, error = learner.result(0, 0)
    assert got is None and error == {"message": "reward 'mine' returned a string", "hint": "fix it"}
    assert generator.pending() == []


def test_stop_names_the_attempt_it_ends(sides):
    learner, generator = sides
    assert generator.stopped() is None
    learner.stop("attempt-1")
    assert generator.stopped() == "attempt-1"
    learner.begin("attempt-2")  # a restarted learner: the old stop is gone with the rest
    assert generator.stopped() is None and generator.attempt() == "attempt-2"


def test_clear_leaves_nothing_in_the_store(sides):
    learner, generator = sides
    learner.put_weights(0, {"w": np.zeros(3, np.float32)})
    learner.request(0, 0, 0)
    generator.weights(0)
    learner.clear()
    assert not learner.run.exists("pipeline") and generator.attempt() is None
    assert not learner.root.exists()


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


def test_clear_may_keep_what_generator_pods_still_read(sides):
    learner, generator = sides
    learner.put_weights(0, {"w": np.zeros(3, np.float32)})
    learner.stop("attempt-1")
    learner.clear(keep=("plan.json", "stop"))
    assert generator.stopped() == "attempt-1" and generator.weights(0) is None
    assert learner.run.list("pipeline") == ["plan.json", "stop"]
