"""A plain numpy Llama forward pass: the yardstick for every other implementation.

Tests compare Tunix's logits (and the GGUF conversion) against this, so it must
share no code with either: it reads only an HF folder (config.json +
model.safetensors) and spells out the math of transformers' LlamaForCausalLM
(RMSNorm, rotate_half RoPE, grouped-query causal attention, SwiGLU, tied or
separate lm_head) in float32, one unbatched sequence at a time. The only
shortcut is an optional key/value cache for greedy decoding, which a test
checks against full recomputation.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


class ReferenceLlama:
    """Loads an HF Llama folder and computes logits for one token sequence."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        cfg = json.loads((folder / "config.json").read_text())
        self.cfg = cfg
        self.w = load_file(str(folder / "model.safetensors"))
        self.n_layers = cfg["num_hidden_layers"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads", self.n_heads)
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.n_heads
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg.get("rope_theta", 10000.0)
        embed = self.w["model.embed_tokens.weight"]
        self.lm_head = embed if cfg.get("tie_word_embeddings") else self.w["lm_head.weight"]

    def _rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        var = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(var + self.eps) * weight

    def _rope(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inv_freq = 1.0 / (
            self.theta ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        )
        angles = np.outer(positions.astype(np.float64), inv_freq)  # (T, D/2)
        angles = np.concatenate([angles, angles], axis=-1)  # (T, D), HF layout
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    @staticmethod
    def _rotate_half(x: np.ndarray) -> np.ndarray:
        half = x.shape[-1] // 2
        return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)

    def _attention(
        self, x: np.ndarray, i: int, cos: np.ndarray, sin: np.ndarray, cache: list | None
    ) -> np.ndarray:
        p = f"model.layers.{i}.self_attn."
        t, d = len(x), self.head_dim
        q = (x @ self.w[p + "q_proj.weight"].T).reshape(t, self.n_heads, d).transpose(1, 0, 2)
        k = (x @ self.w[p + "k_proj.weight"].T).reshape(t, self.n_kv, d).transpose(1, 0, 2)
        v = (x @ self.w[p + "v_proj.weight"].T).reshape(t, self.n_kv, d).transpose(1, 0, 2)
        q = q * cos + self._rotate_half(q) * sin
        k = k * cos + self._rotate_half(k) * sin
        if cache is not None:  # keys/values of earlier positions, already rotated
            if len(cache) > i:
                k = np.concatenate([cache[i][0], k], axis=1)
                v = np.concatenate([cache[i][1], v], axis=1)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
        past = k.shape[1] - t
        group = self.n_heads // self.n_kv
        k = np.repeat(k, group, axis=0)  # head h uses KV head h // group
        v = np.repeat(v, group, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d)  # (H, T, past + T)
        causal = np.arange(past + t)[None, :] <= past + np.arange(t)[:, None]
        scores = np.where(causal, scores, -np.inf)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = (probs @ v).transpose(1, 0, 2).reshape(t, self.n_heads * d)
        return out @ self.w[p + "o_proj.weight"].T

    def _mlp(self, x: np.ndarray, i: int) -> np.ndarray:
        p = f"model.layers.{i}.mlp."
        gate = x @ self.w[p + "gate_proj.weight"].T
        up = x @ self.w[p + "up_proj.weight"].T
        silu = gate / (1.0 + np.exp(-gate))
        return (silu * up) @ self.w[p + "down_proj.weight"].T

    def hidden_states(
        self, tokens: list[int] | np.ndarray, cache: list | None = None
    ) -> np.ndarray:
        """Final-norm hidden states, shape (T, hidden).

        With ``cache`` (a list, empty at first) the tokens continue the ones
        passed before with the same list; without it they start at position 0.
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        past = 0 if not cache else cache[0][0].shape[1]
        x = self.w["model.embed_tokens.weight"][tokens].astype(np.float32)
        cos, sin = self._rope(past + np.arange(len(tokens)))
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            h = self._rms_norm(x, self.w[p + "input_layernorm.weight"])
            x = x + self._attention(h, i, cos, sin, cache)
            h = self._rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            x = x + self._mlp(h, i)
        return self._rms_norm(x, self.w["model.norm.weight"])

    def logits(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        """Logits for every position, shape (T, vocab), float32."""
        return self.hidden_states(tokens) @ self.lm_head.T

    def greedy(
        self, tokens: list[int], max_new_tokens: int, stop_ids: tuple[int, ...] = ()
    ) -> list[int]:
        """Greedy continuation, stopping after a token in ``stop_ids``."""
        cache: list = []
        step = list(tokens)
        new: list[int] = []
        for _ in range(max_new_tokens):
            nxt = int(np.argmax(self.hidden_states(step, cache)[-1] @ self.lm_head.T))
            new.append(nxt)
            if nxt in stop_ids:
                break
            step = [nxt]
        return new


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Best effort: run numpy's OpenBLAS with ``n`` threads inside the block.

    On a shared 2-core machine OpenBLAS's spinning threads fight other jobs:
    a SmolLM2 prompt pass took 4.6 s with 2 threads and 0.8 s with 1. Does
    nothing when numpy is not linked to a recognisable OpenBLAS.
    """
    lib = None
    libs_dir = Path(np.__file__).parent.parent / "numpy.libs"
    for so in sorted(libs_dir.glob("libscipy_openblas*.so*")) if libs_dir.is_dir() else []:
        with contextlib.suppress(OSError):
            lib = ctypes.CDLL(str(so))
            break
    names = [
        ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
        ("openblas_get_num_threads", "openblas_set_num_threads"),
    ]
    pair = next(
        (
            (getattr(lib, g), getattr(lib, s))
            for g, s in names
            if lib is not None and hasattr(lib, g) and hasattr(lib, s)
        ),
        None,
    )
    if pair is None:
        yield
        return
    get, set_ = pair
    before = get()
    set_(n)
    try:
        yield
    finally:
        set_(before)


def reference_logits(folder: str | Path, tokens: list[int] | np.ndarray) -> np.ndarray:
    """Logits of an HF Llama folder for one sequence, shape (T, vocab)."""
    return ReferenceLlama(folder).logits(tokens)
