"""Where a model's Hugging Face folder comes from: embedded, local, or the hub."""

from __future__ import annotations

from pathlib import Path

from rlctl.core.config.models import DEFAULT_MODEL
from rlctl.core.errors import ConfigError


def resolve_model_dir(source: str) -> Path:
    if source == DEFAULT_MODEL:
        from rlctl.core.checkpoints.gguf import default_model_dir

        return default_model_dir()
    p = Path(source).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ConfigError(f"model folder {source!r} has no config.json")
        return p
    if source.count("/") == 1 and not source.startswith((".", "/")):
        return _from_hub(source)
    raise ConfigError(
        f"model {source!r} is neither a local folder nor a hub id",
        hint=f"use {DEFAULT_MODEL!r}, a folder with config.json, or org/name",
    )


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise ConfigError("loading from the hub needs huggingface_hub") from e
    try:
        path = snapshot_download(
            repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]
        )
    except Exception as e:  # offline / gated / missing: one message for all
        raise ConfigError(
            f"could not download {repo_id!r} from the Hugging Face hub ({type(e).__name__})",
            hint="check the id and network, or pass a local folder",
        ) from e
    return Path(path)
