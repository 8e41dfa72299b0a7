"""Temporaries of the compiled update, from XLA's own memory analysis, against the
whole-batch, whole-logits update rlctl used before.

Nothing runs and no weights load: the update of a model of the given shape is
compiled ahead of time on abstract arrays, and ``memory_analysis()`` reports
what it would allocate. The baseline row is the same update with the
vocabulary-sized log-softmax in one piece and no micro-batches (the pre-chunking
program); the other rows chunk the log-softmax and cut the batch into
micro-batches of the given sizes. The row marked ``auto`` is what a run on this
machine picks (``training.micro_batch_size`` unset: the largest that fits half the
free memory).

    python -m bench.bench_update_memory                       # 16 x 8 x (160 + 256)
    python -m bench.bench_update_memory --prompts 2 --new-tokens 48 --prompt-tokens 160

With ``--lora-rank R`` it compares instead the whole update's peak (the state it
holds: parameters and optimizer moments, plus gradients and temporaries) of LoRA
adapters of rank R on every projection against full fine-tuning, both in
micro-batches of ``--lora-micro`` sequences (the same activations):

    python -m bench.bench_update_memory --shape llama-3.2-1b --lora-rank 16
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from importlib.util import find_spec

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

# config.json fields of the shapes people train (random weights are enough: only
# shapes matter to the compiler)
SHAPES = {
    "smollm2-135m": dict(
        num_hidden_layers=30,
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "smollm2-360m": dict(
        num_hidden_layers=32,
        vocab_size=49152,
        hidden_size=960,
        intermediate_size=2560,
        num_attention_heads=15,
        num_key_value_heads=5,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        num_hidden_layers=16,
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}


def abstract_state(shape: str, dtype: str, lora_rank: int | None = None):
    """(graphdef, abstract (model, optimizer) state, ModelInfo) of a model shape; with
    ``lora_rank``, of adapters of that rank on every projection of the model."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from tunix.models.llama3 import model as llama

    from rlctl.core.config.models import RunSpec, TrainingSpec
    from rlctl.core.families import FAMILIES
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.update.step import make_optimizer

    c = SHAPES[shape]
    config = ta.build_config(FAMILIES["llama"], c)
    jdtype = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32

    training = (
        TrainingSpec() if lora_rank is None else RunSpec(training={"lora_rank": lora_rank}).training
    )

    def build():
        model = llama.Llama3(config, rngs=nnx.Rngs(0))
        if jdtype != jnp.float32:
            state = jax.tree.map(lambda x: x.astype(jdtype), nnx.state(model, nnx.Param))
            nnx.update(model, state)
        if lora_rank is not None:
            from rlctl.core.trainer.tunix_adapter.lora import apply_lora

            model = apply_lora(model, "llama", training)
        return model, make_optimizer(model, training)

    model, optimizer = nnx.eval_shape(build)
    graphdef, state = nnx.split((model, optimizer))
    n = sum(
        x.size
        for x in jax.tree.leaves(nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))))
    )
    info = ta.ModelInfo(
        family="llama",
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        vocab_size=config.vocab_size,
        params=n,
        dtype=dtype,
    )
    return graphdef, state, info


def temporaries(update, graphdef, state, batch, size: int) -> tuple[int, int, float]:
    """(temporaries, what a run checks against free memory, compile seconds)."""
    import jax

    from rlctl.core.trainer.runtime import memory

    t0 = time.perf_counter()
    compiled = (
        jax.jit(update._step_fn(graphdef, size), donate_argnums=0).lower(state, batch).compile()
    )
    return (
        compiled.memory_analysis().temp_size_in_bytes,
        memory.compiled_need(compiled),
        time.perf_counter() - t0,
    )


def peak(update, graphdef, state, batch, size: int) -> tuple[int, int, int, float]:
    """(peak bytes of the compiled update: its state and batch plus what it allocates
    beyond them; the state's bytes; temporaries; compile seconds)."""
    import jax

    t0 = time.perf_counter()
    compiled = (
        jax.jit(update._step_fn(graphdef, size), donate_argnums=0).lower(state, batch).compile()
    )
    ma = compiled.memory_analysis()
    held = ma.argument_size_in_bytes
    return (
        held + ma.temp_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes,
        sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)),
        ma.temp_size_in_bytes,
        time.perf_counter() - t0,
    )


def abstract_batch(a):
    """One step's batch of the command line's shape, as abstract arrays."""
    import jax
    import jax.numpy as jnp

    from rlctl.core.trainer.rollout.rollout import Batch

    rows = a.prompts * a.group
    return Batch(
        prompt_ids=jax.ShapeDtypeStruct((a.prompts, a.prompt_tokens), jnp.int32),
        completion_ids=jax.ShapeDtypeStruct((rows, a.new_tokens), jnp.int32),
        mask=jax.ShapeDtypeStruct((rows, a.new_tokens), jnp.int32),
        advantages=jax.ShapeDtypeStruct((rows,), jnp.float32),
    )


def lora_against_full(a) -> None:
    """The LoRA update's peak against full fine-tuning's, same batch and micro-batches."""

    from rlctl.core.config.models import RunSpec
    from rlctl.core.trainer.update.step import Update
    from rlctl.core.units import human_bytes

    rows = a.prompts * a.group
    batch = abstract_batch(a)
    remat = {"auto": None, "on": True, "off": False}[a.remat]
    size = min(a.lora_micro, rows)
    print(
        f"{a.shape} ({a.dtype}), {a.prompts} prompts x {a.group} completions x "
        f"({a.prompt_tokens} + {a.new_tokens}) tokens, micro-batches of {size}"
    )
    print(
        f"{'update':34} {'params':>8} {'state':>10} {'temporaries':>12} {'peak':>10} "
        f"{'x full':>7} {'compile s':>9}"
    )
    full = None
    for rank in (None, a.lora_rank):
        graphdef, state, info = abstract_state(a.shape, a.dtype, rank)
        spec = RunSpec(
            rollout={"num_generations": a.group, "max_new_tokens": a.new_tokens},
            training={"prompts_per_step": a.prompts, "remat": remat, "lora_rank": rank},
        )
        update = Update(spec, pad_id=0, info=info)
        top, held, temp, secs = peak(update, graphdef, state, batch, size)
        full = full or top
        label = "full fine-tuning" if rank is None else f"LoRA rank {rank}, all projections"
        print(
            f"{label:34} {info.params / 1e6:7.0f}M {human_bytes(held):>10} "
            f"{human_bytes(temp):>12} {human_bytes(top):>10} {top / full:7.2f} {secs:9.1f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("-G", "--group", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=160)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--sizes", default="", help="micro-batch sizes, e.g. 64,16,8")
    p.add_argument(
        "--remat",
        choices=["auto", "on", "off"],
        default="auto",
        help="training.remat of the micro-batch rows (the baseline has none)",
    )
    p.add_argument(
        "--lora-rank",
        type=int,
        default=None,
        help="compare a LoRA update of this rank against full fine-tuning",
    )
    p.add_argument(
        "--lora-micro",
        type=int,
        default=8,
        help="micro-batch size of both updates in the --lora-rank comparison",
    )
    a = p.parse_args()
    if a.lora_rank is not None:
        lora_against_full(a)
        return

    from rlctl.core.config.models import RunSpec, micro_batch_sizes
    from rlctl.core.trainer.runtime import memory
    from rlctl.core.trainer.update.step import Update
    from rlctl.core.units import human_bytes

    graphdef, state, info = abstract_state(a.shape, a.dtype)
    rows = a.prompts * a.group
    batch = abstract_batch(a)
    remat = {"auto": None, "on": True, "off": False}[a.remat]
    spec = RunSpec(
        rollout={"num_generations": a.group, "max_new_tokens": a.new_tokens},
        training={"prompts_per_step": a.prompts, "remat": remat},
    )
    update = Update(spec, pad_id=0, info=info)
    # the baseline: the log-softmax in one piece (the program before it was chunked)
    plain = Update(
        spec.model_copy(update={"training": spec.training.model_copy(update={"remat": False})}),
        pad_id=0,
        info=info,
        numerics=dataclasses.replace(update.numerics, logits_chunk_bytes=2**62),
    )
    sizes = (
        [int(x) for x in a.sizes.split(",")]
        if a.sizes
        else [s for s in micro_batch_sizes(a.prompts, a.group) if s >= min(8, rows)]
    )
    have, where = memory.update_budget()
    print(
        f"{a.shape} ({info.params / 1e6:.0f}M parameters, {a.dtype}), {a.prompts} prompts x "
        f"{a.group} completions x ({a.prompt_tokens} + {a.new_tokens}) tokens; "
        f"{human_bytes(have)} {where}"
    )
    print(f"{'update':44} {'temporaries':>12} {'x baseline':>10} {'compile s':>9}")

    base, _, secs = temporaries(plain, graphdef, state, batch, rows)
    print(
        f"{'baseline: whole batch and logits':44} {human_bytes(base):>12} {1.0:10.2f} {secs:9.1f}"
    )
    auto_marked = False
    for size in sizes:
        temp, need, secs = temporaries(update, graphdef, state, batch, size)
        auto = not a.sizes and not auto_marked and need <= have  # the whole list only
        auto_marked |= auto
        label = f"chunked{', remat' if update._remat() else ''}, micro-batches of {size}" + (
            " (auto)" if auto else ""
        )
        print(f"{label:44} {human_bytes(temp):>12} {temp / base:10.2f} {secs:9.1f}")


if __name__ == "__main__":
    main()
