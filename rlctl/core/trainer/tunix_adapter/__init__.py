"""The only package of rlctl that imports Tunix: models, weights, KV cache, log-probs.

Tunix's names drift (``RLCluster``/``RLEngine``, ``loss_algo``/``algo_variant``);
keeping every Tunix call here means such a change touches this package. It also
carries rlctl's fixes for Tunix pitfalls measured on these machines, each shown to matter by
tests/core/trainer/test_pitfalls.py. Tunix's own GRPO loss,
which rlctl's prefix-shared update is checked and benchmarked against, is no part
of training: it lives in tests/core/trainer/yardsticks.py.

  shim.py      importing Tunix without its ``__init__``; patches of its pitfalls
  families.py  each family's Tunix ``ModelConfig`` (the records: rlctl/core/families/)
  weights.py   loading a model from a Hugging Face or trainer folder
  kv_cache.py  the sampler's KV cache and replicated weights
  logprobs.py  log-probs of completions (prefix-shared, chunked, rematerialised)
  mixed.py     matmuls in the run's compute dtype, summed in float32 (mixed precision)
  lora.py      LoRA adapters (qwix) on a frozen base
  llama/       the Llama architecture's own numerics (Llama, Mistral, Qwen 2 on Tunix's
               Llama): decode.py (weights laid out for a few rows), layers.py (one
               scanned body), mlp_grad.py (the update's decoder layer, its MLP gradient
               spelled out), compaction.py (MLPs on the real tokens only)
"""

from __future__ import annotations

from rlctl.core.trainer.tunix_adapter import shim  # first: Tunix's import
from rlctl.core.trainer.tunix_adapter.families import build_config, check_family
from rlctl.core.trainer.tunix_adapter.kv_cache import kv_cache, whole_weights
from rlctl.core.trainer.tunix_adapter.logprobs import (
    chunk_tokens,
    head_weight,
    shared_prefix_logps,
    softcapped,
    token_logps,
    trunk,
)
from rlctl.core.trainer.tunix_adapter.shim import patch_llama3_rope_theta
from rlctl.core.trainer.tunix_adapter.weights import ModelInfo, abstract_model, load_model

__all__ = [
    "ModelInfo",
    "abstract_model",
    "build_config",
    "check_family",
    "chunk_tokens",
    "head_weight",
    "kv_cache",
    "load_model",
    "patch_llama3_rope_theta",
    "shared_prefix_logps",
    "shim",
    "softcapped",
    "token_logps",
    "trunk",
    "whole_weights",
]
