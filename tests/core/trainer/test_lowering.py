"""What an accelerator would compile, checked on a machine without one: the update and
the sampler (rollout and eval) lowered for ``cuda`` and ``tpu`` in the accelerators'
row of the numerics table. The programs that hold the layers must not grow with the
model's depth (one scanned layer body: a 4-layer and a 24-layer model of one width
within 1.2x in operations): the sampler's, and the whole update with its optimizer
(AdamW steps a layer's arrays in one nested call whose body is shared by every layer:
``optimizer.units``). None of them may hold a
CPU-only branch (each marked by its named scope). The CPU's row is lowered beside
them to show the counts can tell: it unrolls its layers and holds every one of those
branches. Operation counts do not depend on the width, so a tiny model stands for a
real one."""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("tunix")
pytestmark = pytest.mark.trainer

from tests.fakes.tiny_model import write_tiny_llama  # noqa: E402


def compute(row: str) -> str:
    """What the matmuls read in ``row``'s configuration: ``model.compute_dtype=auto``
    picks bfloat16 on a GPU or TPU (precision.py), float32 on this CPU."""
    return "float32" if row == "cpu" else "bfloat16"


PLATFORMS = ("cuda", "tpu")
G, N = 4, 8  # completions per prompt, new tokens


def cpu_only_scopes() -> dict[str, str]:
    """Each CPU-only choice's named scope in a lowered program."""
    from rlctl.core.trainer.tunix_adapter.llama import compaction, decode, mlp_grad

    return {
        "pack_mlp_rows": compaction.ROWS_SCOPE,
        "pack_head": compaction.HEAD_SCOPE,
        "own_mlp_gradient": mlp_grad.SCOPE,
        "weights_first_decode": decode.SCOPE,
    }


def operations(text: str) -> int:
    """Operations of a StableHLO module (one per ``stablehlo.``/``func.`` op line)."""
    return len(re.findall(r"^\s*(?:%\S+(?:, %\S+)* = )?\"?(?:stablehlo|chlo|func)\.", text, re.M))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A 4-layer and a 24-layer tiny Llama of one width, loaded."""
    from rlctl.core.trainer import tunix_adapter as ta

    root = tmp_path_factory.mktemp("depth")
    return {n: ta.load_model(write_tiny_llama(root / f"l{n}", layers=n)) for n in (4, 24)}


def _update_texts(model, info, row: str, platform: str) -> tuple[str, str]:
    """The whole update and its loss and gradients alone, lowered for ``platform``."""
    import jax.numpy as jnp
    from flax import nnx

    from rlctl.core.config.models import RunSpec
    from rlctl.core.trainer.rollout.rollout import Batch
    from rlctl.core.trainer.runtime.numerics import TABLE
    from rlctl.core.trainer.update.step import Update, make_optimizer

    spec = RunSpec(
        rollout={"num_generations": G, "max_new_tokens": N}, training={"prompts_per_step": 2}
    )
    import dataclasses

    info = dataclasses.replace(info, compute_dtype=compute(row))
    u = Update(spec, pad_id=0, info=info, numerics=TABLE[row])
    rows = 2 * G

    def shape(*dims, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(dims, dtype)

    batch = Batch(
        prompt_ids=shape(2, 16),
        completion_ids=shape(rows, N),
        mask=shape(rows, N),
        advantages=shape(rows, dtype=jnp.float32),
    )
    optimizer = nnx.eval_shape(lambda: make_optimizer(model, spec.training))
    whole = u.lower(model, optimizer, batch, (platform,)).as_text(debug_info=True)
    mdef, params, rest = nnx.split(model, nnx.Param, ...)
    grads = (
        jax.jit(lambda p, r, b: u._loss_and_grads(p, mdef, r, b, rows))
        .trace(params, rest, batch)
        .lower(lowering_platforms=(platform,))
        .as_text(debug_info=True)
    )
    return whole, grads


def _sampler_text(model, info, row: str, platform: str, group: int) -> str:
    from rlctl.core.trainer.rollout.sampler import Sampler, sample_groups
    from rlctl.core.trainer.runtime.numerics import TABLE

    s = Sampler(
        model,
        info,
        pad_id=0,
        eos_ids=[1],
        max_new_tokens=N,
        numerics=TABLE[row],
        compute_dtype=compute(row),
    )
    prompts = np.zeros((16 // group, 16), np.int32)  # rollout 4 x G, eval 16 x 1
    traced = sample_groups.trace(
        s.graphdef,
        s.state,
        prompts,
        np.uint32(0),
        np.float32(1.0),
        np.float32(1.0),
        np.int32(0),
        info=s.info,
        group=group,
        max_new_tokens=N,
        pad_id=0,
        eos_ids=s.eos_ids,
        weights_first=s.weights_first,
        scan=s.scan,
    )
    return traced.lower(lowering_platforms=(platform,)).as_text(debug_info=True)


def _programs(models, row: str, platform: str) -> dict[str, dict[int, str]]:
    updates = {n: _update_texts(m, i, row, platform) for n, (m, i) in models.items()}
    return {
        "update": {n: whole for n, (whole, _) in updates.items()},
        "gradients": {n: grads for n, (_, grads) in updates.items()},
        "rollout": {n: _sampler_text(m, i, row, platform, G) for n, (m, i) in models.items()},
        "eval": {n: _sampler_text(m, i, row, platform, 1) for n, (m, i) in models.items()},
    }


@pytest.mark.parametrize("platform", PLATFORMS)
def test_accelerator_programs_hold_one_layer_and_none_of_the_cpus_branches(models, platform):
    row = "tpu" if platform == "tpu" else "gpu"
    programs = _programs(models, row, platform)
    for name, texts in programs.items():
        shallow, deep = operations(texts[4]), operations(texts[24])
        assert shallow > 50, (name, shallow)
        assert deep <= 1.2 * shallow, (
            f"{name} on {platform}: {deep} operations at 24 layers, {shallow} at 4"
        )
        for choice, scope in cpu_only_scopes().items():
            assert scope not in texts[24], f"{name} on {platform} holds {choice} ({scope})"
        assert "stablehlo.while" in texts[24], name  # the layers' scan


def test_the_cpus_programs_grow_with_depth_and_hold_its_branches(models):
    """The yardstick of the test above: lowered the same way in the CPU's row (for
    cuda, whose lowering needs no GPU), the programs unroll every layer and hold each
    CPU-only branch, so the counts and scopes above can fail."""
    programs = _programs(models, "cpu", "cuda")
    for name, texts in programs.items():
        assert operations(texts[24]) > 3 * operations(texts[4]), name
    update, rollout = programs["update"][24], programs["rollout"][24]
    scopes = cpu_only_scopes()
    for choice in ("pack_mlp_rows", "pack_head", "own_mlp_gradient"):
        assert scopes[choice] in update, choice
    assert scopes["weights_first_decode"] in rollout
