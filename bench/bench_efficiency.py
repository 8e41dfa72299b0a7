"""How close the default run's rollout and update come to this machine's own limits,
both measured in the same process.

rollout: the sampler decodes the default batch (2 prompts x G=8) with its stop
tokens disabled, once for 1 new token and once for ``--new-tokens``; the
difference over the extra tokens is the time of one decode step. Each step reads
the sampler's weights once and the whole KV cache once (the attention reads every
slot, masked or not), so bytes per decoded token / seconds per token is the
achieved bandwidth, printed against this machine's streaming-read bandwidth (the
faster of a jitted and a numpy sum over 1 GiB of float32). Its FLOPs (a multiply-add
per row per weight, the attention's two products over every slot) per byte read say
which limit binds: above this machine's matmul rate per byte of bandwidth (in the
sampler's dtype), no decode of this batch could stream at full bandwidth, and the
bench prints the most of it that one could use with its matmuls at that rate. Then
it times the step's products alone (every projection and the head, laid out and
multiplied as the decode does, one after another) for the batch's rows and for a
quarter of them: on a 2-core Zen 4 in bfloat16 they took about the same time at 4
rows as at 16 (22.9 and 24.5 ms), so neither FLOPs nor bandwidth bind them but the
rate at which XLA:CPU's (YNNPACK's) dot kernel streams weights this thin: 11 GB/s,
0.39x the bandwidth. No decode step through that kernel can read its weights faster,
which is why issue #27's goal of 0.5x is not reached (docs/benchmarks.md "The rollout against
the bandwidth").

update: the default run's compiled update on one real rollout, timed over
``--repeats`` calls after its compile; XLA's cost analysis of the program gives
its FLOPs (the recomputation of ``training.remat`` included), and "useful" FLOPs
are 6 x parameters x tokens (the prompts once per group, the completions), printed
as GFLOP/s against this machine's float32 matmul rate (the faster of a jitted and
a numpy 2048^3 dot).

    python -m bench.bench_efficiency
    python -m bench.bench_efficiency --set model.compute_dtype=bfloat16
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python -m bench.bench_efficiency
    python -m bench.bench_efficiency --only rollout -o /tmp/efficiency.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)


def _timed(fn: Any, *args: Any, n: int) -> float:
    """Median seconds of ``n`` calls of ``fn`` after one warm-up call."""
    import jax

    jax.block_until_ready(fn(*args))
    seconds = []
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def read_bandwidth(gib: float = 1.0) -> float:
    """Bytes per second of the faster of a jitted sum and numpy's sum over ``gib`` GiB of
    float32: XLA's reduction is threaded by YNNPACK, whose use ``XLA_FLAGS`` can turn
    off (then 3.5-4.4 GB/s against 10.5 here), and the limit must not move with it."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    x = jnp.ones((int(gib * 2**30) // 4,), jnp.float32)
    xla = _timed(jax.jit(lambda a: a.sum()), x, n=5)
    host = np.ones(x.shape, np.float32)
    numpy = min(_timed(lambda: host.sum(), n=1) for _ in range(3))
    return x.nbytes / min(xla, numpy)


def matmul_rate(n: int = 2048, dtype: str = "float32") -> float:
    """FLOP/s of the faster of a jitted and a numpy (OpenBLAS) float32 n x n x n dot: as
    for the bandwidth, a flag that changes XLA's kernels must not move the limit. For
    ``bfloat16``: XLA's dot of bfloat16 inputs summed in float32 (the run's narrow
    products, tunix_adapter/mixed.py); numpy has none."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    if dtype != "float32":
        b = a.astype(dtype)
        narrow = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
        return 2 * n**3 / _timed(narrow, b, b, n=5)
    xla = _timed(jax.jit(lambda x, y: x @ y), a, a, n=5)
    host = np.asarray(a)
    numpy = min(_timed(lambda: host @ host, n=1) for _ in range(3))
    return 2 * n**3 / min(xla, numpy)


def trainer(overrides: list[str]) -> Any:
    """The default run's trainer (model, data, rollout, update) with ``overrides``."""
    from rlctl.core.config.load import build
    from rlctl.core.config.models import RunSpec
    from rlctl.core.store.local import LocalRunStore
    from rlctl.core.trainer.run.loop import Trainer

    root = tempfile.mkdtemp()
    spec = build(
        RunSpec,
        {"name": "bench", "output": {"root": root, "tensorboard": False}, "eval": {"size": 0}},
        overrides,
    )
    t = Trainer(spec, LocalRunStore(root).run("bench"))
    t.create_model()
    t.create_data()
    t.create_optimizer()
    t.create_steps()
    return t


def tree_bytes(tree: Any) -> int:
    import jax

    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "dtype"))


def decode_figures(t: Any, new_tokens: int, repeats: int) -> dict[str, Any]:
    """Seconds and bytes of one decode step of the trainer's sampler."""
    import jax

    from rlctl.core.trainer.rollout.sampler import left_pad
    from rlctl.core.trainer.tunix_adapter.llama import decode

    r, sampler = t.rollout, t.rollout.sampler
    problems = t.source.batch(0, t.spec.training.prompts_per_step)
    prompts, width = r.render(problems)
    ids = left_pad([t.tokenizer.encode(p) for p in prompts], width, t.tokenizer.pad_id())
    G = t.spec.rollout.num_generations
    eos, steps = sampler.eos_ids, sampler.max_new_tokens
    sampler.eos_ids = (-1,)  # never emitted: every call decodes all its tokens
    try:
        seconds = {}
        for n in (1, new_tokens):
            sampler.max_new_tokens = n

            def call(seed: int = 0) -> Any:
                return sampler(ids, group=G, seed=seed, temperature=t.spec.rollout.temperature)

            seconds[n] = _timed(call, n=repeats)
    finally:
        sampler.eos_ids, sampler.max_new_tokens = eos, steps
    per_token = (seconds[new_tokens] - seconds[1]) / (new_tokens - 1)
    if per_token <= 0:  # the calls' noise is larger than the extra tokens' decode
        many, one = seconds[new_tokens], seconds[1]
        raise SystemExit(
            f"{new_tokens} new tokens took no longer than 1 ({many:.4f} s vs "
            f"{one:.4f} s): too few to measure a decode step here; "
            "raise --new-tokens or --repeats"
        )
    info = sampler.info  # what the sampler reads (rollout.compute_dtype resolved)
    rows, slots = ids.shape[0] * G, width + new_tokens
    cache_dtype = getattr(sampler, "cache_dtype", None) or info.dtype
    import numpy as np

    # weights first (decode.py), a group's rows read its prompt's slots as one copy
    shared = getattr(sampler, "weights_first", False) and decode.fits(t.model, info)
    if hasattr(sampler, "weight_bytes"):
        weights = sampler.weight_bytes()
        products = weights // np.dtype(info.compute_dtype).itemsize
    elif shared:  # what a decode step reads: decode.weights in the compute dtype, but the
        # embedding, of which it reads a row per row (a tied head is counted as the head)
        laid = decode.weights(t.model, info.compute_dtype)
        weights = tree_bytes({k: v for k, v in laid.items() if k != "emb"})
        products = sum(w.size for w, _ in multiplied(laid, info.compute_dtype))
        del laid
    else:
        weights = tree_bytes(sampler.state)
        products = sum(x.size for x in jax.tree.leaves(sampler.state))
    read = ids.shape[0] * width + rows * new_tokens if shared else rows * slots
    heads = getattr(getattr(t.model, "config", None), "num_heads", info.num_kv_heads)
    cache = (
        2
        * info.num_layers
        * read
        * info.num_kv_heads
        * info.head_dim
        * np.dtype(cache_dtype).itemsize
    )
    return {
        "rows": rows,
        "cache_slots": slots,
        "prompts": int(ids.shape[0]),
        "compute_dtype": info.compute_dtype,
        "prompt_slots": width,
        "shared_prompt_slots": bool(shared),
        "prefill_seconds": round(seconds[1], 3),
        "seconds_per_token": per_token,
        "weight_bytes": weights,
        "cache_bytes": cache,
        "bytes_per_token": weights + cache,
        # a multiply-add per row per weight, and the attention's two products over
        # every slot (as the bytes count them: read, masked or not)
        "flops_per_token": 2 * rows * products
        + 4 * info.num_layers * rows * heads * info.head_dim * slots,
    }


def multiplied(laid: dict[str, Any], dtype: str) -> list[tuple[Any, bool]]:
    """The weights a decode step multiplies by (``decode.weights`` laid out in
    ``dtype``): every layer's projections and the head, not the norms, each with
    whether it is taken rows first (narrow, the output projection is:
    ``decode._out_projection``)."""
    from rlctl.core.trainer.tunix_adapter.mixed import narrow

    keys = ("qkv", "o", "gu", "down")
    return [(lw[k], narrow(dtype) and k == "o") for lw in laid["layers"] for k in keys] + [
        (laid["head"], False)
    ]


def decode_products(t: Any) -> tuple[Any, list[Any], Any]:
    """A decode step's products alone, as a jitted program over (weights, inputs):
    every layer's projections and the head, laid out and multiplied as
    ``decode.step`` does (``decode.weights``, the sampler's dtype), one after
    another. Returns the program, its weights and ``inputs(rows)``."""
    import jax
    import jax.numpy as jnp

    from rlctl.core.trainer.tunix_adapter.llama import decode
    from rlctl.core.trainer.tunix_adapter.mixed import dot

    dtype = t.rollout.sampler.info.compute_dtype
    mats, rows_first = map(
        list, zip(*multiplied(decode.weights(t.model, dtype), dtype), strict=True)
    )
    # each product's input: [rows, K] rows first, [K, rows] weights first
    shapes = sorted(
        {
            (w.shape[0], True) if first else (w.shape[1], False)
            for w, first in zip(mats, rows_first, strict=True)
        }
    )

    @jax.jit
    def products(mats: list[Any], inputs: dict[tuple[int, bool], Any]) -> Any:
        y, total = jnp.zeros((1, 1), jnp.float32), jnp.zeros((), jnp.float32)
        for w, first in zip(mats, rows_first, strict=True):
            # each product waits for the one before, as in a decode step, and counts
            x, y = jax.lax.optimization_barrier(
                (inputs[(w.shape[0], True) if first else (w.shape[1], False)], y)
            )
            total = total + y[0, 0]
            y = dot(x, w, dtype) if first else dot(w, x, dtype)
        return total + y[0, 0]

    def inputs(rows: int) -> dict[tuple[int, bool], Any]:
        return {
            (k, first): jnp.ones((rows, k) if first else (k, rows), jnp.float32)
            for k, first in shapes
        }

    return products, mats, inputs


def product_figures(t: Any, rows: int, repeats: int) -> dict[str, Any]:
    """Seconds of a decode step's products alone (``decode_products``) for ``rows``
    columns and for a quarter of them. Why: if they take as long at a quarter of the
    rows, neither the FLOPs nor the bandwidth bind them but the rate at which the
    dot kernel (XLA:CPU's: YNNPACK's) streams weights this thin."""
    products, mats, inputs = decode_products(t)
    quarter = max(1, rows // 4)
    seconds = {n: _timed(products, mats, inputs(n), n=3 * repeats) for n in (rows, quarter)}
    return {
        "product_bytes": sum(w.nbytes for w in mats),
        "product_seconds": seconds[rows],
        "quarter_rows": quarter,
        "product_seconds_quarter_rows": seconds[quarter],
    }


def rollout_batch(t: Any) -> Any:
    """The update's batch from one rollout of the run's first prompts (fixed seed)."""
    from rlctl.core.trainer.rollout.rollout import score, step_seed

    s = t.spec
    problems = t.source.batch(0, s.training.prompts_per_step)
    prompts, width = t.rollout.render(problems)
    out = t.rollout.sample(prompts, width, seed=step_seed(s.training.seed, 0, 4))
    group = [p for p in problems for _ in range(s.rollout.num_generations)]
    return t.rollout.batch(out, score(t.reward_fns, out.text, group, out.tokens))


def update_figures(t: Any, repeats: int) -> dict[str, Any]:
    """Seconds, XLA's FLOPs and the useful FLOPs of the compiled update."""
    batch = rollout_batch(t)
    compiled, size = t.update.program(t.model, t.optimizer, batch)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    seconds = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        loss, _, _ = t.update.train_step(t.model, t.optimizer, batch)
        float(loss)
        seconds.append(time.perf_counter() - t0)
    med = statistics.median(seconds[1:])
    from flax import nnx

    params = sum(x.size for x in __import__("jax").tree.leaves(nnx.state(t.model, nnx.Param)))
    tokens = batch.prompt_ids.size + batch.completion_ids.size
    return {
        "sequences": int(batch.completion_ids.shape[0]),
        "micro_batch": size,
        "tokens": int(tokens),
        "seconds": med,
        "xla_flops": float(cost.get("flops", 0.0)),
        "useful_flops": 6.0 * params * tokens,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a run spec override, as rlctl train --set",
    )
    ap.add_argument("--only", choices=["rollout", "update"])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-o", "--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    t = trainer(args.sets)
    out: dict[str, Any] = {"sets": args.sets}
    if args.only != "update":
        bw = read_bandwidth()
        d = decode_figures(t, args.new_tokens, args.repeats)
        achieved = d["bytes_per_token"] / d["seconds_per_token"]
        # which limit binds: a step's FLOPs per byte read against this machine's matmul
        # rate per byte of bandwidth in the sampler's dtype (above it, no decode of
        # this batch can stream at full bandwidth: the matmuls take longer)
        dtype = d["compute_dtype"]
        rate = matmul_rate(dtype=dtype)
        flops = d["flops_per_token"] / d["seconds_per_token"]
        intensity, balance = d["flops_per_token"] / d["bytes_per_token"], rate / bw
        out["rollout"] = {
            **d,
            "read_bandwidth_GBps": round(bw / 1e9, 2),
            "achieved_GBps": round(achieved / 1e9, 2),
            "fraction_of_bandwidth": round(achieved / bw, 3),
            "tokens_per_s": round(d["rows"] / d["seconds_per_token"], 1),
            "matmul_GFLOPs": round(rate / 1e9, 1),
            "achieved_GFLOPs": round(flops / 1e9, 1),
            "fraction_of_matmul_rate": round(flops / rate, 3),
            "flops_per_byte": round(intensity, 2),
            "machine_flops_per_byte": round(balance, 2),
            # the most of the bandwidth a step could use with its
            # matmuls at this machine's rate
            "bandwidth_ceiling": round(min(1.0, balance / intensity), 3),
        }
        print(
            f"rollout: {d['rows']} rows x {d['cache_slots']} slots: "
            f"{d['seconds_per_token'] * 1e3:.1f} ms per decode step, "
            f"{d['bytes_per_token'] / 1e6:.0f} MB read per step "
            f"(weights {d['weight_bytes'] / 1e6:.0f}, cache {d['cache_bytes'] / 1e6:.0f}): "
            f"{achieved / 1e9:.2f} GB/s = {achieved / bw:.2f} x this machine's "
            f"{bw / 1e9:.1f} GB/s read bandwidth",
            flush=True,
        )
        print(
            f"  {d['flops_per_token'] / 1e9:.2f} GFLOP per step, {intensity:.1f} FLOP/byte "
            f"(this machine: {balance:.1f} at its {rate / 1e9:.0f} GFLOP/s {dtype} matmul): "
            f"{flops / 1e9:.0f} GFLOP/s = {flops / rate:.2f} x that rate; with its matmuls "
            f"at that rate a step could use at most "
            f"{min(1.0, balance / intensity):.2f} x the bandwidth",
            flush=True,
        )
    if args.only != "update" and d["shared_prompt_slots"]:  # decode.py's step (Llama)
        p = product_figures(t, d["rows"], args.repeats)
        streamed = p["product_bytes"] / p["product_seconds"]
        # a quarter of the FLOPs in more than 0.8x the time: not the FLOPs
        thin = p["product_seconds_quarter_rows"] > 0.8 * p["product_seconds"]
        verdict = (
            "about as long: the dot kernel streams weights this thin at"
            if thin
            else "faster: their FLOPs bind them; they stream at"
        )
        out["rollout"].update(
            {
                **p,
                "product_GBps": round(streamed / 1e9, 2),
                "product_fraction_of_bandwidth": round(streamed / bw, 3),
                "product_bound_by": "streaming" if thin else "flops",
                "product_share_of_step": round(p["product_seconds"] / d["seconds_per_token"], 3),
            }
        )
        print(
            f"  its products alone (projections and head, {p['product_bytes'] / 1e6:.0f} MB): "
            f"{p['product_seconds'] * 1e3:.1f} ms for {d['rows']} rows "
            f"({p['product_seconds'] / d['seconds_per_token']:.2f} of the step), "
            f"{p['product_seconds_quarter_rows'] * 1e3:.1f} ms for {p['quarter_rows']} "
            f"({verdict} {streamed / 1e9:.1f} GB/s = {streamed / bw:.2f} x the bandwidth)",
            flush=True,
        )
    if args.only != "rollout":
        # the limit is the rate of the dtype the run's matmuls read: bfloat16's where
        # mixed precision runs (the faster one, so the harder yardstick)
        dtype = t.info.compute_dtype
        f32_rate = matmul_rate()
        rate = f32_rate if dtype == "float32" else matmul_rate(dtype=dtype)
        u = update_figures(t, args.repeats)
        xla, useful = u["xla_flops"] / u["seconds"], u["useful_flops"] / u["seconds"]
        out["update"] = {
            **u,
            "compute_dtype": dtype,
            "matmul_GFLOPs": round(rate / 1e9, 1),
            "float32_matmul_GFLOPs": round(f32_rate / 1e9, 1),
            "xla_GFLOPs": round(xla / 1e9, 1),
            "useful_GFLOPs": round(useful / 1e9, 1),
            "fraction_of_matmul_rate": round(xla / rate, 3),
            "useful_fraction_of_matmul_rate": round(useful / rate, 3),
        }
        print(
            f"update: {u['sequences']} sequences, {u['tokens']} tokens: {u['seconds']:.2f} s, "
            f"{xla / 1e9:.0f} GFLOP/s by XLA's count ({useful / 1e9:.0f} useful) = "
            f"{xla / rate:.2f} x ({useful / rate:.2f} x) this machine's "
            f"{rate / 1e9:.0f} GFLOP/s {dtype} matmul (float32: {f32_rate / 1e9:.0f})",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
