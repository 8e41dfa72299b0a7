"""Where a model's Hugging Face folder comes from (embedded, local, or the hub), and
a cheap check that its files can be loaded at all.

The check reads only ``config.json`` and each safetensors header (a few KB), so a
damaged download or a truncated copy is one clear line before anything is written,
not a ``MemoryError`` or ``cannot reshape`` from deep inside the loader after the
run was created.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.core import families
from rlctl.core.checkpoints.sources import TRAINER_MARKER
from rlctl.core.config.models import DEFAULT_MODEL
from rlctl.core.errors import ConfigError

# a safetensors header is JSON of a few KB per hundred tensors; anything near this
# is a file that is not safetensors at all (random bytes read as a huge length)
_MAX_HEADER = 100 * 1024 * 1024
_REFETCH = "copy or download the model again"


def resolve_model_dir(source: str, on_convert: Callable[[], None] | None = None) -> Path:
    """The model's HF folder. ``on_convert`` is called before the default model is
    converted (its first use: tens of seconds), so a user can be told why it waits."""
    if source == DEFAULT_MODEL:
        from rlctl.core.checkpoints.gguf import default_model_dir

        return default_model_dir(on_convert=on_convert)
    p = Path(source).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ConfigError(
                f"model {source!r} is a file, not a folder",
                hint="pass the folder that holds config.json and *.safetensors",
            )
        check_model_folder(p)
        return p
    if source.count("/") == 1 and not source.startswith((".", "/")):
        return check_model_folder(_from_hub(source))
    raise ConfigError(
        f"model {source!r} is neither a local folder nor a hub id",
        hint=f"use {DEFAULT_MODEL!r}, a folder with config.json, or org/name",
    )


def source_config(source: str) -> tuple[dict[str, Any] | None, str | None]:
    """(config.json, None) of a model source without its weights, or (None, why it
    cannot be read here): what the fit check builds the model's shapes from. The
    embedded model (converted on first use), a local folder, or a hub id's config.json
    alone (a pod's own path, such as a GCS FUSE mount, is not readable here)."""
    if source == DEFAULT_MODEL:
        return read_model_config(resolve_model_dir(source)), None
    if Path(source).expanduser().is_dir():  # its weights are the pods' to read
        return read_model_config(Path(source).expanduser()), None
    if source.count("/") == 1 and not source.startswith((".", "/")):
        try:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(source, "config.json")
        except Exception as e:  # offline, gated, missing: the check says so, nothing else
            first = (str(e).splitlines() or [""])[0][:120]
            why = f"{type(e).__name__}: {first}"
            return None, f"cannot read {source}'s config.json from the hub here ({why})"
        return read_model_config(Path(path).parent), None
    return None, f"model {source!r} is not readable here (a path in the pods' image or mount)"


def read_model_config(folder: Path) -> dict[str, Any]:
    """``config.json`` as a dict, or a ConfigError naming the file and what is wrong."""
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise ConfigError(f"model folder {str(folder)!r} has no config.json")
    try:
        data = json.loads(cfg.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{cfg}: not valid JSON ({_why(e)})", hint=_REFETCH) from e
    except RecursionError:
        raise ConfigError(f"{cfg}: nested too deeply to read", hint=_REFETCH) from None
    except OSError as e:
        raise ConfigError(f"cannot read {cfg} ({e.strerror or e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{cfg}: a JSON {type(data).__name__}, not an object", hint=_REFETCH)
    return data


def check_model_folder(folder: Path) -> Path:
    """The folder, after its config.json and every safetensors header were read and
    each tensor was found to lie inside its file. A trainer folder (``rlctl
    checkpoint-convert --to trainer``) has an Orbax checkpoint instead of
    safetensors: its marker, written last, says the conversion finished."""
    config = read_model_config(folder)
    if (folder / TRAINER_MARKER).is_file():
        if not (folder / "checkpoint" / "default" / "_METADATA").is_file():
            raise ConfigError(
                f"trainer folder {str(folder)!r} has no Orbax checkpoint",
                hint="convert the model again with rlctl checkpoint-convert",
            )
        return folder
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model folder {str(folder)!r} has no .safetensors files")
    shapes: dict[str, list[int]] = {}
    for f in files:
        shapes.update(check_safetensors(f))
    check_layers(folder, config, shapes)
    return folder


def check_layers(folder: Path, config: dict[str, Any], shapes: dict[str, list[int]]) -> None:
    """The weights fit the config where a mismatch would fail only inside the loader:
    the embedding is [vocab_size, hidden_size], and every one of num_hidden_layers
    layers has the tensors layer 0 has, with the same shapes."""
    where = f"model folder {str(folder)!r}"
    embed = shapes.get("model.embed_tokens.weight")
    want = [config.get("vocab_size"), config.get("hidden_size")]
    if embed is not None and all(isinstance(x, int) for x in want) and embed != want:
        raise ConfigError(
            f"{where}: model.embed_tokens.weight is {embed}, config.json "
            f"says [vocab_size, hidden_size] = {want}",
            hint=_REFETCH,
        )
    fam = families.find(config.get("model_type"))
    if fam is not None and fam.layout.by_layer:
        # layers of differing shapes (Gemma 4's global layers, KV-shared layers): each
        # tensor against the layout's own shape for it
        _check_against_layout(where, config, shapes)
        return
    n = config.get("num_hidden_layers")
    layer0 = {
        k[len("model.layers.0.") :]: v for k, v in shapes.items() if k.startswith("model.layers.0.")
    }
    if not isinstance(n, int) or not layer0:
        return
    for i in range(n):
        for suffix, shape in layer0.items():
            name = f"model.layers.{i}.{suffix}"
            if name not in shapes:
                raise ConfigError(
                    f"{where}: tensor {name!r} is missing (config.json has {n} layers)",
                    hint=_REFETCH,
                )
            if shapes[name] != shape:
                raise ConfigError(
                    f"{where}: tensor {name!r} is {shapes[name]}, layer 0's is {shape}",
                    hint=_REFETCH,
                )


def _check_against_layout(where: str, config: dict[str, Any], shapes: dict[str, list[int]]) -> None:
    """Every tensor the layout reads (``layout.hf_shapes``) is there, of its shape."""
    from rlctl.core.checkpoints.layout import hf_shapes

    try:
        want = hf_shapes(config)
    except (KeyError, TypeError, ValueError):
        return  # config.json's own faults are the config mapping's to name
    for name, shape in want.items():
        if name not in shapes:
            raise ConfigError(f"{where}: tensor {name!r} is missing", hint=_REFETCH)
        if shapes[name] != list(shape):
            raise ConfigError(
                f"{where}: tensor {name!r} is {shapes[name]}, config.json makes it {list(shape)}",
                hint=_REFETCH,
            )


def check_safetensors(path: Path) -> dict[str, list[int]]:
    """A safetensors file is an 8-byte header length, a JSON header, then the data;
    every tensor's ``data_offsets`` must end inside the data (a cut copy does not).
    Returns each tensor's shape."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if n < 2 or n > min(size - 8, _MAX_HEADER):
                raise ConfigError(
                    f"{path}: not a safetensors file (bad header length)", hint=_REFETCH
                )
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read {path} ({e.strerror or e})") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"{path}: not a safetensors file (header: {_why(e)})", hint=_REFETCH
        ) from e
    if not isinstance(header, dict):
        raise ConfigError(
            f"{path}: not a safetensors file (header is not an object)", hint=_REFETCH
        )
    data = size - 8 - n
    shapes: dict[str, list[int]] = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        shape = t.get("shape") if isinstance(t, dict) else None
        shapes[name] = list(shape) if isinstance(shape, list) else []
        offsets = t.get("data_offsets") if isinstance(t, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets)
        ):
            raise ConfigError(f"{path}: tensor {name!r} has no valid data_offsets", hint=_REFETCH)
        if offsets[1] > data:
            raise ConfigError(
                f"{path}: truncated ({data + 8 + n} bytes; tensor {name!r} ends at "
                f"{offsets[1] + 8 + n})",
                hint=_REFETCH,
            )
    return shapes


def _why(e: Exception) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at line {e.lineno}"
    return "not UTF-8"


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise ConfigError("loading from the hub needs huggingface_hub") from e
    try:
        path = snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*"])
    except Exception as e:  # offline / gated / missing: one message for all
        raise ConfigError(
            f"could not download {repo_id!r} from the Hugging Face hub ({type(e).__name__})",
            hint="check the id and network, or pass a local folder",
        ) from e
    return Path(path)
