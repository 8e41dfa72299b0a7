"""Compile once: every program of a run compiles during its first step (or the
baseline eval before it), none later, and a second run with the persistent cache
compiles nothing. Counted with JAX's own compile events, in fresh processes (an
in-process run would reuse the previous run's in-memory programs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("tunix")
pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[3]

# Runs `rlctl ARGS...` and writes each XLA compilation as [phase, function, from-cache].
PROBE = r"""
import atexit, json, os, runpy, sys
import jax.monitoring as mon
from rlctl.core.trainer.run import loop
seen, phase, hit = [], ["setup"], [False]
def on_event(event, **kw):
    if event == "/jax/compilation_cache/cache_hits":
        hit[0] = True
def on_duration(event, duration, **kw):
    if event == "/jax/core/compile/backend_compile_duration":
        seen.append([phase[0], kw.get("fun_name"), hit[0]])
        hit[0] = False
mon.register_event_listener(on_event)
mon.register_event_duration_secs_listener(on_duration)
real = loop.Trainer.step
def step(self, k):
    phase[0] = f"step-{k + 1}"
    try:
        return real(self, k)
    finally:
        phase[0] = f"after-{k + 1}"
loop.Trainer.step = step
atexit.register(lambda: open(os.environ["PROBE_OUT"], "w").write(json.dumps(seen)))
sys.argv = ["rlctl", *sys.argv[1:]]
runpy.run_module("rlctl", run_name="__main__")
"""


def counted(
    args: list[str], cache: Path, out: Path, env_extra: dict[str, str] | None = None
) -> list[tuple[str, str, bool]]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RLCTL_COMPILE_CACHE": str(cache),
        "PROBE_OUT": str(out),
        **(env_extra or {}),
    }
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    r = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    return [tuple(x) for x in json.loads(out.read_text())]


def test_each_program_compiles_once_and_a_second_run_compiles_nothing(tiny_model_dir, tmp_path):
    from tests.core.trainer.test_train import metrics, tiny_args

    cache = tmp_path / "xla"

    def run(name: str) -> list[tuple[str, str, bool]]:
        return counted(
            [
                *tiny_args(
                    tiny_model_dir,
                    tmp_path,
                    name,
                    "grpo",
                    "--steps",
                    "6",
                    "--max-new-tokens",
                    "24",
                    "--set",
                    "eval.interval=3",
                    "--set",
                    "checkpoint.interval=2",
                )
            ],
            cache,
            tmp_path / f"{name}.json",
        )

    first = run("first")
    rows = metrics(tmp_path / "first")
    assert len({r["completion_length"] for r in rows}) > 1, "completions did not vary"
    compiled = [(phase, fun) for phase, fun, hit in first if not hit]
    late = [c for c in compiled if c[0] not in ("setup", "step-1")]
    assert late == [], f"compiled after the first step: {late}"
    per_program = Counter(fun for _, fun in compiled)
    assert per_program["jit(step)"] == 1  # the update
    # the sampler: one program for greedy evals (baseline, step 3, final: 4 prompts x 1),
    # compiled by the baseline, one for sampling (2 prompts x 4) by step 1; greedy and
    # the sampling parameters are traced values, not programs of their own
    assert per_program["jit(sample_groups)"] == 2
    assert ("setup", "jit(sample_groups)") in compiled
    # the update compiles before the optimizer's moments exist (Update.precompile), so
    # step 1 compiles the sampling program, nothing else
    assert ("setup", "jit(step)") in compiled
    assert Counter(fun for phase, fun in compiled if phase == "step-1") == {"jit(sample_groups)": 1}

    # each compile of the run's programs said what it compiled and how long it took
    log = (tmp_path / "first" / "train.log").read_text()
    for what in ("the update (jit(step))", "the sampler (jit(sample_groups))"):
        assert re.search(rf"compiled {re.escape(what)} in \d+\.\d s", log), (what, log)
    status = json.loads((tmp_path / "first" / "status.json").read_text())
    assert set(status["compiles"]) == {"step", "sample_groups"}, status
    assert all(v > 0 for v in status["compiles"].values())
    assert "peak_device_bytes" not in status  # a CPU keeps no allocator statistics

    second = run("second")
    assert [c for c in second if not c[2]] == [], "the second run compiled"
    assert ("setup", "jit(step)", True) in second  # loaded from the persistent cache
    assert any(cache.iterdir())
    log = (tmp_path / "second" / "train.log").read_text()
    assert "loaded the update (jit(step)) from the compilation cache in " in log, log


def test_the_accelerators_row_compiles_one_update_and_one_sampler(tiny_model_dir, tmp_path):
    """In the accelerators' row of the numerics table (RLCTL_NUMERICS=gpu: what a GPU
    runs, here on the CPU) a whole run compiles one update and one sampler program,
    its evals included: every row is prefilled, so an eval batch of P x G prompts is
    the rollout's shape, and greedy is a traced value."""
    from tests.core.trainer.test_train import tiny_args

    args = tiny_args(
        tiny_model_dir,
        tmp_path,
        "gpu-row",
        "grpo",
        "--steps",
        "4",
        "--set",
        "eval.batch_size=8",
        "--set",
        "eval.interval=2",
        "--set",
        "checkpoint.interval=2",
    )
    seen = counted(args, tmp_path / "xla", tmp_path / "gpu-row.json", {"RLCTL_NUMERICS": "gpu"})
    compiled = [(phase, fun) for phase, fun, hit in seen if not hit]
    per_program = Counter(fun for _, fun in compiled)
    assert per_program["jit(step)"] == 1  # the update
    assert per_program["jit(sample_groups)"] == 1  # rollout and evals: one program
    assert ("setup", "jit(sample_groups)") in compiled  # by the baseline eval
    late = [c for c in compiled if c[0] not in ("setup", "step-1")]
    assert late == [], f"compiled after the first step: {late}"
    log = (tmp_path / "gpu-row" / "train.log").read_text()
    assert (
        "numerics: gpu row: none of the CPU's tricks; layers scanned (one layer body "
        "compiled); saves in the background" in log
    ), log


def test_a_late_compilation_is_reported_with_its_reason(monkeypatch):
    import jax
    import jax.numpy as jnp

    from rlctl.core.trainer.runtime.compiles import CACHE_ENV, CompileWatch, enable_persistent_cache

    monkeypatch.setenv(CACHE_ENV, "off")  # a hit from an earlier run would be no compile
    enable_persistent_cache(print)
    lines: list[str] = []

    @jax.jit
    def double(x):
        return x * 2

    three, five = jnp.ones(3), jnp.ones(5)
    with CompileWatch(report=lines.append) as watch:
        double(three)
        watch.warm()
        double(three)  # cached: nothing to say
        assert lines == []
        double(five)
    assert watch.compiled["jit(double)"] == 2
    assert len(lines) == 1
    assert lines[0].startswith("compiled jit(double) again after warm-up")
    assert "different input types: at x, now f32[5] and before f32[3]" in lines[0], lines[0]


def test_each_compile_of_a_run_program_says_what_and_how_long(monkeypatch):
    """A run's program (here one named as the update's function is) is reported with
    its seconds, tracing and lowering included, and kept for status; another program
    only when it takes a second or more."""
    import jax
    import jax.numpy as jnp

    from rlctl.core.trainer.runtime.compiles import CACHE_ENV, CompileWatch, enable_persistent_cache

    monkeypatch.setenv(CACHE_ENV, "off")
    enable_persistent_cache(print)
    lines: list[str] = []
    recorded: list[dict[str, float]] = []

    @jax.jit
    def step(x):
        return jnp.sin(x) * 3

    @jax.jit
    def tiny(x):
        return x + 1

    # the input made before the watch: its own small program (broadcast_in_dim) took 1.5 s
    # to compile on a loaded CI machine, a second program over the reporting threshold
    x = jnp.ones(7).block_until_ready()
    with CompileWatch(report=lines.append, on_compile=recorded.append) as watch:
        step(x)
        tiny(x)
    assert len(lines) == 1, lines
    assert re.fullmatch(r"compiled the update \(jit\(step\)\) in \d+\.\d s", lines[0]), lines
    assert set(watch.seconds) == {"step"} and recorded == [watch.seconds]


# One pod of a cluster run, as far as its compilation cache goes: the cache enabled for
# the run on gs:// (pulled), one program compiled or loaded, pushed; prints
# [compiled, loaded, cache folder].
POD = r"""
import json, sys
import jax, jax.numpy as jnp
from rlctl.core.store.gcs import GcsRunStore
from rlctl.core.trainer.runtime.compiles import CompileWatch, enable_persistent_cache, push_cache
from tests.fakes.gcs import storage_client
bucket, staging = sys.argv[1:]
run = GcsRunStore(f"gs://{bucket}/runs", client=storage_client(), staging_root=staging).run("r")
folder = enable_persistent_cache(print, run)
step = jax.jit(lambda x: jnp.cos(x) * 5 + 1)
with CompileWatch() as watch:
    step(jnp.ones(11))
assert push_cache(run, print)
print(json.dumps([watch.total, sum(watch.hits.values()), str(folder)]))
"""


def test_a_gs_run_keeps_its_compilation_cache_beside_it_in_its_store(gcs, tmp_path, monkeypatch):
    """A cluster run's pods (each a process with its own staging folder) share the cache
    through the run's ``xla/`` in its gs:// store: the first compiles and pushes, a
    restarted pod loads the program instead. A local run keeps the local cache."""
    from rlctl.core.store.local import LocalRunStore
    from rlctl.core.trainer.runtime.compiles import CACHE_ENV, enable_persistent_cache, push_cache

    client, bucket = gcs
    env = {k: v for k, v in os.environ.items() if k not in (CACHE_ENV, "JAX_COMPILATION_CACHE_DIR")}
    env["PYTHONPATH"] = str(REPO)

    env["RLCTL_CACHE"] = str(tmp_path / "home-cache")  # a pod's ~/.cache/rlctl
    folder = tmp_path / "home-cache" / "xla-runs" / "r"

    def pod(n: int) -> list:
        """A pod's process: its own staging folder, and (a fresh container) nothing
        in its local cache."""
        shutil.rmtree(folder, ignore_errors=True)
        r = subprocess.run(
            [sys.executable, "-c", POD, bucket, str(tmp_path / f"pod{n}")],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    compiled, loaded, where = pod(1)
    assert compiled >= 1 and loaded == 0 and where == str(folder)
    names = [b.name for b in client.list_blobs(bucket, prefix="runs/r/xla/")]
    assert any(n.endswith("-cache") for n in names), names
    assert pod(2)[:2] == [0, compiled], "every program loaded from the store's copy"

    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("RLCTL_CACHE", str(tmp_path / "local"))
    local = LocalRunStore(tmp_path / "runs").run("r")
    assert enable_persistent_cache(print, local) == tmp_path / "local" / "xla"
    assert not push_cache(local, print)


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    from rlctl.core.trainer.runtime.compiles import CACHE_ENV, compile_cache_dir

    monkeypatch.setenv("RLCTL_CACHE", str(tmp_path / "rlctl"))
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert compile_cache_dir() == tmp_path / "rlctl" / "xla"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"
    monkeypatch.setenv(CACHE_ENV, "off")
    assert compile_cache_dir() is None
