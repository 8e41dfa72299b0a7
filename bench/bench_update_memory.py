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

    python bench/bench_update_memory.py                       # 16 x 8 x (160 + 256)
    python bench/bench_update_memory.py --prompts 2 --new-tokens 48 --prompt-tokens 160
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# config.json fields of the shapes people train (random weights are enough: only
# shapes matter to the compiler)
SHAPES = {
    "smollm2-135m": dict(num_hidden_layers=30, vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_attention_heads=9,
                         num_key_value_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True),
    "smollm2-360m": dict(num_hidden_layers=32, vocab_size=49152, hidden_size=960,
                         intermediate_size=2560, num_attention_heads=15,
                         num_key_value_heads=5, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True),
    "llama-3.2-1b": dict(num_hidden_layers=16, vocab_size=128256, hidden_size=2048,
                         intermediate_size=8192, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
                         rms_norm_eps=1e-5, tie_word_embeddings=True),
}


def abstract_state(shape: str, dtype: str):
    """(graphdef, abstract (model, optimizer) state, ModelInfo) of a model shape."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from tunix.models.llama3 import model as llama

    from rlctl.core.checkpoints.families import FAMILIES
    from rlctl.core.config.models import TrainingSpec
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.step import make_optimizer

    c = SHAPES[shape]
    config = ta.build_config(FAMILIES["llama"], c)
    jdtype = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32

    def build():
        model = llama.Llama3(config, rngs=nnx.Rngs(0))
        if jdtype != jnp.float32:
            state = jax.tree.map(lambda x: x.astype(jdtype), nnx.state(model, nnx.Param))
            nnx.update(model, state)
        return model, make_optimizer(model, TrainingSpec())

    model, optimizer = nnx.eval_shape(build)
    graphdef, state = nnx.split((model, optimizer))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    info = ta.ModelInfo(family="llama", num_layers=config.num_layers,
                        num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                        vocab_size=config.vocab_size, params=n, dtype=dtype)
    return graphdef, state, info


def temporaries(update, graphdef, state, batch, size: int) -> tuple[int, int, float]:
    """(temporaries, what a run checks against free memory, compile seconds)."""
    import jax

    from rlctl.core.trainer import memory

    t0 = time.perf_counter()
    compiled = jax.jit(update._step_fn(graphdef, size), donate_argnums=0).lower(
        state, batch).compile()
    return (compiled.memory_analysis().temp_size_in_bytes, memory.compiled_need(compiled),
            time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("-G", "--group", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=160)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--sizes", default="", help="micro-batch sizes, e.g. 64,16,8")
    p.add_argument("--remat", choices=["auto", "on", "off"], default="auto",
                   help="training.remat of the micro-batch rows (the baseline has none)")
    a = p.parse_args()

    import jax
    import jax.numpy as jnp

    from rlctl.core.config.models import RunSpec, micro_batch_sizes
    from rlctl.core.trainer import memory
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.rollout import Batch
    from rlctl.core.trainer.step import Update
    from rlctl.core.units import human_bytes

    graphdef, state, info = abstract_state(a.shape, a.dtype)
    rows = a.prompts * a.group
    batch = Batch(
        prompt_ids=jax.ShapeDtypeStruct((a.prompts, a.prompt_tokens), jnp.int32),
        completion_ids=jax.ShapeDtypeStruct((rows, a.new_tokens), jnp.int32),
        mask=jax.ShapeDtypeStruct((rows, a.new_tokens), jnp.int32),
        advantages=jax.ShapeDtypeStruct((rows,), jnp.float32))
    remat = {"auto": None, "on": True, "off": False}[a.remat]
    spec = RunSpec(rollout={"num_generations": a.group, "max_new_tokens": a.new_tokens},
                   training={"prompts_per_step": a.prompts, "remat": remat})
    update = Update(spec, pad_id=0, info=info)
    plain = Update(spec.model_copy(update={"training": spec.training.model_copy(
        update={"remat": False})}), pad_id=0, info=info)
    sizes = ([int(x) for x in a.sizes.split(",")] if a.sizes
             else [s for s in micro_batch_sizes(a.prompts, a.group) if s >= min(8, rows)])
    have, where = memory.update_budget()
    print(f"{a.shape} ({info.params / 1e6:.0f}M parameters, {a.dtype}), {a.prompts} prompts x "
          f"{a.group} completions x ({a.prompt_tokens} + {a.new_tokens}) tokens; "
          f"{human_bytes(have)} {where}")
    print(f"{'update':44} {'temporaries':>12} {'x baseline':>10} {'compile s':>9}")

    real_chunk = ta.LOGITS_CHUNK_BYTES
    ta.LOGITS_CHUNK_BYTES = 2**62  # the log-softmax in one piece: the program before
    base, _, secs = temporaries(plain, graphdef, state, batch, rows)
    ta.LOGITS_CHUNK_BYTES = real_chunk
    print(f"{'baseline: whole batch and logits':44} {human_bytes(base):>12} {1.0:10.2f} "
          f"{secs:9.1f}")
    auto_marked = False
    for size in sizes:
        temp, need, secs = temporaries(update, graphdef, state, batch, size)
        auto = not a.sizes and not auto_marked and need <= have  # the whole list only
        auto_marked |= auto
        label = (f"chunked{', remat' if update._remat() else ''}, micro-batches of {size}"
                 + (" (auto)" if auto else ""))
        print(f"{label:44} {human_bytes(temp):>12} {temp / base:10.2f} {secs:9.1f}")


if __name__ == "__main__":
    main()
