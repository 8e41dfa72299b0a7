"""The pipelined run's scheduling (run/pipeline.py), without JAX: which policy version
samples each step, how far the generator runs ahead, what a stale trajectory, a failing
generator and a closed pipeline do."""

from __future__ import annotations

import threading
import time

import pytest

from rlctl.core.config.models import RolloutSpec
from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rollout.placement import HOST_DEVICES_FLAG, give_host_devices, share
from rlctl.core.trainer.run.pipeline import Pipeline


def learn(p: Pipeline, start: int, stop: int, work: float = 0.0) -> list:
    """The learner's loop: take each step, 'update', publish the next version."""
    got = []
    p.publish(start)
    p.begin()
    try:
        for step in range(start, stop):
            produced, figures = p.take(step)
            got.append((step, produced.version, produced.item, figures))
            time.sleep(work)
            p.publish(step + 1)
    finally:
        p.close()
    return got


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_each_step_is_sampled_by_the_version_lag_steps_before(lag):
    p = Pipeline(lambda step, version: (step, version), start=0, stop=7, lag=lag)
    got = learn(p, 0, 7)
    assert [v for _, v, _, _ in got] == [max(0, s - lag) for s in range(7)]
    assert [f.staleness for *_, f in got] == [min(s, lag) for s in range(7)]
    assert all(f.dropped == 0 and f.restarts == 0 for *_, f in got)


def test_a_resumed_run_samples_its_first_steps_from_the_restored_version():
    """What was in flight at the kill is gone: steps 4 and 5 come from version 4."""
    p = Pipeline(lambda step, version: version, start=4, stop=8, lag=2)
    got = learn(p, 4, 8)
    assert [v for _, v, _, _ in got] == [4, 4, 4, 5]


def test_with_lag_zero_the_generator_never_runs_ahead():
    """Synchronous: step j's sampling starts only once version j is published."""
    published = []
    p = Pipeline(lambda step, version: published[-1], start=0, stop=5, lag=0)
    original = p.publish

    def publish(version):
        published.append(version)
        original(version)

    p.publish = publish  # type: ignore[method-assign]
    got = learn(p, 0, 5, work=0.01)
    assert [item for _, _, item, _ in got] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("lag", [1, 3])
def test_the_buffer_holds_at_most_lag_trajectories_ahead(lag):
    """Backpressure: a slow learner never finds more than ``lag`` ready beyond its own."""
    p = Pipeline(lambda step, version: step, start=0, stop=10, lag=lag)
    got = learn(p, 0, 10, work=0.02)
    assert max(f.ahead for *_, f in got) <= lag
    if lag > 1:  # with 1, step j+1 needs version j: it is sampled while j is learned
        assert max(f.ahead for *_, f in got) >= 1  # it did run ahead


def test_a_trajectory_older_than_the_bound_is_dropped_counted_and_made_again():
    versions = {3: 0}  # step 3 would be sampled by version 0: 3 behind with lag 1

    p = Pipeline(
        lambda step, version: version,
        start=0,
        stop=6,
        lag=1,
        version_for=lambda j: versions.get(j, max(0, j - 1)),
    )
    lines: list[str] = []
    p.say = lines.append
    got = learn(p, 0, 6, work=0.01)
    step3 = got[3]
    assert step3[1] >= 2 and step3[3].staleness <= 1  # re-made from a version in bound
    assert got[-1][3].dropped == 1
    assert any("dropped and sampled again" in line for line in lines)


def test_a_failing_generator_is_restarted_on_the_same_step_without_stopping_the_learner():
    failed = []

    def produce(step, version):
        if step == 2 and not failed:
            failed.append(step)
            raise RuntimeError("device lost")
        return step

    lines: list[str] = []
    p = Pipeline(produce, start=0, stop=5, lag=1, say=lines.append)
    got = learn(p, 0, 5)
    assert [item for _, _, item, _ in got] == [0, 1, 2, 3, 4]
    assert got[-1][3].restarts == 1
    assert any("restarting it (1 of 2)" in line for line in lines)


def test_a_generator_that_keeps_failing_stops_the_run_with_its_error():
    def produce(step, version):
        if step == 1:
            raise RuntimeError("device lost for good")
        return step

    p = Pipeline(produce, start=0, stop=4, lag=1, retries=2)
    with pytest.raises(RuntimeError, match="for good"):
        learn(p, 0, 4)


def test_the_users_reward_error_is_not_retried_but_raised_in_the_learner():
    calls = []

    def produce(step, version):
        calls.append(step)
        if step == 1:
            raise ConfigError("step 2: reward 'mine' returned a string")
        return step

    p = Pipeline(produce, start=0, stop=4, lag=1)
    with pytest.raises(ConfigError, match="returned a string"):
        learn(p, 0, 4)
    assert calls.count(1) == 1


def test_close_stops_a_generator_waiting_for_room_or_a_version():
    p = Pipeline(lambda step, version: step, start=0, stop=100, lag=2)
    p.publish(0)
    p.begin()
    time.sleep(0.1)  # it fills its buffer and waits
    t0 = time.perf_counter()
    p.close()
    assert time.perf_counter() - t0 < 2
    assert p.thread is not None and not p.thread.is_alive()
    assert threading.active_count() >= 1


def test_busy_fractions_show_which_half_waits():
    """A slow generator: the learner waits (low busy), the generator is busy."""
    p = Pipeline(lambda step, version: time.sleep(0.05) or step, start=0, stop=6, lag=1)
    got = learn(p, 0, 6)
    later = [f for *_, f in got[2:]]
    assert all(f.generator_busy > 0.8 for f in later)
    assert all(f.learner_busy < 0.5 for f in later)


# --- placement (rollout/placement.py) ------------------------------------------------
@pytest.mark.parametrize(
    ("devices", "asked", "expected"),
    [(2, 0.5, (1, 1)), (8, 0.5, (4, 4)), (8, 0.25, (6, 2)), (8, 3, (5, 3)), (3, 0.1, (2, 1))],
)
def test_the_generators_share_is_a_count_or_a_fraction(devices, asked, expected):
    assert share(devices, asked) == expected


def test_a_split_of_one_device_says_how_to_get_two():
    with pytest.raises(ConfigError) as e:
        share(1, 0.5)
    assert "at least 2 devices" in e.value.message and HOST_DEVICES_FLAG in e.value.hint


def test_a_generator_of_every_device_is_refused_with_the_largest_that_fits():
    with pytest.raises(ConfigError) as e:
        share(4, 4)
    assert "leaves the learner no device" in e.value.message
    assert "at most 3" in e.value.hint


def test_a_count_of_devices_is_whole():
    with pytest.raises(ValueError, match="a count of devices"):
        RolloutSpec(devices=1.5)
    assert RolloutSpec(devices=2).devices == 2
    with pytest.raises(ValueError):
        RolloutSpec(max_staleness=9)


def test_a_split_run_on_a_cpu_gets_its_host_devices_unless_it_named_them():
    env: dict[str, str] = {"XLA_FLAGS": "--xla_cpu_foo=1"}
    assert give_host_devices(RolloutSpec(placement="split"), env)
    assert env["XLA_FLAGS"] == f"--xla_cpu_foo=1 {HOST_DEVICES_FLAG}=2"
    env = {}
    assert give_host_devices(RolloutSpec(placement="split", devices=3), env)
    assert env["XLA_FLAGS"] == f"{HOST_DEVICES_FLAG}=4"
    named = {"XLA_FLAGS": f"{HOST_DEVICES_FLAG}=8"}
    assert not give_host_devices(RolloutSpec(placement="split"), named)
    assert named["XLA_FLAGS"] == f"{HOST_DEVICES_FLAG}=8"
    assert not give_host_devices(RolloutSpec(max_staleness=1), env := {})
    assert env == {}


def test_the_host_device_count_is_given_only_while_the_backends_start(monkeypatch):
    """A process that trains in-process (a test, a notebook) must not pass the count on
    to the processes it starts afterwards (test_compiles' runs saw two devices)."""
    import os

    from rlctl.core.trainer.rollout.placement import host_devices

    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_foo=1")
    with host_devices(RolloutSpec(placement="split")):
        assert os.environ["XLA_FLAGS"] == f"--xla_cpu_foo=1 {HOST_DEVICES_FLAG}=2"
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_foo=1"
    monkeypatch.delenv("XLA_FLAGS")
    with host_devices(RolloutSpec(placement="split")):
        assert HOST_DEVICES_FLAG in os.environ["XLA_FLAGS"]
    assert "XLA_FLAGS" not in os.environ


def test_a_generator_process_beside_a_learner_of_several_processes_is_refused():
    """Every learner process would ask for each step: refused with what does run."""
    from rlctl.core.trainer.rollout.placement import place

    spec = RolloutSpec(placement="process", max_staleness=1)
    assert place(spec, ["d0"], multi_process=False).process
    with pytest.raises(ConfigError, match="needs a learner of one process") as e:
        place(spec, ["d0"], multi_process=True)
    assert "rollout.placement=colocated" in (e.value.hint or "")
