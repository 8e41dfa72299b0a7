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
    # tanh soft-capping of the logits, logits = c * tanh(logits / c) (Gemma 4's 30);
    # None: none. Every head rlctl computes applies it (token_logps, the sampler)
    logit_softcap: float | None = None

    @property
    def capabilities(self) -> Capabilities:
        """What the trainer may do with this model (its family's record, rlctl.core.families)."""
        return families.family(self.family).capabilities


def split_rest(node: Any, wanted: Any) -> tuple[Any, Any, Any]:
    """``nnx.split(node, wanted, ...)``: the graph, the state ``wanted`` selects and the
    rest. Any: flax types split's states as a variadic tuple (two filters, two states),
    which mypy cannot unpack into three."""
    from flax import nnx

    parts: Any = nnx.split(node, wanted, ...)
    return parts[0], parts[1], parts[2]


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
        elif fam.layout.by_layer:
            model = _load_by_layout(folder, fam, config, jdtype, mesh)
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
        logit_softcap=getattr(config, "final_logit_softcap", None),
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
    found = families.find(c.get("model_type"))
    if found is None:
        raise ConfigError(
            f"model type {str(c.get('model_type'))!r} is not supported by the trainer",
            hint=f"use one of: {', '.join(sorted(families.FAMILIES))}",
        )
    fam, family = found, found.model_type
    config = build_config(fam, c)
    jdtype = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    if hasattr(config, "param_dtype"):
        config = _hashable(dataclasses.replace(config, param_dtype=jdtype))
    patch_llama3_rope_theta()

    def build() -> Any:
        model = new_model(fam, config)
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda x: x.astype(jdtype), params))
        return extend(model) if extend is not None else model

    built = nnx.eval_shape(build)
    model = built if extend is None else built[0]
    return built, _info(family, config, model, dtype, compute_dtype)


def new_model(fam: Family, config: Any) -> nnx.Module:
    """The family's Tunix model of ``config`` (random weights; under ``eval_shape``, none).

    Pitfall: Tunix's Gemma 4 keeps its KV-sharing plan as a list and a set, static
    attributes of the graphdef, which must hash (step.py's cache of compiled programs
    and ``jax.jit``'s static arguments are keyed by it): ``TypeError: unhashable type:
    'list'`` at the first sampler call. They are made a tuple and a frozenset here."""
    model = getattr(tunix_module(fam), fam.model_class)(config, rngs=nnx.Rngs(0))
    for name, kind in (("kv_cache_sharing_patterns", tuple), ("shared_layer_origins", frozenset)):
        value = getattr(model, name, None)
        if isinstance(value, (list, set)):
            setattr(model, name, kind(value))
    return model


def _restore_trainer_folder(
    folder: Path, fam: Family, config: Any, jdtype: Any, mesh: Any
) -> nnx.Module:
    """The model, restored from a trainer folder's Orbax checkpoint: shapes come from
    the model built abstractly (no memory), each array is read straight into its
    place (sharded over ``mesh`` when given) and cast to ``jdtype``."""
    import orbax.checkpoint as ocp

    abstract = nnx.eval_shape(lambda: new_model(fam, config))
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
    graphdef, _, rest = split_rest(abstract, nnx.Param)
    rest = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), rest)
    return nnx.merge(graphdef, params, rest)


def _load_by_layout(folder: Path, fam: Family, config: Any, jdtype: Any, mesh: Any) -> nnx.Module:
    """The model from a Hugging Face folder through rlctl's layout (``checkpoints/
    layout.py``), tensor by tensor, as ``checkpoint-convert --to trainer`` writes it.

    Pitfall: Tunix 0.1.7's Gemma 4 loader (``params_safetensors``) matches
    ``model.language_model.*`` (the multimodal checkpoint's names) or bare names only,
    so a ``Gemma4ForCausalLM`` checkpoint's ``model.*`` tensors are all skipped, and it
    leaves the shared layers' unread key/value projections unset (``None``), which
    fails its own sharding step."""
    from rlctl.core.checkpoints import layout
    from rlctl.core.checkpoints.sources import open_source

    source = open_source(str(folder))
    abstract = nnx.eval_shape(lambda: new_model(fam, config))
    params = nnx.state(abstract, nnx.Param)
    flat = {}
    for rule in layout.rules(source.config):
        flat[rule.key] = rule.to_trainer([source.read(n) for n in rule.hf])
    pure = nnx.to_pure_dict(params)
    shardings = nnx.to_pure_dict(nnx.get_named_sharding(params, mesh)) if mesh is not None else None

    def fill(tree: Any, path: tuple[str, ...] = (), shard: Any = None) -> Any:
        if isinstance(tree, dict):
            return {
                k: fill(v, (*path, str(k)), None if shard is None else shard[k])
                for k, v in tree.items()
            }
        key = ".".join(path)
        if key not in flat:
            raise KeyError(f"no tensor for {key}")
        arr = np.asarray(flat.pop(key))
        if arr.shape != tuple(tree.shape):
            raise ValueError(f"{key}: shape {arr.shape}, the model's {tuple(tree.shape)}")
        value = jnp.asarray(arr, jdtype)
        return jax.device_put(value, shard) if shard is not None else value

    nnx.replace_by_pure_dict(params, fill(pure, (), shardings))
    graphdef, _, rest = split_rest(abstract, nnx.Param)
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
