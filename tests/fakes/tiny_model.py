"""A tiny random model of any registered family (``rlctl.core.families``, built from
its record) in Hugging Face layout, with a real BPE tokenizer and ChatML.

Small enough that a GRPO step takes well under a second on CPU; untied
embeddings and 0.02-scale init so it can actually learn (a tied random model
learns nothing).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rlctl.core import families

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        "What is 4 + 3? 4 + 3 = 7. <answer>7</answer>",
        "Tom has 5 apples and gets 2 more. How many apples does Tom have now?",
        "You are a careful math assistant. Solve the problem, then give the final answer "
        "as a number inside <answer></answer> tags.",
        "system user assistant answer " + " ".join(str(i) for i in range(100)),
    ] * 20
    tok.train_from_iterator(corpus, trainer)
    return tok


# every registered family (rlctl.core.families): each gets its tiny model from its record
FAMILIES = families.SUPPORTED
MAX_POSITIONS = 2048  # every tiny model's context


def write_tiny_model(folder: Path, family: str, **kwargs: object) -> Path:
    """A tiny random model of ``family`` (a ``model_type``), as its record's ``tiny``
    config says the real ones are (Gemma 3 ties its embeddings, Qwen3 uses rope
    theta 1e6, Mistral has a window)."""
    if families.family(family).layout.by_layer:
        # its tensors (Gemma 4's per-layer inputs, head sizes and shared layers,
        # Qwen3.5's linear-attention layers) are not a Llama's: transformers writes
        # it (needs torch, the test extra), its dims given as overrides of its tiny
        # config (whose layer pattern sets the count)
        seed = int(kwargs.pop("seed", 0))  # type: ignore[call-overload]
        kwargs.pop("layers", None)
        names = {"hidden": "hidden_size", "heads": "num_attention_heads"}
        names.update(kv_heads="num_key_value_heads", ffn="intermediate_size")
        if set(kwargs) - set(names):
            raise TypeError(f"write_tiny_model({family!r}) takes no {sorted(kwargs)}")
        dims: dict[str, object] = {names[k]: v for k, v in kwargs.items()}
        if "hidden" in kwargs or "heads" in kwargs:
            head_dim = int(kwargs.get("hidden", 64)) // int(kwargs.get("heads", 4))  # type: ignore[call-overload]
            dims.update(head_dim=head_dim)
            if families.family(family).layout.attention == "per_layer":  # Gemma 4's
                dims.update(global_head_dim=2 * head_dim)
        return write_transformers_model(folder, family, seed=seed, overrides=dims)
    return write_tiny_llama(folder, family=family, **kwargs)  # type: ignore[arg-type]


def _base_config(
    family: str, vocab_size: int, hidden: int, heads: int, kv_heads: int, ffn: int, layers: int
) -> dict[str, object]:
    """config.json's dims (transformers' names), before the family's own keys."""
    return {
        "architectures": [families.family(family).hf_architecture],
        "model_type": family,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "max_position_embeddings": MAX_POSITIONS,
    }


def write_transformers_model(
    folder: Path, family: str, seed: int = 0, overrides: dict[str, object] | None = None
) -> Path:
    """A tiny random model of ``family`` as transformers itself builds and saves it,
    from the family's record alone (its ``hf_architecture`` and ``tiny`` config on the
    common dims): the config.json and tensor names a real checkpoint of the family
    has, not rlctl's idea of them. Every vector (norms, biases) is perturbed, so a
    norm offset or a missing bias shows in the logits. ``overrides``: config.json keys
    set after the family's own (a real checkpoint's rope scaling). Needs torch (the
    test extra)."""
    import torch
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer(384)
    tok.save(str(folder / "tokenizer.json"))
    _write_tokenizer_config(folder)
    fam = families.family(family)
    base = _base_config(family, tok.get_vocab_size(with_added_tokens=True), 64, 4, 2, 128, 2)
    config = {k: v for k, v in base.items() if k not in ("architectures", "model_type")}
    config.update(fam.tiny(base))
    config.update({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
    config.update(overrides or {})
    hf_config = transformers.AutoConfig.for_model(fam.model_type, **config)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(folder))
    return folder


def _write_tokenizer_config(folder: Path) -> None:
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": CHATML,
                "eos_token": "<|im_end|>",
                "bos_token": "<|im_start|>",
                "pad_token": "<|im_end|>",
            }
        )
    )


def write_tiny_llama(
    folder: Path,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 128,
    vocab: int = 384,
    seed: int = 0,
    rope_theta: float | None = None,
    tie: bool | None = None,
    family: str = "llama",
) -> Path:
    """A tiny random model in Hugging Face layout, its tensors written with numpy: the
    ones every Llama-shaped model has, plus what the family's layout declares (q/k/v
    biases, q/k norms, Gemma's four norms per layer); its config.json the dims, then
    the family's own keys (``Family.tiny``). ``rope_theta`` and ``tie`` default to
    the family's tiny values (else 10000 and untied)."""
    from safetensors.numpy import save_file

    fam = families.family(family)
    layout = fam.layout
    stacked = layout.attention == "stacked_einsums"  # Gemma 3: norms scale by (1 + w)
    own = fam.tiny(_base_config(family, vocab, hidden, heads, kv_heads, ffn, layers))
    tie = bool(own.get("tie_word_embeddings", False)) if tie is None else tie
    rope_theta = float(own.get("rope_theta", 10000.0)) if rope_theta is None else rope_theta
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer(vocab)
    tok.save(str(folder / "tokenizer.json"))
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {
        "model.embed_tokens.weight": w(vocab_size, hidden),
        "model.norm.weight": np.ones(hidden, np.float32),
    }
    if not tie:
        tensors["lm_head.weight"] = w(vocab_size, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update(
            {
                p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
                p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
                p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
                p + "mlp.gate_proj.weight": w(ffn, hidden),
                p + "mlp.up_proj.weight": w(ffn, hidden),
                p + "mlp.down_proj.weight": w(hidden, ffn),
                p + "input_layernorm.weight": np.ones(hidden, np.float32),
                p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
            }
        )
        if layout.qkv_bias:  # Qwen2 has biases on q, k and v
            tensors.update(
                {
                    p + "self_attn.q_proj.bias": w(heads * head_dim),
                    p + "self_attn.k_proj.bias": w(kv_heads * head_dim),
                    p + "self_attn.v_proj.bias": w(kv_heads * head_dim),
                }
            )
        if layout.qk_norm or stacked:  # per-head RMS norms of q and k
            tensors.update(
                {
                    p + "self_attn.q_norm.weight": 1 + w(head_dim) * 5,
                    p + "self_attn.k_norm.weight": 1 + w(head_dim) * 5,
                }
            )
        if stacked:  # four norms per layer, each scaled by (1 + w)
            for n in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
                "self_attn.q_norm",
                "self_attn.k_norm",
            ):
                tensors[p + n + ".weight"] = w(hidden if "_layernorm" in n else head_dim) * 5
    if stacked:
        tensors["model.norm.weight"] = w(hidden) * 5
    save_file(tensors, str(folder / "model.safetensors"))
    config = _base_config(family, vocab_size, hidden, heads, kv_heads, ffn, layers)
    config.update(
        {
            "rope_theta": rope_theta,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": tie,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 2,
            "torch_dtype": "float32",
        }
    )
    config.update({k: v for k, v in own.items() if k not in ("rope_theta", "tie_word_embeddings")})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer_config(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return folder
