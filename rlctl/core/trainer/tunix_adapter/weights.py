"""Loading a model's weights into Tunix: from a Hugging Face folder (safetensors) or
a trainer folder (an Orbax checkpoint already in Tunix's layout)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlctl.core import families
from rlctl.core.checkpoints.sources import TRAINER_MARKER
from rlctl.core.errors import ConfigError
from rlctl.core.families import Capabilities, Family
from rlctl.core.trainer.tunix_adapter.families import (
    _hashable,
    build_config,
    check_family,
    tunix_module,
)
from rlctl.core.trainer.tunix_adapter.shim import patch_llama3_rope_theta


@dataclass(frozen=True)
class ModelInfo:
    family: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    params: int
    dtype: str = "float32"  # of the parameters, and so of the KV cache
    # what the matmuls read (tunix_adapter/mixed.py; precision.compute_dtype decides)
    compute_dtype: str = "float32"

    @property
    def capabilities(self) -> Capabilities:
        """What the trainer may do with this model (its family's record, rlctl.core.families)."""
        return families.family(self.family).capabilities


def load_model(
    folder: str | Path, dtype: str = "float32", mesh: Any = None, compute_dtype: str = "float32"
) -> tuple[nnx.Module, ModelInfo]:
    """Build a Tunix model from a Hugging Face folder (config.json + safetensors), or
    from a trainer folder (``rlctl checkpoint-convert --to trainer``: config.json and
    an Orbax checkpoint of the model already in Tunix's layout, restored directly).
    ``compute_dtype`` is what its matmuls read (``mixed``), recorded in the info.

    With a ``mesh``, each parameter is placed sharded by the model's own sharding
    rules (FSDP over the ``fsdp`` axis) as it is loaded.
    """
    from rlctl.core.trainer.model.models import read_model_config

    folder = Path(folder)
    c = read_model_config(folder)
    family = check_family(folder)
    trainer_folder = (folder / TRAINER_MARKER).is_file()
    if not trainer_folder and not list(folder.glob("*.safetensors")):
        raise ConfigError(f"model folder {str(folder)!r} has no .safetensors files")
    fam = families.family(family)
    config = build_config(fam, c)
    jdtype = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    if hasattr(config, "param_dtype"):  # Gemma 3 defaults to bfloat16 parameters
        config = _hashable(dataclasses.replace(config, param_dtype=jdtype))
    # Tunix's llama3 module fixed before any model is built, whichever family's this is
    # (Llama and Mistral run on it; idempotent, and the module is small): no family is
    # told apart by its Tunix package here
    patch_llama3_rope_theta()
    try:
        if trainer_folder:
            model = _restore_trainer_folder(folder, fam, config, jdtype, mesh)
        else:
            params_mod = tunix_module(fam, fam.safetensors_loader)
            model = params_mod.create_model_from_safe_tensors(
                str(folder), config, mesh=mesh, dtype=jdtype
            )
    except (KeyError, ValueError) as e:  # weights that do not fit the config's shapes
        first = (str(e).splitlines() or [""])[0][:160]
        raise ConfigError(
            f"model folder {str(folder)!r}: its weights do not match its "
            f"config.json ({type(e).__name__}: {first})",
            hint="copy or download the model again",
        ) from e
    return model, _info(family, config, model, dtype, compute_dtype)


def _info(family: str, config: Any, model: nnx.Module, dtype: str, compute_dtype: str) -> ModelInfo:
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return ModelInfo(
        family=family,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        vocab_size=getattr(config, "vocab_size", None) or config.num_embed,
        params=n,
        dtype="bfloat16" if dtype == "bfloat16" else "float32",
        compute_dtype="bfloat16" if "bfloat16" in (dtype, compute_dtype) else "float32",
    )


def abstract_model(
    c: dict[str, Any],
    dtype: str = "float32",
    compute_dtype: str = "float32",
    extend: Callable[[nnx.Module], tuple[Any, ...]] | None = None,
) -> tuple[Any, ModelInfo]:
    """The model config.json ``c`` describes, without weights: every array a
    ``jax.ShapeDtypeStruct`` (parameters in ``dtype``), built as ``load_model`` builds
    it. What the fit check compiles the run's programs for (``run/fit.py``): shapes and
    dtypes are all a compiler needs, so a 1B or 8B model costs no memory here.

    ``extend(model)``, when given, runs in the same abstract trace on the built model
    (LoRA's adapters, the optimizer: they need the model's arrays, which exist only
    inside the trace) and its result, a tuple whose first item is the model (with its
    adapters), is returned in place of the model."""
    family = str(c.get("model_type"))
    if family not in families.FAMILIES:
        raise ConfigError(
            f"model type {family!r} is not supported by the trainer",
            hint=f"use one of: {', '.join(sorted(families.FAMILIES))}",
        )
    fam = families.family(family)
    config = build_config(fam, c)
    jdtype = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    if hasattr(config, "param_dtype"):
        config = _hashable(dataclasses.replace(config, param_dtype=jdtype))
    patch_llama3_rope_theta()
    m = tunix_module(fam)

    def build() -> Any:
        model = getattr(m, fam.model_class)(config, rngs=nnx.Rngs(0))
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda x: x.astype(jdtype), params))
        return extend(model) if extend is not None else model

    built = nnx.eval_shape(build)
    model = built if extend is None else built[0]
    return built, _info(family, config, model, dtype, compute_dtype)


def _restore_trainer_folder(
    folder: Path, fam: Family, config: Any, jdtype: Any, mesh: Any
) -> nnx.Module:
    """The model, restored from a trainer folder's Orbax checkpoint: shapes come from
    the model built abstractly (no memory), each array is read straight into its
    place (sharded over ``mesh`` when given) and cast to ``jdtype``."""
    import orbax.checkpoint as ocp

    m = tunix_module(fam)
    abstract = nnx.eval_shape(lambda: getattr(m, fam.model_class)(config, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    shardings = nnx.get_named_sharding(params, mesh) if mesh is not None else None

    def target(x: Any, s: Any = None) -> Any:
        return jax.ShapeDtypeStruct(x.shape, jdtype, sharding=s)

    pure = nnx.to_pure_dict(params)
    if shardings is not None:
        want = jax.tree.map(target, pure, nnx.to_pure_dict(shardings))
    else:
        want = jax.tree.map(target, pure)
    want = _str_keys(want)  # Orbax names every key by its string
    restored = ocp.StandardCheckpointer().restore(
        (folder / "checkpoint" / "default").absolute(), {"model": want}
    )["model"]
    nnx.replace_by_pure_dict(params, _like_keys(restored, pure))
    if mesh is None:
        params = jax.tree.map(lambda x: jnp.asarray(x, jdtype), params)
    # flax types split's states as a variadic tuple (two filters: two states)
    graphdef, _, rest = nnx.split(abstract, nnx.Param, ...)  # type: ignore[misc]
    rest = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), rest)
    return nnx.merge(graphdef, params, rest)


def _str_keys(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {str(k): _str_keys(v) for k, v in tree.items()}
    return tree


def _like_keys(tree: Any, like: Any) -> Any:
    """``tree`` (string keys) with the keys of ``like`` (ints where it has them)."""
    if isinstance(like, dict):
        return {k: _like_keys(tree[str(k)], v) for k, v in like.items()}
    return tree
