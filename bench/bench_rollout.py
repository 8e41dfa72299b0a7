"""Rollout seconds of the default run: rlctl's sampler against Tunix's, in one process.

The default run (SmolLM2-135M-Instruct, 2 arithmetic prompts x G=8, 48 new tokens)
samples each step's rollout twice on the same weights, prompts and seeds: once
the way the trainer did before rlctl had its own sampler (Tunix's sampler on the
P*G repeated prompts, its cache as ``Rollout.create`` sized it), once with
``rollout.Rollout`` (each prompt prefilled once, the group decoded from the shared
cache, stopped when every row has stopped). The two alternate within each step
so that load from other processes falls on both; the first step of each
compiles and is left out. Also times the greedy eval batch (16 prompts, one
completion each) both ways, and, to say where the time goes, a prefill-only call
(1 new token) of each.

``--against tunix-decode`` compares instead rlctl's two decode paths for Llama, on
the same sampler: weights first (``tunix_adapter.llama.decode``: projections as
[F, D] x [D, B] with the activations as columns, the KV cache as [B, K, S, H];
the default) against Tunix's own layers (``Sampler.weights_first = False``, as the
trainer decoded before it). Greedy completions must be identical.

``--against scan-layers`` compares rlctl's sampler (the CPU's row of the numerics table)
with the same row but its layers scanned (``tunix_adapter/llama/layers.py``: the prefill's
layers as one scanned body; the weights-first decode as it is), and ``--against
accelerator`` with the GPU's whole row (prefill and decode scanned through rlctl's
layers, not weights first): what the CPU would run with the accelerators' programs.
Greedy completions must be identical.

``--against vllm`` (in a venv with vLLM: .ci/vllm-cpu's lock) compares rlctl's sampler
with ``rollout.engine=vllm`` on the same weights, prompts and seeds (vLLM draws other
tokens from the same seed, so the sampled lengths differ; greedy ones should agree),
and adds the engine's start seconds, the weight push's seconds and the RSS the engine
adds to the process.

    python -m bench.bench_rollout --steps 8
    python -m bench.bench_rollout --steps 8 --against tunix-decode
    python -m bench.bench_rollout --steps 8 --against scan-layers
    .venvs/vllm/bin/python -m bench.bench_rollout --steps 8 --against vllm
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)


def setup() -> Any:
    from rlctl.core.config.models import RunSpec
    from rlctl.core.store.local import LocalRunStore
    from rlctl.core.trainer.run.loop import Trainer

    spec = RunSpec(name="bench", output={"root": tempfile.mkdtemp(), "tensorboard": False})
    t = Trainer(spec, LocalRunStore(spec.output.root).run("bench"))
    t.create_model()  # the default model: the embedded smollm2-135m-instruct
    t.create_data()
    return t


class Tunix:
    """The rollout as the trainer ran it on Tunix's sampler (the same weights: the
    sampler holds the model's arrays, no copy)."""

    def __init__(self, t: Any, max_new_tokens: int | None = None) -> None:
        from rlctl.core.trainer.rollout.rollout import BUCKET, round_up
        from tests.core.trainer import yardsticks

        r = t.spec.rollout
        self.t, self.yardsticks = t, yardsticks
        self.max_new = max_new_tokens or r.max_new_tokens
        cache = round_up(r.max_prompt_tokens, BUCKET) + r.max_new_tokens + BUCKET
        self.sampler = yardsticks.tunix_sampler(t.model, t.tokenizer, t.info, cache_size=cache)

    def __call__(self, problems: list[Any], seed: int, greedy: bool) -> list[list[int]]:
        r, rollout = self.t.spec.rollout, self.t.rollout
        G = 1 if greedy else r.num_generations
        prompts, width = rollout.render([p for p in problems for _ in range(G)])
        out = self.yardsticks.tunix_generate(
            self.sampler,
            prompts,
            max_new_tokens=self.max_new,
            max_prompt_tokens=width,
            eos_ids=self.t.tokenizer.eos_ids,
            temperature=None if greedy else r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            seed=seed,
        )
        return [[int(x) for x in tok] for tok in out.tokens]


class Rlctl:
    """The trainer's rollout now (``Rollout.sample``)."""

    def __init__(
        self,
        t: Any,
        max_new_tokens: int | None = None,
        weights_first: bool = True,
        numerics: Any = None,
    ) -> None:
        from rlctl.core.trainer.rollout.rollout import Rollout

        self.rollout = t.rollout
        if max_new_tokens or not weights_first or numerics is not None:
            spec = t.spec.rollout.model_copy(
                update={"max_new_tokens": max_new_tokens or t.spec.rollout.max_new_tokens}
            )
            self.rollout = Rollout.create(
                spec,
                t.model,
                t.tokenizer,
                t.info,
                compute_dtype=t.precision.sampling,
                numerics=numerics or t.numerics,
            )
            self.rollout.probe_len = t.rollout.probe_len
            if not weights_first:
                self.rollout.sampler.weights_first = False

    def __call__(self, problems: list[Any], seed: int, greedy: bool) -> list[list[int]]:
        prompts, width = self.rollout.render(problems)
        out = self.rollout.sample(prompts, width, seed=seed, greedy=greedy)
        return [[int(x) for x in tok] for tok in out.tokens]


class Vllm(Rlctl):
    """``rollout.engine=vllm``: vLLM sampling the trainer's weights (pushed, not loaded)."""

    def __init__(self, t: Any, max_new_tokens: int | None = None) -> None:
        from rlctl.core.trainer.model.models import resolve_model_dir
        from rlctl.core.trainer.rollout.rollout import Rollout
        from rlctl.core.trainer.rollout.vllm_engine import VllmSampler

        r = t.spec.rollout.model_copy(
            update={"max_new_tokens": max_new_tokens or t.spec.rollout.max_new_tokens}
        )
        rss0 = rss_bytes()
        self.engine = VllmSampler(
            t.model,
            resolve_model_dir(t.spec.model.source),
            pad_id=t.tokenizer.pad_id(),
            eos_ids=t.tokenizer.eos_ids,
            max_new_tokens=r.max_new_tokens,
            max_len=r.max_prompt_tokens + r.max_new_tokens,
            dtype=t.spec.model.dtype,
            filtered=False,
        )
        self.added_rss = rss_bytes() - rss0
        self.rollout = Rollout(r, t.tokenizer, self.engine, t.spec.prompt)
        self.rollout.probe_len = t.rollout.probe_len

    def pushes(self, model: Any, n: int = 5) -> list[float]:
        out = []
        for _ in range(n):
            self.engine.sync(model)
            out.append(self.engine.last_push.seconds)
        return out


def rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def timed(fn: Callable[..., list[list[int]]], *args: Any) -> tuple[float, list[list[int]]]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def compare(
    paths: dict[str, Any], batches: list[list[Any]], seeds: list[int], greedy: bool
) -> dict[str, dict[str, Any]]:
    """Each path on each batch, alternating which goes first; batch 0 only warms up."""
    seconds: dict[str, list[float]] = {n: [] for n in paths}
    lengths: dict[str, list[int]] = {n: [] for n in paths}
    outs: dict[str, list[list[list[int]]]] = {n: [] for n in paths}
    for k, (problems, seed) in enumerate(zip(batches, seeds, strict=True)):
        order = list(paths) if k % 2 else list(reversed(paths))
        for name in order:
            s, tokens = timed(paths[name], problems, seed, greedy)
            if k:  # batch 0 compiled
                seconds[name].append(s)
                lengths[name].extend(len(t) for t in tokens)
                outs[name].append(tokens)
    result = {}
    for name in paths:
        med = statistics.median(seconds[name])
        # completion tokens, the stop token not counted (as both samplers return them)
        generated = sum(lengths[name]) / len(seconds[name])
        result[name] = {
            "median_seconds": round(med, 3),
            "seconds": [round(s, 3) for s in seconds[name]],
            "tokens_per_s": round(generated / statistics.mean(seconds[name]), 1),
            "mean_completion_tokens": round(statistics.mean(lengths[name]), 2),
        }
    if greedy:
        a, b = (outs[n] for n in paths)
        same = sum(x == y for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True))
        result["greedy_completions_identical"] = f"{same}/{sum(len(x) for x in a)}"
    return result


def main() -> None:
    from rlctl.core.trainer.rollout.rollout import step_seed

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8, help="measured steps (after 1 warm-up)")
    ap.add_argument(
        "--against",
        choices=["tunix", "tunix-decode", "scan-layers", "accelerator", "vllm"],
        default="tunix",
        help="tunix: Tunix's sampler; tunix-decode: rlctl's sampler decoding "
        "Llama through Tunix's layers instead of weights first; "
        "scan-layers: the prefill's layers scanned; accelerator: the "
        "GPU's row of the numerics table; vllm: rollout.engine=vllm "
        "(needs vLLM installed)",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    t = setup()
    s = t.spec
    P, n = s.training.prompts_per_step, args.steps + 1
    train = [t.source.batch(k, P) for k in range(n)]
    seeds = [step_seed(s.training.seed, k, 4) for k in range(n)]
    name = args.against if args.against in ("vllm", "scan-layers", "accelerator") else "tunix"

    def base(max_new: int | None = None) -> Any:
        import dataclasses

        from rlctl.core.trainer.runtime.numerics import TABLE

        if args.against == "tunix":
            return Tunix(t, max_new)
        if args.against == "vllm":
            return Vllm(t, max_new)
        if args.against == "scan-layers":
            return Rlctl(t, max_new, numerics=dataclasses.replace(t.numerics, scan_layers=True))
        if args.against == "accelerator":
            return Rlctl(t, max_new, numerics=TABLE["gpu"])
        return Rlctl(t, max_new, weights_first=False)

    baseline = base()
    paths = {name: baseline, "rlctl": Rlctl(t)}
    rollout = compare(paths, train, seeds, greedy=False)
    evals = [t.source.eval_set[: s.eval.batch_size]] * n
    greedy = compare(paths, evals, [0] * n, greedy=True)
    # where the time goes: the same calls with 1 new token are (almost) prefill alone
    prefill = compare({name: base(1), "rlctl": Rlctl(t, 1)}, train[:4], seeds[:4], greedy=False)
    out = {
        "baseline": f"{name}: "
        + {
            "tunix": "Tunix's sampler",
            "tunix-decode": "rlctl's sampler through Tunix's layers",
            "scan-layers": "rlctl's sampler, its prefill scanned",
            "accelerator": "the GPU's row of the numerics table",
            "vllm": "rollout.engine=vllm",
        }[args.against],
        "setup": f"{s.model.source}, {P} prompts x G={s.rollout.num_generations}, "
        f"{s.rollout.max_new_tokens} new tokens, {args.steps} steps after 1 warm-up",
        "rollout": rollout,
        "rollout_speedup": round(
            rollout[name]["median_seconds"] / rollout["rlctl"]["median_seconds"], 2
        ),
        "greedy_eval_16": greedy,
        "greedy_eval_speedup": round(
            greedy[name]["median_seconds"] / greedy["rlctl"]["median_seconds"], 2
        ),
        "prefill_only_1_token": {k: v["median_seconds"] for k, v in prefill.items()},
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    if args.against == "vllm":
        pushes = baseline.pushes(t.model)
        out["vllm_engine"] = {
            "start_seconds": round(baseline.engine.start_seconds, 2),
            "weight_push_seconds_median": round(statistics.median(pushes), 3),
            "tensors_pushed": baseline.engine.last_push.tensors,
            "rss_added_gib": round(baseline.added_rss / 2**30, 2),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
