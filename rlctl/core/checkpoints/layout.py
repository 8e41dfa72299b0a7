"""Where each Hugging Face tensor lives in the trainer's parameter tree, per family.

The trainer (Tunix) keeps a model's weights in its own names and shapes: attention
projections split by head (``[D, H, hd]``), linear kernels transposed, Gemma 3's
keys and values stacked into one ``kv_einsum``. A ``Rule`` ties one trainer tensor
to the Hugging Face tensors it is made of, with the two pure reshapes between them,
so conversion goes tensor by tensor in both directions and a round trip moves no
bit (transposes and reshapes only; no arithmetic).

Pure numpy, no jax: the conversion command needs only this and the files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlctl.core import families
from rlctl.core.errors import ConfigError

# the model_type values in config.json that rlctl trains and converts (core/families)
SUPPORTED = families.SUPPORTED


@dataclass(frozen=True)
class Dims:
    """The sizes a family's reshapes need (from config.json)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    tied: bool


@dataclass(frozen=True)
class Rule:
    """One trainer tensor (``key``, dotted path) made of ``hf`` tensors (in order)."""

    key: str
    hf: tuple[str, ...]
    to_trainer: Callable[[list[np.ndarray]], np.ndarray]
    to_hf: Callable[[np.ndarray], list[np.ndarray]]
    # "same": one HF tensor, unchanged; "t": one HF tensor [C, R] whose transpose,
    # reshaped, is the trainer's (``trainer.reshape(R, C) == hf.T``), which sources
    # build band by band (sources.py); "zeros": no HF tensor, a trainer tensor the
    # model has but never reads (Gemma 4's shared layers' key/value projections),
    # written as zeros and dropped on the way back; "other": anything else, whole
    kind: str = "other"
    # "t" rules: HF shape -> trainer shape, and trainer shape -> its [R, C] view
    t_shape: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None
    t_view: Callable[[tuple[int, ...]], tuple[int, int]] | None = None


def family_of(config: dict[str, Any]) -> str:
    """config.json's ``model_type`` if rlctl converts it, else one clear line."""
    return families.of_config(config).model_type


def dims_of(config: dict[str, Any]) -> Dims:
    try:
        heads = int(config["num_attention_heads"])
        return Dims(
            hidden=int(config["hidden_size"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            layers=int(config["num_hidden_layers"]),
            tied=bool(config.get("tie_word_embeddings", _tied_by_default(config))),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(
            f"config.json lacks what the model's shape needs ({e})",
            hint="copy or download the model again",
        ) from e


def _tied_by_default(config: dict[str, Any]) -> bool:
    fam = families.find(config.get("model_type"))
    return fam is not None and fam.tied_by_default


def transpose(x: np.ndarray, rows: int = 16) -> np.ndarray:
    """``x.T`` as a new C-contiguous array, copied a band of ``rows`` rows at a time.

    numpy's own ``ascontiguousarray(x.T)`` walks the source column-wise and misses
    the cache on every element: 0.92 s for a 32000 x 2048 float32 embedding here,
    against 0.11 s in bands of 16 rows (a plain copy takes 0.03 s). Nearly every
    byte of a Llama goes through a transpose, so this sets the conversion's speed.
    """
    out = np.empty(x.shape[::-1], x.dtype)
    for i in range(0, x.shape[0], rows):
        out[:, i : i + rows] = x[i : i + rows].T
    return out


def transpose_into(out: np.ndarray, band: np.ndarray, col: int, rows: int = 16) -> None:
    """``out[:, col:col + len(band)] = band.T``, in cache-friendly bands (see
    ``transpose``): how a source fills a transposed tensor from row ranges it reads
    one at a time, so the whole untransposed tensor is never held as well."""
    for i in range(0, band.shape[0], rows):
        piece = band[i : i + rows]
        out[:, col + i : col + i + len(piece)] = piece.T


def _same(xs: list[np.ndarray]) -> np.ndarray:
    return xs[0]


def _one(x: np.ndarray) -> list[np.ndarray]:
    return [x]


def _transposing(
    shape: Callable[[tuple[int, ...]], tuple[int, ...]],
    view: Callable[[tuple[int, ...]], tuple[int, int]],
) -> tuple[Any, ...]:
    """A "t" rule: trainer = transpose(HF [C, R]) reshaped to ``shape(HF shape)``;
    back: the trainer tensor viewed as ``view(its shape)`` = [R, C], transposed."""

    def fwd(xs: list[np.ndarray]) -> np.ndarray:
        return transpose(xs[0]).reshape(shape(xs[0].shape))

    def back(x: np.ndarray) -> list[np.ndarray]:
        return [transpose(x.reshape(view(x.shape)))]

    return fwd, back, "t", shape, view


def _2d(s: tuple[int, ...]) -> tuple[int, int]:
    return (s[0], s[1])


def _heads_in(n: int, hd: int) -> tuple[Any, ...]:
    """HF ``[n*hd, D]`` (out, in) <-> trainer ``[D, n, hd]``."""
    return _transposing(lambda h: (h[1], n, hd), lambda t: (t[0], n * hd))


def _heads_out(n: int, hd: int) -> tuple[Any, ...]:
    """HF o_proj ``[D, n*hd]`` <-> trainer ``[n, hd, D]``."""
    return _transposing(lambda h: (n, hd, h[0]), lambda t: (n * hd, t[2]))


def _stack_ndh(n: int, hd: int) -> tuple[Callable, Callable]:
    """HF projections ``[n*hd, D]`` each <-> Gemma's stacked ``[k, n, D, hd]``
    (or ``[n, D, hd]`` for one)."""

    def fwd(xs: list[np.ndarray]) -> np.ndarray:
        out = np.empty((len(xs), n, xs[0].shape[1], hd), xs[0].dtype)
        for k, x in enumerate(xs):
            for h, rows in enumerate(x.reshape(n, hd, x.shape[1])):
                out[k, h] = transpose(rows)
        return out[0] if len(xs) == 1 else out

    def back(x: np.ndarray) -> list[np.ndarray]:
        parts = [x] if x.ndim == 3 else list(x)
        return [np.concatenate([transpose(head) for head in p]) for p in parts]

    return fwd, back


def _unread(shape: tuple[int, ...]) -> tuple[Any, ...]:
    """A "zeros" rule's pair: no HF tensor <-> zeros of ``shape``."""

    def fwd(xs: list[np.ndarray]) -> np.ndarray:
        return np.zeros(shape, np.float32)

    def back(x: np.ndarray) -> list[np.ndarray]:
        return []

    return fwd, back, "zeros"


def _gemma4(config: dict[str, Any]) -> list[tuple[Rule, dict[str, tuple[int, ...]]]]:
    """Gemma 4's rules, each with the shapes of its HF tensors: Tunix's ``gemma4``
    tree (per-layer head sizes and key/value heads, keys and values stacked into
    ``kv_einsum`` or, where keys are values, one ``k_einsum``; per-layer inputs; the
    shared layers' own key/value projections and key norm, which Tunix builds and
    never reads and transformers does not have, as "zeros" rules)."""
    from rlctl.core.families import gemma4

    d = dims_of(config)
    vocab, ple = int(config["vocab_size"]), gemma4.ple_dim(config)
    out: list[tuple[Rule, dict[str, tuple[int, ...]]]] = []

    def add(key: str, hf: dict[str, tuple[int, ...]], pair: tuple[Any, ...]) -> None:
        out.append((Rule(key, tuple(hf), *pair), hf))

    ident = (_same, _one, "same")
    trans = _transposing(lambda h: (h[1], h[0]), _2d)
    D, L = d.hidden, d.layers
    add("embedder.input_embedding", {"model.embed_tokens.weight": (vocab, D)}, ident)
    if ple:
        add(
            "embedder.per_layer_input_embedding",
            {"model.embed_tokens_per_layer.weight": (vocab, L * ple)},
            (
                lambda xs: xs[0].reshape(vocab, L, ple),
                lambda x: [x.reshape(vocab, L * ple)],
                "other",
            ),
        )
        add(
            "embedder.per_layer_model_projection.w",
            {"model.per_layer_model_projection.weight": (L * ple, D)},
            _transposing(lambda h: (D, L, ple), lambda t: (D, L * ple)),
        )
        add(
            "embedder.per_layer_projection_norm.scale",
            {"model.per_layer_projection_norm.weight": (ple,)},
            ident,
        )
    for i, s in enumerate(gemma4.layer_shapes(config)):
        h, t = f"model.layers.{i}.", f"layers.{i}."
        attn = f"{h}self_attn."
        hd, kv = s.head_dim, s.kv_heads
        add(
            t + "attn.q_einsum.w",
            {attn + "q_proj.weight": (d.heads * hd, D)},
            (*_stack_ndh(d.heads, hd), "other"),
        )
        proj = "k_einsum" if s.k_eq_v else "kv_einsum"
        if s.shared:
            shape = (kv, D, hd) if s.k_eq_v else (2, kv, D, hd)
            add(t + f"attn.{proj}.w", {}, _unread(shape))
            add(t + "attn._key_norm.scale", {}, _unread((hd,)))
        else:
            names = ("k_proj",) if s.k_eq_v else ("k_proj", "v_proj")
            add(
                t + f"attn.{proj}.w",
                {attn + f"{n}.weight": (kv * hd, D) for n in names},
                (*_stack_ndh(kv, hd), "other"),
            )
        add(
            t + "attn.attn_vec_einsum.w",
            {attn + "o_proj.weight": (D, d.heads * hd)},
            _heads_out(d.heads, hd),
        )
        add(t + "attn._query_norm.scale", {attn + "q_norm.weight": (hd,)}, ident)
        if not s.shared:
            add(t + "attn._key_norm.scale", {attn + "k_norm.weight": (hd,)}, ident)
        for ours, theirs in (
            ("pre_attention_norm", "input_layernorm"),
            ("post_attention_norm", "post_attention_layernorm"),
            ("pre_ffw_norm", "pre_feedforward_layernorm"),
            ("post_ffw_norm", "post_feedforward_layernorm"),
        ):
            add(f"{t}{ours}.scale", {f"{h}{theirs}.weight": (D,)}, ident)
        add(t + "mlp.gate_proj.kernel", {h + "mlp.gate_proj.weight": (s.ffn, D)}, trans)
        add(t + "mlp.up_proj.kernel", {h + "mlp.up_proj.weight": (s.ffn, D)}, trans)
        add(t + "mlp.down_proj.kernel", {h + "mlp.down_proj.weight": (D, s.ffn)}, trans)
        if ple:
            add(t + "per_layer_input_gate.w", {h + "per_layer_input_gate.weight": (ple, D)}, trans)
            add(t + "per_layer_projection.w", {h + "per_layer_projection.weight": (D, ple)}, trans)
            add(
                t + "post_per_layer_input_norm.scale",
                {h + "post_per_layer_input_norm.weight": (D,)},
                ident,
            )
        add(t + "skip_scale", {h + "layer_scalar": (1,)}, ident)
    add("final_norm.scale", {"model.norm.weight": (D,)}, ident)
    return out


def _conv_pair() -> tuple[Any, ...]:
    """HF depthwise conv1d weight ``[C, 1, K]`` <-> trainer ``[K, C]``."""

    def fwd(xs: list[np.ndarray]) -> np.ndarray:
        return transpose(xs[0][:, 0, :])

    def back(x: np.ndarray) -> list[np.ndarray]:
        return [transpose(x)[:, None, :]]

    return fwd, back, "other"


def _qwen3_5(config: dict[str, Any]) -> list[tuple[Rule, dict[str, tuple[int, ...]]]]:
    """Qwen3.5's rules, each with the shapes of its HF tensors: rlctl's ``qwen3_5``
    tree (trainer/tunix_adapter/qwen3_5/model.py). Full-attention layers as Qwen3's
    (q_proj's rows per head are the query then its output gate, so ``[D, H, 2 hd]``);
    linear-attention layers' projections transposed, the depthwise convolution's
    ``[C, 1, K]`` as ``[K, C]``, the rest as they are. Norm weights stay raw (the
    model scales by ``1 + w``), so a round trip moves no bit."""
    from rlctl.core.families import qwen3_5

    fam = families.of_config(config)
    f = fam.config_fields(config)
    prefix = fam.tensor_prefix(config)  # a multimodal checkpoint's text model's
    D, F, V = f["embed_dim"], f["hidden_dim"], f["vocab_size"]
    H, K, hd = f["num_heads"], f["num_kv_heads"], f["head_dim"]
    kh, vh = f["linear_num_key_heads"], f["linear_num_value_heads"]
    dk, dv, kernel = f["linear_key_head_dim"], f["linear_value_head_dim"], f["conv_kernel"]
    conv = 2 * kh * dk + vh * dv
    out: list[tuple[Rule, dict[str, tuple[int, ...]]]] = []

    def add(key: str, hf: dict[str, tuple[int, ...]], pair: tuple[Any, ...]) -> None:
        out.append((Rule(key, tuple(hf), *pair), hf))

    ident = (_same, _one, "same")
    trans = _transposing(lambda h: (h[1], h[0]), _2d)
    add("embedder.input_embedding", {prefix + "embed_tokens.weight": (V, D)}, ident)
    for i, kind in enumerate(f["layer_types"]):
        h, t = f"{prefix}layers.{i}.", f"layers.{i}."
        if kind == qwen3_5.FULL:
            a = f"{h}self_attn."
            add(t + "attn.q_proj.w", {a + "q_proj.weight": (H * 2 * hd, D)}, _heads_in(H, 2 * hd))
            add(t + "attn.k_proj.w", {a + "k_proj.weight": (K * hd, D)}, _heads_in(K, hd))
            add(t + "attn.v_proj.w", {a + "v_proj.weight": (K * hd, D)}, _heads_in(K, hd))
            add(t + "attn.o_proj.w", {a + "o_proj.weight": (D, H * hd)}, _heads_out(H, hd))
            add(t + "attn.q_norm.w", {a + "q_norm.weight": (hd,)}, ident)
            add(t + "attn.k_norm.w", {a + "k_norm.weight": (hd,)}, ident)
        else:
            a, m = f"{h}linear_attn.", t + "linear_attn."
            add(m + "in_proj_qkv.w", {a + "in_proj_qkv.weight": (conv, D)}, trans)
            add(m + "in_proj_z.w", {a + "in_proj_z.weight": (vh * dv, D)}, trans)
            add(m + "in_proj_b.w", {a + "in_proj_b.weight": (vh, D)}, trans)
            add(m + "in_proj_a.w", {a + "in_proj_a.weight": (vh, D)}, trans)
            add(m + "conv1d.w", {a + "conv1d.weight": (conv, 1, kernel)}, _conv_pair())
            add(m + "dt_bias", {a + "dt_bias": (vh,)}, ident)
            add(m + "A_log", {a + "A_log": (vh,)}, ident)
            add(m + "norm.w", {a + "norm.weight": (dv,)}, ident)
            add(m + "out_proj.w", {a + "out_proj.weight": (D, vh * dv)}, trans)
        add(t + "input_layernorm.w", {h + "input_layernorm.weight": (D,)}, ident)
        add(t + "post_attention_layernorm.w", {h + "post_attention_layernorm.weight": (D,)}, ident)
        add(t + "mlp.gate_proj.kernel", {h + "mlp.gate_proj.weight": (F, D)}, trans)
        add(t + "mlp.up_proj.kernel", {h + "mlp.up_proj.weight": (F, D)}, trans)
        add(t + "mlp.down_proj.kernel", {h + "mlp.down_proj.weight": (D, F)}, trans)
    add("final_norm.w", {prefix + "norm.weight": (D,)}, ident)
    if not f["use_tied_embedding"]:
        add("lm_head.w", {"lm_head.weight": (V, D)}, trans)
    return out


# the families whose rules come per layer, with their HF shapes (``Layout.by_layer``)
_BY_LAYER = {"per_layer": _gemma4, "hybrid": _qwen3_5}


def rules(config: dict[str, Any]) -> list[Rule]:
    """Every trainer tensor of the model, in a streaming order (embedding, layers, head)."""
    fam = families.of_config(config)
    if fam.layout.by_layer:
        return [r for r, _ in _BY_LAYER[fam.layout.attention](config)]
    d = dims_of(config)
    out: list[Rule] = []

    def add(key: str, hf: str | tuple[str, ...], pair: tuple[Any, ...]) -> None:
        out.append(Rule(key, (hf,) if isinstance(hf, str) else hf, *pair))

    ident = (_same, _one, "same")
    trans = _transposing(lambda h: (h[1], h[0]), _2d)
    add("embedder.input_embedding", "model.embed_tokens.weight", ident)
    gemma = fam.layout.attention == "stacked_einsums"
    norm = "scale" if gemma else "w"
    for i in range(d.layers):
        h, t = f"model.layers.{i}.", f"layers.{i}."
        attn = f"{h}self_attn."
        if gemma:
            if d.heads == d.kv_heads:
                add(
                    t + "attn.qkv_einsum.w",
                    (attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"),
                    _stack_ndh(d.heads, d.head_dim),
                )
            else:
                add(t + "attn.q_einsum.w", attn + "q_proj.weight", _stack_ndh(d.heads, d.head_dim))
                add(
                    t + "attn.kv_einsum.w",
                    (attn + "k_proj.weight", attn + "v_proj.weight"),
                    _stack_ndh(d.kv_heads, d.head_dim),
                )
            add(
                t + "attn.attn_vec_einsum.w",
                attn + "o_proj.weight",
                _heads_out(d.heads, d.head_dim),
            )
            add(t + "attn._query_norm.scale", attn + "q_norm.weight", ident)
            add(t + "attn._key_norm.scale", attn + "k_norm.weight", ident)
            add(t + "pre_attention_norm.scale", h + "input_layernorm.weight", ident)
            add(t + "post_attention_norm.scale", h + "post_attention_layernorm.weight", ident)
            add(t + "pre_ffw_norm.scale", h + "pre_feedforward_layernorm.weight", ident)
            add(t + "post_ffw_norm.scale", h + "post_feedforward_layernorm.weight", ident)
        else:
            add(t + "attn.q_proj.w", attn + "q_proj.weight", _heads_in(d.heads, d.head_dim))
            add(t + "attn.k_proj.w", attn + "k_proj.weight", _heads_in(d.kv_heads, d.head_dim))
            add(t + "attn.v_proj.w", attn + "v_proj.weight", _heads_in(d.kv_heads, d.head_dim))
            add(t + "attn.o_proj.w", attn + "o_proj.weight", _heads_out(d.heads, d.head_dim))
            if fam.layout.qkv_bias:
                for p in "qkv":
                    add(t + f"attn.{p}_bias", attn + f"{p}_proj.bias", ident)
            if fam.layout.qk_norm:
                add(t + "attn.q_norm.w", attn + "q_norm.weight", ident)
                add(t + "attn.k_norm.w", attn + "k_norm.weight", ident)
            add(t + "input_layernorm.w", h + "input_layernorm.weight", ident)
            add(t + "post_attention_layernorm.w", h + "post_attention_layernorm.weight", ident)
        for p in ("gate_proj", "up_proj", "down_proj"):
            add(t + f"mlp.{p}.kernel", f"{h}mlp.{p}.weight", trans)
    add(f"final_norm.{norm}", "model.norm.weight", ident)
    if not d.tied:
        add("lm_head.w", "lm_head.weight", trans)
    return out


def hf_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape of every HF tensor the model must have (to check a folder before
    converting it: a missing or misshapen tensor is one line, not a reshape error)."""
    layout = families.of_config(config).layout
    if layout.by_layer:
        return {
            n: shape for _, hf in _BY_LAYER[layout.attention](config) for n, shape in hf.items()
        }
    d = dims_of(config)
    vocab = int(config.get("vocab_size") or 0)
    ffn = int(config.get("intermediate_size") or 0)
    shapes: dict[str, tuple[int, ...]] = {}
    for r in rules(config):
        for name in r.hf:
            leaf = name.rsplit(".", 2)[-2] if name.endswith((".weight", ".bias")) else name
            if name == "model.embed_tokens.weight" or name == "lm_head.weight":
                shapes[name] = (vocab, d.hidden)
            elif leaf in ("q_proj",):
                shapes[name] = (
                    (d.heads * d.head_dim, d.hidden)
                    if name.endswith("weight")
                    else (d.heads * d.head_dim,)
                )
            elif leaf in ("k_proj", "v_proj"):
                shapes[name] = (
                    (d.kv_heads * d.head_dim, d.hidden)
                    if name.endswith("weight")
                    else (d.kv_heads * d.head_dim,)
                )
            elif leaf == "o_proj":
                shapes[name] = (d.hidden, d.heads * d.head_dim)
            elif leaf in ("gate_proj", "up_proj"):
                shapes[name] = (ffn, d.hidden)
            elif leaf == "down_proj":
                shapes[name] = (d.hidden, ffn)
            elif leaf in ("q_norm", "k_norm"):
                shapes[name] = (d.head_dim,)
            else:
                shapes[name] = (d.hidden,)
    return shapes
