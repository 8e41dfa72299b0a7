"""The update alone, rlctl's against a yardstick, taking turns in one process.

Each yardstick is the run's row of the numerics table (rlctl/core/trainer/runtime/numerics.py)
with one choice changed, passed to a second ``Update``. Both updates are compiled for
the same batch (one rollout of the default run's first
prompts) and then called in turn, ``--repeats`` times each, on the same model and
optimizer, so the machine's drift (here +-20% from minute to minute) falls on both
alike. Prints each one's median seconds after its first call and the ratio.

  --against jax-mlp-grad  JAX's own differentiation of Tunix's MLP
                          (tunix_adapter/llama/mlp_grad.py is what rlctl runs)
  --against ynn-reduce    XLA:CPU's default YNNPACK fusions, reductions included
                          (compiles.update_options is what rlctl compiles with)
  --against scan-layers   the layers as one scanned body (tunix_adapter/llama/layers.py: the
                          accelerators' choice; the CPU's row unrolls them)
  --against accelerator   the GPU's whole row of the numerics table (numerics.TABLE):
                          scanned layers, none of the CPU's tricks
  --against whole-grid    the MLPs and the head on every completion position, pads
                          included (tunix_adapter/llama/compaction.py skips them)
  --against whole-head    the vocabulary head alone on every completion position
                          (compaction.head_logps projects the masked-in ones)
  --against remat-all     every layer recomputed in the backward pass (training.remat=true;
                          rlctl's CPU default keeps a quarter of them: step._remat_levels)
  --against no-remat      no layer recomputed (training.remat=false), the whole batch
                          (run it with RLCTL_MEMORY_LIMIT=8GB: it needs about 3.1 GiB)
  --against float32       every matmul in float32 (model.compute_dtype=float32;
                          rlctl runs the run's own: --set model.compute_dtype=bfloat16
                          to time the narrow one, as auto picks on a GPU or TPU)

    python -m bench.bench_update --against jax-mlp-grad --repeats 6
    python -m bench.bench_update --against float32 --set model.compute_dtype=bfloat16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

from bench.bench_efficiency import rollout_batch, trainer

# what each yardstick changes in the run's row of the numerics table
CHANGES: dict[str, dict[str, Any]] = {
    "jax-mlp-grad": {"own_mlp_gradient": False},
    "ynn-reduce": {"xla_cpu_options": False},
    "whole-grid": {"pack_mlp_rows": False, "pack_head": False},
    "whole-head": {"pack_head": False},
    "scan-layers": {"scan_layers": True},
}


def yardstick_numerics(row: Any, against: str) -> Any:
    """The numerics row the yardstick ``against`` compiles with."""
    from rlctl.core.trainer.runtime.numerics import TABLE

    if against == "accelerator":
        return TABLE["gpu"]
    return dataclasses.replace(row, **CHANGES.get(against, {}))


def yardstick_update(t: Any, against: str, batch: Any) -> Any:
    """A second ``Update`` of the run, compiled as ``against`` says."""
    from rlctl.core.trainer.update.step import Update

    info = (
        dataclasses.replace(t.info, compute_dtype="float32") if against == "float32" else (t.info)
    )
    u = Update.create(
        t.spec, t.tokenizer.pad_id(), info, numerics=yardstick_numerics(t.update.numerics, against)
    )
    if against in ("no-remat", "remat-all"):  # the whole batch, so that only this differs
        u.remat, u.micro = against == "remat-all", int(batch.completion_ids.shape[0])
    u.program(t.model, t.optimizer, batch)  # traced and compiled now
    return u


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--against",
        choices=[*CHANGES, "accelerator", "float32", "no-remat", "remat-all"],
        required=True,
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a run spec override, as rlctl train --set",
    )
    ap.add_argument("-o", "--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    t = trainer(args.sets)
    batch = rollout_batch(t)
    compile_s: dict[str, float] = {}
    t0 = time.perf_counter()
    t.update.program(t.model, t.optimizer, batch)
    compile_s["rlctl"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    updates = {"rlctl": t.update, args.against: yardstick_update(t, args.against, batch)}
    compile_s[args.against] = time.perf_counter() - t0
    from rlctl.core.trainer.runtime import memory

    need = {
        name: memory.compiled_need(u.program(t.model, t.optimizer, batch)[0])
        for name, u in updates.items()
    }
    seconds: dict[str, list[float]] = {name: [] for name in updates}
    for _ in range(args.repeats + 1):
        for name, u in updates.items():
            t0 = time.perf_counter()
            loss, _, _ = u.train_step(t.model, t.optimizer, batch)
            float(loss)
            seconds[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(s[1:]) for name, s in seconds.items()}
    out = {
        "against": args.against,
        "sequences": int(batch.completion_ids.shape[0]),
        "completion_tokens": int(batch.mask.sum()),
        "completion_grid": int(batch.mask.size),
        "seconds": seconds,
        "median_seconds": med,
        "compile_seconds": compile_s,
        "temporaries_bytes": need,
        "ratio": med["rlctl"] / med[args.against],
    }
    print(
        f"update of {out['sequences']} sequences ({out['completion_tokens']} of "
        f"{out['completion_grid']} completion positions real), median of {args.repeats} "
        "calls each after "
        f"the first: rlctl {med['rlctl']:.2f} s, {args.against} {med[args.against]:.2f} s: "
        f"{out['ratio']:.2f}x the time; compiled in {compile_s['rlctl']:.0f} s and "
        f"{compile_s[args.against]:.0f} s; XLA's temporaries {need['rlctl'] / 2**30:.2f} "
        f"and {need[args.against] / 2**30:.2f} GiB; rlctl's matmuls read "
        f"{t.info.compute_dtype}",
        flush=True,
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
