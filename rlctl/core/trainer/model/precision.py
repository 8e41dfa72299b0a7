"""Which dtype a run's matmuls read: ``model.compute_dtype`` (the update's) and
``rollout.compute_dtype`` (the sampler's) resolved for this machine.

Pure: the platform and the CPU's flags come in as arguments, so the rule that the
docs and ``--help`` state is the rule the code runs (tests/core/trainer/test_precision.py).

* ``float32``: every matmul reads float32 (the weights' own dtype).
* ``bfloat16``: the matmuls read bfloat16 and sum in float32; the weights, Adam's
  moments, norms, softmax, the loss and the gradients' sums stay float32
  (tunix_adapter/mixed.py).
* ``auto``, the update: ``bfloat16`` on a GPU or a TPU, ``float32`` on a CPU. On a
  CPU with AVX512-BF16 bfloat16 updates were faster but learned less over five seeds
  (docs/decisions/trainer.md, docs/mixed-precision.md): the default keeps what learns,
  and the first lines say how to trade. Without those instructions (or AMX) a bfloat16
  matmul is emulated, slower than float32.
* ``auto``, the sampler: ``bfloat16`` wherever it is native (those CPUs too), unless
  ``model.compute_dtype=float32`` was asked for; else the update's. The split (bfloat16
  sampling, float32 updates) learned within five seeds' noise of float32 where bfloat16
  in both learned less (docs/decisions/trainer.md): sampling only chooses which
  completions the update sees, and the
  update scores them in its own precision (the loss never reads the sampler's
  log-probs on the vanilla engine).
* With ``rollout.engine=vllm``, ``model.dtype``: vLLM samples in it, and the
  trainer's log-probs should be the policy it samples.

Weights stored in bfloat16 (``model.dtype=bfloat16``) are read as they are.
Only Llama-family models without LoRA adapters run rlctl's own layers
(``decode.fits``); the others run Tunix's layers, whose matmuls read the weights'
dtype whatever this says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# the CPU flags (as /proc/cpuinfo names them) of native bfloat16 dot products
NATIVE_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
ACCELERATORS = ("gpu", "tpu", "cuda", "rocm")


@dataclass(frozen=True)
class Precision:
    dtype: str  # what the update's matmuls read: "float32" or "bfloat16"
    why: str  # one line for the run's first lines
    warning: str | None = None  # said too when the choice is likely slow
    sampler: str = ""  # what the sampler's matmuls and decode weights read ("": dtype)

    @property
    def sampling(self) -> str:
        return self.sampler or self.dtype


def cpu_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """This CPU's feature flags (Linux); empty where /proc/cpuinfo is not."""
    try:
        text = path.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def native(platform: str, flags: frozenset[str]) -> str | None:
    """What multiplies bfloat16 natively here, in a few words, or None."""
    if platform in ACCELERATORS:
        return f"a {platform.upper()}"
    have = [f for f in NATIVE_CPU_FLAGS if f in flags]
    return f"this CPU's {have[0].upper().replace('_', '-')}" if have else None


def choose(
    requested: str,
    param_dtype: str,
    platform: str,
    flags: frozenset[str] | None = None,
    engine: str = "vanilla",
    sampling: str = "auto",
) -> Precision:
    """``model.compute_dtype`` (``auto``, ``float32`` or ``bfloat16``) for the update and
    ``rollout.compute_dtype`` (the same three) for the sampler, for weights of
    ``param_dtype`` on ``platform`` (JAX's backend) with the CPU ``flags``, the
    completions sampled by ``engine``."""
    if param_dtype == "bfloat16":
        return Precision("bfloat16", "bfloat16 weights and matmuls (model.dtype=bfloat16)")
    if requested == "auto" and engine == "vllm":
        return Precision("float32", "float32 matmuls (auto: vLLM samples in model.dtype)")
    hw = native(platform, cpu_flags() if flags is None else flags)
    update = _update(requested, platform, hw)
    if engine == "vllm":  # vLLM samples in model.dtype whatever rollout.compute_dtype says
        return update
    if sampling != "auto":
        sampler, how = sampling, f"rollout.compute_dtype={sampling}"
    elif requested == "auto" and hw is not None:
        sampler, how = "bfloat16", f"auto: {hw}"
    else:  # no native bfloat16 here, or the update's dtype asked for: the sampler's too
        sampler, how = update.dtype, ""
    if sampler == update.dtype:
        return update
    why = f"{update.why}; sampling reads {sampler} ({how})"
    warning = update.warning
    if sampler == "bfloat16" and hw is None:
        warning = _emulated("rollout.compute_dtype")
    return Precision(update.dtype, why, warning, sampler)


def _emulated(setting: str) -> str:
    """The warning for bfloat16 asked of ``setting`` on a CPU that emulates it."""
    return (
        "this CPU has no AVX512-BF16 or AMX: its bfloat16 matmuls are emulated and "
        f"likely slower than float32 (--set {setting}=float32)"
    )


def _update(requested: str, platform: str, hw: str | None) -> Precision:
    """What the update's matmuls read (``model.compute_dtype``), and why."""
    on_accelerator = platform in ACCELERATORS
    if requested == "float32" or (requested == "auto" and not on_accelerator):
        if requested == "float32":
            why = "float32 matmuls (model.compute_dtype=float32)"
        elif hw is None:
            why = "float32 matmuls (auto on a CPU; no native bfloat16 here: no AVX512-BF16 or AMX)"
        else:
            why = (
                f"float32 matmuls in the update (auto on a CPU; {hw} makes bfloat16 "
                "faster, but updates in it learned less: --set "
                "model.compute_dtype=bfloat16 to trade)"
            )
        return Precision("float32", why)
    mixed = "bfloat16 matmuls summed in float32, float32 weights and optimizer"
    if hw is None:
        return Precision(
            "bfloat16",
            f"{mixed} (model.compute_dtype=bfloat16)",
            warning=_emulated("model.compute_dtype"),
        )
    how = "model.compute_dtype=bfloat16" if requested == "bfloat16" else f"auto: {hw}"
    return Precision("bfloat16", f"{mixed} ({how})")
