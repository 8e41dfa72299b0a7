"""A tiny random Llama in Hugging Face layout, with a real BPE tokenizer and ChatML.

Small enough that a GRPO step takes well under a second on CPU; untied
embeddings and 0.02-scale init so it can actually learn (a tied random model
learns nothing, see DESIGN.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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


# model_type -> the architecture transformers builds for it
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
FAMILIES = tuple(_ARCHITECTURES)


def write_tiny_model(folder: Path, family: str, **kwargs: object) -> Path:
    """A tiny random model of ``family`` (a ``model_type``); Gemma 3 ties its
    embeddings and Qwen3 uses rope theta 1e6, as the real ones do."""
    if family == "gemma3_text":
        kwargs.setdefault("tie", True)
    if family == "qwen3":  # the value of every Qwen3 (and the only one Tunix runs)
        kwargs.setdefault("rope_theta", 1e6)
    return write_tiny_llama(folder, family=family, **kwargs)  # type: ignore[arg-type]


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
    rope_theta: float = 10000.0,
    tie: bool = False,
    family: str = "llama",
) -> Path:
    from safetensors.numpy import save_file

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
        if family == "qwen2":  # Qwen2 has biases on q, k and v
            tensors.update(
                {
                    p + "self_attn.q_proj.bias": w(heads * head_dim),
                    p + "self_attn.k_proj.bias": w(kv_heads * head_dim),
                    p + "self_attn.v_proj.bias": w(kv_heads * head_dim),
                }
            )
        if family in ("qwen3", "gemma3_text"):  # per-head RMS norms of q and k
            tensors.update(
                {
                    p + "self_attn.q_norm.weight": 1 + w(head_dim) * 5,
                    p + "self_attn.k_norm.weight": 1 + w(head_dim) * 5,
                }
            )
        if family == "gemma3_text":  # four norms per layer, each scaled by (1 + w)
            for n in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
                "self_attn.q_norm",
                "self_attn.k_norm",
            ):
                tensors[p + n + ".weight"] = w(hidden if "_layernorm" in n else head_dim) * 5
    if family == "gemma3_text":
        tensors["model.norm.weight"] = w(hidden) * 5
    save_file(tensors, str(folder / "model.safetensors"))
    config = {
        "architectures": [_ARCHITECTURES[family]],
        "model_type": family,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rope_theta": rope_theta,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": tie,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "torch_dtype": "float32",
    }
    if family == "gemma3_text":  # Tunix's Gemma 3: 5 sliding layers, then 1 global
        config.update(
            {
                "rms_norm_eps": 1e-6,
                "hidden_activation": "gelu_pytorch_tanh",
                "query_pre_attn_scalar": head_dim,
                "sliding_window": 512,
                "rope_local_base_freq": 10000.0,
                "final_logit_softcapping": None,
                "attn_logit_softcapping": None,
                "rope_scaling": None,
                "layer_types": [
                    ("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                    for i in range(layers)
                ],
            }
        )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
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
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return folder
