"""Every registered model family (``rlctl.core.families``) does what its record says,
checked from a tiny random model that transformers itself writes from the record's
own ``tiny`` config (``tests/fakes/tiny_model.write_transformers_model``):

- its record is what its row here says (architecture, capabilities, LoRA, refusals),
  so a family cannot gain or lose a trainer path by accident;
- the layout's tensors are exactly the checkpoint's, names and shapes;
- ``checkpoint-convert`` HF -> trainer -> HF moves no bit;
- the trainer's logits are transformers' and its sampler draws transformers' greedy
  tokens, through whichever decode path the capabilities select;
- the names it hands vLLM are the checkpoint's;
- LoRA adapters merged the way the export merges them give the LoRA model's logits in
  transformers (or LoRA is refused, where the record says so);
- (slow) the family converts, trains two steps through ``rlctl train`` and exports
  with logits equal to transformers'.

A new family is one module in ``rlctl/core/families/`` and one row in ``ROWS``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlctl.core import families
from rlctl.core.errors import ConfigError

# builds a model, compiles or trains: out of the fast loop (tests/test_marks.py)
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Row:
    """What a family's record must say, written down a second time on purpose."""

    architecture: str  # the transformers class its checkpoints name
    capabilities: frozenset[str]  # the Capabilities it declares (all others off)
    lora: bool  # LoRA adapters can target its projections
    # config.json changes its config mapping must refuse, with a word of the message
    refuses: tuple[tuple[dict[str, Any], str], ...] = ()


LLAMA3 = frozenset({"weights_first_decode", "own_mlp_gradient", "recomputation", "scanned_layers"})
ROWS = {
    "gemma3_text": Row(
        "Gemma3ForCausalLM",
        frozenset(),
        lora=False,
        refuses=(({"final_logit_softcapping": 30.0}, "softcapping"),),
    ),
    "gemma4_text": Row(
        "Gemma4ForCausalLM",
        frozenset(),
        lora=False,
        refuses=(
            ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2}, "enable_moe_block"),
            ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
            ({"rms_norm_eps": 1e-5}, "rms_norm_eps"),
            ({"tie_word_embeddings": False}, "tie_word_embeddings"),
            ({"vocab_size_per_layer_input": 262144}, "vocab_size_per_layer_input"),
            # the last unshared layers would be global then global: not Tunix's rule
            ({"num_kv_shared_layers": 3}, "num_kv_shared_layers"),
            (
                {
                    "rope_parameters": {
                        "sliding_attention": {
                            "rope_type": "linear",
                            "factor": 2.0,
                            "rope_theta": 1e4,
                        },
                        "full_attention": {"rope_type": "proportional", "rope_theta": 1e6},
                    }
                },
                "rope",
            ),
        ),
    ),
    "llama": Row("LlamaForCausalLM", LLAMA3, lora=True),
    "mistral": Row(
        "MistralForCausalLM",
        LLAMA3,
        lora=True,
        refuses=(
            ({"sliding_window": 4096, "max_position_embeddings": 32768}, "sliding_window"),
            ({"sliding_window": 1024}, "sliding_window"),  # shorter than the tiny's 2048
            ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope"),
        ),
    ),
    "qwen2": Row(
        "Qwen2ForCausalLM",
        frozenset(),
        lora=True,
        refuses=(  # #53: taken before, training an attention without its window
            (
                {
                    "use_sliding_window": True,
                    "sliding_window": 8,
                    "max_window_layers": 0,
                    "layer_types": None,
                },
                "sliding window",
            ),
            (
                {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64},
                "sliding window",
            ),
        ),
    ),
    "qwen3": Row(
        "Qwen3ForCausalLM",
        frozenset(),
        lora=True,
        refuses=(({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope"),),
    ),
    "qwen3_5_text": Row(
        "Qwen3_5ForCausalLM",
        frozenset(),
        lora=True,
        refuses=(
            ({"attention_bias": True}, "attention_bias"),
            ({"hidden_act": "gelu"}, "hidden_act"),
            ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ),
    ),
}
FAMILIES = sorted(families.FAMILIES)


def test_every_family_has_a_row():
    assert sorted(ROWS) == FAMILIES


def test_an_unknown_model_type_is_one_clear_line():
    with pytest.raises(ConfigError, match="'phi3' is not supported") as e:
        families.of_config({"model_type": "phi3"})
    assert ", ".join(FAMILIES) in str(e.value)
    for multimodal in ("gemma3", "gemma4"):
        with pytest.raises(ConfigError, match="multimodal"):
            families.family(multimodal)
    # Qwen3.5's multimodal checkpoints are read as its text model (test_qwen3_5.py)
    assert families.family("qwen3_5") is families.family("qwen3_5_text")


@pytest.mark.parametrize("name", FAMILIES)
def test_the_record_is_its_row(name):
    fam, row = families.family(name), ROWS[name]
    declared = {f.name for f in dataclasses.fields(fam.capabilities)}
    on = {f for f in declared if getattr(fam.capabilities, f)}
    assert (fam.model_type, fam.hf_architecture, on) == (name, row.architecture, row.capabilities)
    assert bool(fam.lora_paths) == row.lora


# --- from here on, the tiny model transformers writes (torch: the test extra) ---------
def written(tmp: Path, name: str) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.fakes.tiny_model import write_transformers_model

    return write_transformers_model(tmp / name, name)


def config_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("name", FAMILIES)
def test_its_tiny_config_resolves_to_it_and_its_refusals_hold(tmp_path, name):
    folder = written(tmp_path, name)
    config = config_of(folder)
    fam = families.of_config(config)
    assert fam is families.family(name) and config["architectures"] == [fam.hf_architecture]
    fam.config_fields(config)  # the tiny one is accepted
    for change, word in ROWS[name].refuses:
        with pytest.raises(ConfigError, match=word):
            fam.config_fields({**config, **change})


@pytest.mark.parametrize("name", FAMILIES)
def test_the_layout_is_the_checkpoints_tensors(tmp_path, name):
    from safetensors.numpy import load_file

    from rlctl.core.checkpoints import layout

    folder = written(tmp_path, name)
    tensors = load_file(str(folder / "model.safetensors"))
    assert {k: v.shape for k, v in tensors.items()} == layout.hf_shapes(config_of(folder))


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request, tmp_path_factory):
    """(family, HF folder transformers wrote, trainer folder, HF folder converted back,
    the trainer's model and info loaded from the trainer folder)."""
    pytest.importorskip("tunix")
    from rlctl.core.checkpoints.convert import convert
    from rlctl.core.trainer import tunix_adapter as ta

    tmp = tmp_path_factory.mktemp(request.param)
    src = written(tmp, request.param)
    convert(str(src), str(tmp / "trainer"), to="trainer")
    convert(str(tmp / "trainer"), str(tmp / "back"), to="hf", verify=True)
    model, info = ta.load_model(tmp / "trainer")
    return request.param, src, tmp / "trainer", tmp / "back", model, info


@pytest.mark.trainer
def test_the_round_trip_moves_no_bit(converted):
    from safetensors.numpy import load_file

    _, src, _, back, _, _ = converted
    before = load_file(str(src / "model.safetensors"))
    after = {}
    for f in back.glob("*.safetensors"):
        after.update(load_file(str(f)))
    assert set(before) == set(after)
    for k in before:
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)


@pytest.mark.trainer
def test_the_trainers_logits_and_greedy_tokens_are_transformers(converted):
    from rlctl.core.trainer.tunix_adapter.llama import decode, layers
    from tests.core.checkpoints.test_transformers_parity import assert_same_model

    name, _, trainer, back, model, info = converted
    assert info.family == name
    # the capabilities pick the paths: the sampler below decodes through them
    caps = families.family(name).capabilities
    assert decode.fits(model, info) == caps.weights_first_decode
    assert layers.scans(model, info) == caps.scanned_layers
    assert_same_model(model, info, back, trainer)


@pytest.mark.trainer
def test_vllm_gets_the_checkpoints_names(converted):
    from safetensors.numpy import load_file

    from rlctl.core.trainer.rollout.vllm_engine import hf_weights

    _, src, _, _, model, _ = converted
    want = {k: v.shape for k, v in load_file(str(src / "model.safetensors")).items()}
    got = {n: tuple(t.shape) for n, t in hf_weights(model, config_of(src))}
    assert got == want


@pytest.mark.trainer
def test_lora_merged_as_exported_gives_the_lora_models_logits(converted, tmp_path):
    """Random adapters on every projection the family lets LoRA target, merged into
    the trainer tensors by ``checkpoints.lora.merged`` and written back by the layout,
    as ``checkpoint-convert --to hf`` of a LoRA run does: transformers then computes
    the LoRA model's logits. A family without LoRA paths is refused before a run."""
    pytest.importorskip("qwix")
    import jax.numpy as jnp
    import torch
    import transformers
    from flax import nnx
    from safetensors.numpy import save_file

    from rlctl.core.checkpoints import layout, lora
    from rlctl.core.config.models import RunSpec
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.tunix_adapter.lora import apply_lora, check_lora, frozen_params

    name, src, trainer, _, _, _ = converted
    fam = families.family(name)
    targets = [hf for hf, _ in fam.lora_paths]
    training = RunSpec(
        training={"lora_rank": 4, "lora_alpha": 6.0, "lora_target_modules": targets or ["q_proj"]}
    ).training
    if not fam.lora_paths:
        with pytest.raises(ConfigError, match="LoRA is not supported"):
            check_lora(name, training)
        return
    check_lora(name, training)
    model, info = ta.load_model(trainer)
    model = apply_lora(model, info.family, training)
    state = nnx.state(model, nnx.LoRAParam)
    rng = np.random.default_rng(0)
    flat = {".".join(map(str, k)): v for k, v in nnx.to_flat_state(state)}
    for var in flat.values():
        var.set_value(jnp.asarray(rng.normal(0, 0.1, var.get_value().shape), jnp.float32))
    nnx.update(model, state)

    config = config_of(src)
    params = {
        ".".join(map(str, k)): np.asarray(v.get_value())
        for k, v in nnx.to_flat_state(frozen_params(model))
    }
    merged_keys = 0
    out: dict[str, np.ndarray] = {}
    for rule in layout.rules(config):
        w = params[rule.key]
        a_key, b_key = lora.adapter_keys(rule)
        if a_key in flat:
            a, b = (np.asarray(flat[k].get_value()) for k in (a_key, b_key))
            w = lora.merged(rule, w, a, b, training.lora_alpha / training.lora_rank)
            merged_keys += 1
        out.update(zip(rule.hf, (np.ascontiguousarray(x) for x in rule.to_hf(w)), strict=True))
    # every projection of a targeted name, counted from the checkpoint's own names
    # (Qwen3.5's q_proj is in its full-attention layers only)
    projections = layout.hf_shapes(config)
    weights = [n for n in projections if n.endswith(".weight")]  # not Qwen2's biases
    assert merged_keys == sum(n.rsplit(".", 2)[-2] in targets for n in weights)
    assert merged_keys >= info.num_layers
    folder = tmp_path / "merged"
    folder.mkdir()
    for f in ("config.json", "generation_config.json"):
        if (src / f).is_file():
            (folder / f).write_text((src / f).read_text())
    save_file(out, str(folder / "model.safetensors"))

    ids = [5, 17, 42, 9, 88, 3, 61, 27]
    n = len(ids)
    hidden, _ = ta.trunk(
        model, jnp.asarray([ids]), jnp.arange(n)[None], None, jnp.tril(jnp.ones((1, n, n), bool))
    )
    ours = np.asarray(hidden[0] @ ta.head_weight(model), np.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        theirs = hf.eval()(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-3)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    with torch.no_grad():
        alone = base.eval()(torch.tensor([ids])).logits[0].numpy()
    assert float(np.abs(ours - alone).max()) > 1e-2  # and the adapters did matter


TINY_RUN = (
    "--prompts-per-step",
    "2",
    "-G",
    "2",
    "--max-new-tokens",
    "8",
    "--lr",
    "3e-2",
    "--eval-size",
    "0",
    "--set",
    'rewards=["tests.fakes.rewards.digit_count"]',
)


@pytest.mark.trainer
@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_it_converts_trains_two_steps_and_exports_transformers_logits(tmp_path, monkeypatch, name):
    """The acceptance of a new family: a tiny one, as transformers writes it, goes
    through ``checkpoint-convert --to trainer``, two steps of ``rlctl train`` and
    ``checkpoint-convert --to hf``, and transformers then computes the trained
    policy's logits."""
    monkeypatch.chdir(tmp_path)
    converts_trains_and_exports(tmp_path, written(tmp_path, name))


# the families #52 added: the acceptance's 32 greedy tokens and GSPO run for them
NEWEST = ("gemma4_text", "qwen3_5_text")


@pytest.mark.trainer
@pytest.mark.parametrize("name", NEWEST)
def test_the_samplers_32_greedy_tokens_are_transformers_generate(tmp_path, name):
    """32 tokens from rlctl's sampler (its own cache: Gemma 4's shared layers and
    sliding rings, Qwen3.5's recurrent states) equal transformers' ``generate``, two
    prompts in one batch, one left-padded further."""
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.model.tokenizer import ChatTokenizer
    from rlctl.core.trainer.rollout.sampler import Sampler, left_pad
    from tests.core.checkpoints.test_transformers_parity import PROMPT, hf_greedy, hf_model

    src = written(tmp_path, name)
    model, info = ta.load_model(src)
    tok = ChatTokenizer(src)
    ids = tok.encode(PROMPT)
    sampler = Sampler(model, info, pad_id=tok.pad_id(), eos_ids=[], max_new_tokens=32)
    out = sampler(left_pad([ids, ids[3:]], 48, tok.pad_id()), group=2, seed=0, temperature=0.0)
    hf = hf_model(src)
    want = hf_greedy(hf, ids, 32), hf_greedy(hf, ids[3:], 32)
    got = [[int(t) for t in row] for row in np.asarray(out.tokens)]
    assert got == [want[0], want[0], want[1], want[1]]


@pytest.mark.trainer
@pytest.mark.parametrize("name", NEWEST)
def test_their_logits_are_transformers_to_1e_5(tmp_path, name):
    """float32 logits of the trainer's model equal transformers' to 1e-5 (relative
    where they are large: Gemma 4's soft-capped logits reach 30)."""
    from rlctl.core.trainer import tunix_adapter as ta
    from tests.core.checkpoints.test_transformers_parity import (
        hf_logits,
        hf_model,
        jax_logits,
        prompt_ids,
    )

    src = written(tmp_path, name)
    model, _ = ta.load_model(src)
    ids = prompt_ids(src)
    ours, theirs = jax_logits(model, ids), hf_logits(hf_model(src), ids)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.trainer
@pytest.mark.slow
@pytest.mark.parametrize("name", NEWEST)
def test_gspo_trains_two_steps_and_exports_transformers_logits(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    converts_trains_and_exports(tmp_path, written(tmp_path, name), algorithm="gspo")


def converts_trains_and_exports(
    tmp_path: Path, src: Path, *extra: str, compare: bool = True, algorithm: str = "grpo"
) -> Path:
    """``src`` (a Hugging Face folder) converted, trained two steps by ``rlctl train
    ALGORITHM`` (grpo or gspo)
    (``extra``: more of its flags) in the current folder ``tmp_path``, exported, and (with
    ``compare``: a full fine-tune's checkpoint) the export's logits in transformers equal
    to the trained policy's. Returns the export's folder."""
    from safetensors.numpy import load_file
    from typer.testing import CliRunner

    from rlctl.cli.app import app
    from tests.cli.test_checkpoint import _restore_run_policy
    from tests.core.checkpoints.test_transformers_parity import (
        hf_logits,
        hf_model,
        jax_logits,
        prompt_ids,
    )

    runner = CliRunner()
    r = runner.invoke(app, ["checkpoint-convert", str(src), "conv", "--to", "trainer"])
    assert r.exit_code == 0, r.output
    (tmp_path / "train.jsonl").write_text(
        "".join(
            json.dumps({"question": f"What is {a} + {a + 1}?", "answer": 2 * a + 1}) + "\n"
            for a in range(8)
        )
    )
    r = runner.invoke(
        app,
        [
            "train",
            algorithm,
            "--name",
            "pol",
            "--model",
            "conv",
            "--dataset",
            "jsonl",
            "--data-path",
            "train.jsonl",
            "--steps",
            "2",
            "--set",
            "checkpoint.interval=2",
            *TINY_RUN,
            *extra,
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["checkpoint-convert", "pol", "exported", "--to", "hf", "--verify"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "exported"
    before = load_file(str(src / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # it did train
    if not compare:
        return out

    policy, _, step = _restore_run_policy(tmp_path / "runs" / "pol", tmp_path / "conv")
    assert step == 2
    ids = prompt_ids(out)
    ours, theirs = jax_logits(policy, ids), hf_logits(hf_model(out), ids)
    np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-3)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    return out
