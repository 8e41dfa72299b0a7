"""rlctl's update, rollout and eval compiled for accelerators that are not here, each beside
a reference program of the same model, in one invocation: compile seconds as ratios, and
each program's device memory.

XLA compiles for an H200 (JAX's CUDA plugin with rlctl's device description) or a TPU
topology (libtpu) on a machine without either (the fit check's compile-only devices,
rlctl/core/trainer/runtime/targets.py); what it compiles is the real executable with its
real memory analysis. Nothing autotunes without the GPU: a GPU's own compile differs.

Programs, for each target and workload:
  update       rlctl's whole update (loss, gradients, AdamW) as the pods compile it: the
               target's numerics row, the whole batch (over a mesh every layer recomputed)
  update-ref   jax.value_and_grad of the same Tunix model's token log-likelihood x
               advantages over the whole sequences, then optax.adamw (layers unrolled)
  rollout      rlctl's sampler (sample_groups) for the step's P x G completions
  rollout-ref  Tunix's own sampler (its prefill and decode programs) at the same shapes
  eval         rlctl's sampler for an eval batch (greedy; the rollout's program when the
               shapes agree)
Each in a fresh process (nothing cached, no compiler warmed by another), rlctl's right
before its reference. Workloads: 2x8x48 (the default run: SmolLM2-135M's shape, 2 prompts
x 8 completions x 48 tokens), 16x8x256 (the same model), 1b (Llama-3.2-1B's shape with
SmolLM2's vocabulary, 2x8x48), qwen3.5-0.8b (Qwen3.5-0.8B's text model, 2x8x48; not in
the default set: ``--workloads qwen3.5-0.8b --programs update,update-ref,rollout``, its
reference sampler being Tunix's, which has no Qwen3.5). Targets: h200 (one GPU), h100,
b200, a100 (one GPU), or any catalog slice (v6e-8, 'v6e-16 x2', v5litepod-4).

    python -m bench.bench_compile                               # h200 and v6e-8, every workload
    python -m bench.bench_compile --targets v6e-1,v6e-8 --workloads 1b --programs update
    python -m bench.bench_compile -o json
    python -m bench.bench_compile --targets h200 --workloads 2x8x48 --repeat 5  # medians

``fusions``: the compiled program's distinct fusions (``distinct_fusions``), what XLA's
GPU compiler spends its time on. Needs the compile extras
(`pip install -c constraints.txt -e '.[train,compile-tpu,
compile-gpu]'`); run alone on the machine: compile times are what it compares.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = {"2x8x48": ("smollm2-135m", 2, 8, 48), "16x8x256": ("smollm2-135m", 16, 8, 256)}
WORKLOADS["1b"] = ("1b", 2, 8, 48)
WORKLOADS["qwen3.5-0.8b"] = ("qwen3.5-0.8b", 2, 8, 48)
# Qwen3.5-0.8B-Base's text model (its published text_config; tests/data/configs holds the
# multimodal file): 24 layers, three gated-DeltaNet layers to one gated attention
QWEN3_5_0_8B: dict[str, Any] = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "hidden_size": 1024,
    "intermediate_size": 3584,
    "num_hidden_layers": 24,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
    "tie_word_embeddings": True,
    "max_position_embeddings": 262144,
    "eos_token_id": 248044,
}
PROGRAMS = ["update", "update-ref", "rollout", "rollout-ref", "eval"]
ONE_GPU = {"h200": "a3-ultragpu-8g", "h100": "a3-highgpu-8g", "b200": "a4-highgpu-8g"}
ONE_GPU["a100"] = "a2-highgpu-1g"


def target_for(name: str) -> Any:
    """A ``CompileTarget`` by name: one GPU (h200, h100, b200, a100) or a catalog slice
    with an optional count ('v6e-16 x2')."""
    from rlctl.core.config.catalog import lookup, parse_slices
    from rlctl.core.config.compile_targets import compile_target

    if name in ONE_GPU:
        eight = compile_target(lookup(ONE_GPU[name]), 1)
        assert eight is not None
        return eight.model_copy(update={"devices": 1, "per_host": 1, "label": f"one {name}"})
    acc, count = parse_slices(name)
    target = compile_target(lookup(acc), count)
    if target is None:
        sys.exit(f"no compile description of {name}")
    return target


def model_config(workload: str) -> dict[str, Any]:
    from bench.bench_gpu import one_b_shape
    from bench.bench_memory import SHAPES, hf_config

    shape = WORKLOADS[workload][0]
    if shape == "qwen3.5-0.8b":
        return json.loads(json.dumps(QWEN3_5_0_8B))
    return hf_config(one_b_shape() if shape == "1b" else SHAPES[shape], "float32")


def spec_for(workload: str) -> Any:
    from rlctl.core.config.models import RunSpec

    _, p, g, n = WORKLOADS[workload]
    return RunSpec(
        rollout={"num_generations": g, "max_new_tokens": n},
        training={"prompts_per_step": p},
        eval={"batch_size": p * g},
    )


# --- one program, in its own process --------------------------------------------------
def compile_one(target_name: str, workload: str, program: str) -> dict[str, Any]:
    """Compile ``program`` of ``workload`` for the target; its figures."""
    from rlctl.core.trainer.device_fit.check import place

    spec, config = spec_for(workload), model_config(workload)
    placed = place(spec, config, target_for(target_name))
    t0 = time.perf_counter()
    if program == "update":
        lowered, compiled = _update(spec, placed)
    elif program == "update-ref":
        lowered, compiled = _update_ref(spec, placed)
    elif program in ("rollout", "eval"):
        lowered, compiled = _sampler(spec, placed, program)
    elif program == "rollout-ref":
        return _tunix_sampler(spec, placed, t0)
    else:
        raise SystemExit(f"unknown program {program!r}")
    return _figures(lowered, compiled, time.perf_counter() - t0)


def distinct_fusions(hlo: str) -> int:
    """The distinct fusions of a compiled program's HLO text (``compiled.as_text()``):
    fusion computations told apart by kind and body, with every name (of instructions,
    parameters, called computations) and every ``metadata`` left out.

    Why count them: XLA's GPU compiler chooses a configuration for and emits each
    distinct fusion once (a repeated body is reused), and a real GPU autotunes each; so
    this count, not the operations, is what a program's layout changes (issue #51: the
    default update held 314 against its reference's 83, now 193). On the 2-core machine
    the deviceless compile's seconds did not follow it (docs/benchmarks.md)."""
    import re

    bodies: dict[str, str] = {}
    name, lines = None, []
    for line in hlo.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            name, lines = line.split()[0].lstrip("%"), [line.split("(", 1)[-1]]
        elif line.startswith("}") and name:
            bodies[name], name = "\n".join(lines), None
        elif name:
            lines.append(line)
    seen = set()
    for kind, called in re.findall(r" fusion\(.*?kind=(k\w+), calls=%?([\w.\-]+)", hlo):
        body = re.sub(r"metadata=\{[^}]*\}", "", bodies.get(called, called))
        body = re.sub(r"%[\w.\-]+|\bparam(?:eter)?_[\d.]+", "%", body)
        seen.add((kind, body))
    return len(seen)


def _figures(lowered: Any, compiled: Any, seconds: float) -> dict[str, Any]:
    m = compiled.memory_analysis()
    out = int(m.output_size_in_bytes - m.alias_size_in_bytes)
    return {
        "ops": lowered.as_text().count("\n"),
        "fusions": distinct_fusions(compiled.as_text()),
        "compile_s": round(seconds, 1),
        "arguments": int(m.argument_size_in_bytes),
        "temporaries": int(m.temp_size_in_bytes),
        "peak": int(m.argument_size_in_bytes + m.temp_size_in_bytes + out),
    }


def _update(spec: Any, placed: Any) -> tuple[Any, Any]:
    """rlctl's update of the whole batch, at the recomputation the pods start with."""
    import jax
    from flax import nnx

    from rlctl.core.trainer.runtime import compiles
    from rlctl.core.trainer.update.step import Update, batch_shape

    update = Update(spec, pad_id=0, info=placed.info, numerics=placed.row)
    mesh = placed.mesh
    level = update._remat_levels(sharded=mesh is not None and mesh.size > 1)[0]
    batch = batch_shape(spec, spec.rollout.max_prompt_tokens, False, placed.replicated)
    rows = batch.completion_ids.shape[0]
    graphdef, state = nnx.split((placed.model, placed.optimizer))
    keep = (jax.tree.map(lambda x: x.sharding, state), None, None, None)
    lowered = (
        jax.jit(update._step_fn(graphdef, rows, level, mesh), donate_argnums=0, out_shardings=keep)
        .trace(state, batch)
        .lower()
    )
    options = compiles.update_options(placed.info.compute_dtype, placed.row)
    return lowered, lowered.compile(compiler_options=options)


def _update_ref(spec: Any, placed: Any) -> tuple[Any, Any]:
    """The naive program: value_and_grad of the Tunix model's log-likelihood of the
    completions x advantages over whole [prompt + completion] sequences, optax.adamw."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    r, t = spec.rollout, spec.training
    rows, n, lp = t.prompts_per_step * r.num_generations, r.max_new_tokens, r.max_prompt_tokens
    mdef, params, rest = nnx.split(placed.model, nnx.Param, ...)
    tx = optax.adamw(1e-6)
    opt = jax.eval_shape(tx.init, params)
    same = jax.tree.map(lambda x: x.sharding, params)
    opt = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed.replicated), opt
    )
    opt = _like(opt, params)

    def step(state, tokens, advantages):
        params, opt = state

        def loss(p):
            m = nnx.merge(mdef, p, rest)
            T = tokens.shape[1]
            pos = jnp.broadcast_to(jnp.arange(T), tokens.shape)
            mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (tokens.shape[0], T, T))
            logits, _ = m(tokens, pos, None, mask)
            lp_ = jax.nn.log_softmax(logits[:, -n - 1 : -1].astype(jnp.float32))
            tok = jnp.take_along_axis(lp_, tokens[:, -n:, None], -1)[..., 0]
            return -(tok * advantages[:, None]).sum()

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), value

    mesh = placed.mesh
    rowwise = placed.replicated
    if mesh is not None and rows % mesh.shape["fsdp"] == 0:  # as rlctl splits its rows
        rowwise = NamedSharding(mesh, P("fsdp"))
    tokens = jax.ShapeDtypeStruct((rows, lp + n), jnp.int32, sharding=rowwise)
    adv = jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=rowwise)
    out = ((same, jax.tree.map(lambda x: x.sharding, opt)), None)
    lowered = (
        jax.jit(step, donate_argnums=0, out_shardings=out).trace((params, opt), tokens, adv).lower()
    )
    return lowered, lowered.compile()


def _like(opt: Any, params: Any) -> Any:
    """Adam's moments sharded as their parameters (optax's state mirrors the params'
    tree inside its ``mu`` and ``nu``)."""
    import jax

    shardings = {x.shape: x.sharding for x in jax.tree.leaves(params)}
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=shardings.get(x.shape, x.sharding)
        ),
        opt,
    )


def _sampler(spec: Any, placed: Any, program: str) -> tuple[Any, Any]:
    from rlctl.core.trainer.device_fit.check import _sampler_calls, _sampler_lowered

    calls = {name: (rows, group) for name, rows, group in _sampler_calls(spec, False)}
    rows, group = calls[program]
    lowered = _sampler_lowered(
        placed.model,
        placed.info,
        spec,
        placed.precision.sampling,
        placed.row,
        rows,
        group,
        spec.rollout.max_prompt_tokens,
        placed.replicated,
    )
    return lowered, lowered.compile()


class _Tokens:
    """What Tunix's sampler asks of a tokenizer (its tokenizer_adapter's check): token ids
    are handed to its programs here, so nothing is encoded."""

    def encode(self, text: str) -> list[int]:
        return [0]

    def decode(self, ids: list[int]) -> str:
        return ""

    def bos_id(self) -> int:
        return 0

    def pad_id(self) -> int:
        return 0

    def eos_id(self) -> int:
        return 1


def _tunix_sampler(spec: Any, placed: Any, t0: float) -> dict[str, Any]:
    """Tunix's sampler (generate/sampler.py, google-tunix 0.1.7) at the rollout's shapes:
    its prefill and its decode loop, each a jitted program, compiled abstractly."""
    import jax
    import jax.numpy as jnp
    from tunix.generate import sampler as sampler_lib

    info, r, t = placed.info, spec.rollout, spec.training
    rows, lp, n = t.prompts_per_step * r.num_generations, r.max_prompt_tokens, r.max_new_tokens
    cache = sampler_lib.CacheConfig(
        cache_size=lp + n,
        num_layers=info.num_layers,
        num_kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
    )
    sampler = sampler_lib.Sampler(transformer=placed.model, tokenizer=_Tokens(), cache_config=cache)

    def init() -> Any:
        return sampler.init_sample_state(
            jnp.zeros((rows, lp), jnp.int32),
            include_logits=False,
            total_sampling_steps=lp + n,
            forbidden_token_ids=None,
            temperature=r.temperature,
            top_p=1.0,
            top_k=None,
            seed=jax.random.PRNGKey(0),
            beam_size=None,
            include_logprobs=True,
        )

    sampler.eos_ids = jnp.array([1])
    # made for real (zeros on this CPU: its static fields, such as the prompt's width,
    # must be numbers), then its arrays as shapes on the target's devices
    state = jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed.replicated)
            if hasattr(x, "shape")
            else x
        ),
        init(),
    )
    weights = sampler._flattened_transformer_state
    prefill = sampler._compiled_prefill_fn.trace(weights, state, None, echo=False).lower()
    decode = sampler._compiled_decode_fn.trace(weights, state).lower()
    first, second = prefill.compile(), decode.compile()
    seconds = time.perf_counter() - t0
    a, b = _figures(prefill, first, seconds), _figures(decode, second, seconds)
    return {
        "ops": a["ops"] + b["ops"],
        "fusions": a["fusions"] + b["fusions"],
        "compile_s": round(seconds, 1),
        "arguments": max(a["arguments"], b["arguments"]),
        "temporaries": max(a["temporaries"], b["temporaries"]),
        "peak": max(a["peak"], b["peak"]),
    }


# --- the invocation ---------------------------------------------------------------------
def run_child(target: str, workload: str, program: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_ENABLE_COMPILATION_CACHE": "false",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    args = [sys.executable, "-m", "bench.bench_compile", "--child", target, workload, program]
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
    wall = round(time.perf_counter() - t0, 1)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or ["no output"]
        return {"error": tail[0][:300], "wall_s": wall}
    return {**json.loads(lines[-1]), "wall_s": wall}


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One program's figures over its ``--repeat`` compiles: the median compile seconds
    (each run's in ``compile_runs``), the rest the first's (the same program each time);
    a failure if any run failed."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    seconds = sorted(r["compile_s"] for r in runs)
    mid = len(seconds) // 2
    value = seconds[mid] if len(seconds) % 2 else (seconds[mid - 1] + seconds[mid]) / 2
    return {**runs[0], "compile_s": round(value, 1), "compile_runs": [r["compile_s"] for r in runs]}


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rlctl program's compile seconds and peak over its reference's (same target
    and workload); None where either failed."""
    out = []
    index = {(r["target"], r["workload"], r["program"]): r for r in rows}
    for r in rows:
        ref = {"update": "update-ref", "rollout": "rollout-ref", "eval": "rollout-ref"}.get(
            r["program"]
        )
        other = index.get((r["target"], r["workload"], ref)) if ref else None
        ok = other is not None and "error" not in r and "error" not in other
        out.append(
            {
                **r,
                "x_ref_compile": round(r["compile_s"] / other["compile_s"], 2) if ok else None,
                "x_ref_peak": round(r["peak"] / other["peak"], 2) if ok else None,
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default="h200,v6e-8")
    p.add_argument("--workloads", default="2x8x48,16x8x256,1b")
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="compile each program this many times, round robin; the median's ratio",
    )
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(compile_one(*a.child)), flush=True)
        return
    rows = []
    for target in a.targets.split(","):
        for workload in a.workloads.split(","):
            runs: dict[str, list[dict[str, Any]]] = {}
            for n in range(a.repeat):  # round robin: a slow spell hits every program alike
                for program in a.programs.split(","):
                    again = f" (round {n + 1} of {a.repeat})" if a.repeat > 1 else ""
                    print(
                        f"compiling {program} of {workload} for {target}{again} ...",
                        file=sys.stderr,
                    )
                    runs.setdefault(program, []).append(run_child(target, workload, program))
            for program, figures in runs.items():
                rows.append(
                    {"target": target, "workload": workload, "program": program, **median(figures)}
                )
    rows = ratios(rows)
    if a.output == "json":
        print(json.dumps(rows, indent=1))
        return
    print(
        f"{'target':12} {'workload':9} {'program':12} {'ops':>7} {'fusions':>7} {'compile s':>9} "
        f"{'x ref':>6} {'args GiB':>8} {'temp GiB':>8} {'peak GiB':>8} {'x ref':>6}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['target']:12} {r['workload']:9} {r['program']:12} failed: {r['error']}")
            continue
        gib = 2**30
        xc = "" if r["x_ref_compile"] is None else f"{r['x_ref_compile']:.2f}"
        xp = "" if r["x_ref_peak"] is None else f"{r['x_ref_peak']:.2f}"
        print(
            f"{r['target']:12} {r['workload']:9} {r['program']:12} {r['ops']:7d} "
            f"{r['fusions']:7d} {r['compile_s']:9.1f} {xc:>6} {r['arguments'] / gib:8.2f} "
            f"{r['temporaries'] / gib:8.2f} {r['peak'] / gib:8.2f} {xp:>6}"
        )
    print("GPU figures: compiled without the GPU (no autotuning; XLA's heuristics chose kernels)")


if __name__ == "__main__":
    main()
