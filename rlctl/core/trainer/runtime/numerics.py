"""Which of the trainer's numerics run on which backend: one table, and the measurement
behind each entry.

Why one table: the trainer was tuned for 100 commits on the one machine every session
has, a 2-core CPU, and each trick that made it fast there (packed MLP rows and a packed
vocabulary head behind ``lax.switch``, an own MLP gradient, a decode laid out weights
first, XLA:CPU's options, unrolled layers) ran on every backend. On one H200 (main
94b3f32, issue #44's measurement) the default update then took 90 s to compile and a
16 x 8 x 256 batch never started: each ``switch`` compiles every branch, per layer, and
every program held all 30 layers. So each choice is made here, per backend, from a
measurement on that backend; an accelerator runs the plain program (layers scanned, one
layer body compiled whatever the depth) until a run there shows a trick faster.

A row is passed in (``Update``, ``Sampler``, ``shared_prefix_logps``), never a module
global a benchmark assigns: a yardstick is ``dataclasses.replace(row, pack_head=False)``.
``RLCTL_NUMERICS=cpu|gpu|tpu`` picks another backend's row (a benchmark's or a test's:
the accelerator's programs on this CPU, or the CPU's tricks on a GPU to measure them).
Pure: the platform comes in as an argument (tests/core/trainer/test_numerics.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlctl.core.errors import ConfigError

ENV = "RLCTL_NUMERICS"


@dataclass(frozen=True)
class Numerics:
    """One backend's row of the table (``TABLE``); ``MEASURED`` says why each field is
    what it is there."""

    row: str  # which row this is: "cpu", "gpu" or "tpu"
    pack_mlp_rows: bool  # the update's MLPs on the real completion tokens only
    pack_head: bool  # the update's vocabulary head on the masked-in positions only
    own_mlp_gradient: bool  # Llama's MLP gradient spelled out (mlp_grad.gated_mlp)
    weights_first_decode: bool  # the sampler's decode laid out for a few rows (decode.py)
    # each group's prompt prefilled once (else every row: the rollout's P x G rows and an
    # eval batch of as many prompts are then one sampler program)
    prefill_once_per_group: bool
    xla_cpu_options: bool  # the update compiled with YNNPACK for its dots only
    partial_remat: bool  # by default the update recomputes 3/4 of its layers, then all
    scan_layers: bool  # one layer body compiled (lax.scan), not every layer unrolled
    # a checkpoint written by a thread from a device copy of the state while the next
    # steps run (checkpointing.Checkpoints), else within the step
    background_saves: bool
    # the step's metric reads the optimizer's gradient norm (else its own, computed apart)
    norm_once: bool = True
    # logits live at once in the update's log-softmax (above it: chunks, recomputed)
    logits_chunk_bytes: int = 256 * 2**20

    def describe(self) -> str:
        """The run's first-lines account of the row: what is on, and how layers run."""
        on = [label for name, label in _LABELS.items() if getattr(self, name)]
        layers = (
            "layers scanned (one layer body compiled)" if self.scan_layers else "layers unrolled"
        )
        saves = "saves in the background" if self.background_saves else "saves in the step"
        return (
            f"{self.row} row: "
            + (", ".join(on) or "none of the CPU's tricks")
            + f"; {layers}; {saves}"
        )


_LABELS = {
    "pack_mlp_rows": "packed MLP rows",
    "pack_head": "packed head",
    "own_mlp_gradient": "own MLP gradient",
    "weights_first_decode": "weights-first decode",
    "prefill_once_per_group": "prefill once per group",
    "xla_cpu_options": "XLA:CPU options",
    "partial_remat": "3/4 of the layers recomputed",
}

_CPU = Numerics(
    "cpu",
    pack_mlp_rows=True,
    pack_head=True,
    own_mlp_gradient=True,
    weights_first_decode=True,
    prefill_once_per_group=True,
    xla_cpu_options=True,
    partial_remat=True,
    scan_layers=False,
    background_saves=False,
    norm_once=False,
)
# An accelerator runs the plain program; its rows differ only in their name until a
# run there measures otherwise.
_ACCELERATOR = dict(
    pack_mlp_rows=False,
    pack_head=False,
    own_mlp_gradient=False,
    weights_first_decode=False,
    prefill_once_per_group=False,
    xla_cpu_options=False,
    partial_remat=False,
    scan_layers=True,
    background_saves=True,
    norm_once=True,
)
TABLE: dict[str, Numerics] = {
    "cpu": _CPU,
    "gpu": Numerics("gpu", **_ACCELERATOR),
    "tpu": Numerics("tpu", **_ACCELERATOR),
}

# The measurement behind each field: on the CPU (where each was measured), and why an
# accelerator's row differs. Every field but ``row`` has one (tested).
MEASURED: dict[str, str] = {
    "pack_mlp_rows": (
        "CPU: 0.92x the default update's time (bench_update.py --against whole-grid, 474 "
        "of 768 completion positions real, 2-core Zen 3 EPYC), for a compile of 81 s "
        "against 47 s. Accelerator: a 6-branch lax.switch in each of 30 layers, every "
        "branch compiled; part of the H200's 90 s update compile, never measured faster "
        "there."
    ),
    "pack_head": (
        "CPU: 0.97x the update's time (--against whole-head: 8.02 s against 8.24). "
        "Accelerator: a 12-branch switch forward and backward; the head is one matmul a "
        "GPU runs at its rate on the whole grid."
    ),
    "own_mlp_gradient": (
        "CPU: 0.95x the update (--against jax-mlp-grad; 0.92x in another run): XLA:CPU "
        "wrote a SiLU-derivative fusion element by element in transposed order, 27 ms a "
        "layer. Accelerator: JAX's own differentiation of the same layer (a GPU compiler "
        "fuses it); the mixed-precision layer itself (mlp_grad.decoder_layer) stays."
    ),
    "weights_first_decode": (
        "CPU: 1.38x the rollout (bench_rollout.py --against tunix-decode, 9.67 -> 7.02 s, "
        "Zen 3): XLA:CPU runs [16, D] x [D, F] at 2-5 GB/s of weights; plus the prompt's "
        "slots once per group (a decode step 0.84x). Accelerator: the plain decode "
        "through rlctl's mixed-precision layer, scanned; a GPU's matmuls take either "
        "layout, and laying the weights out is a copy per call."
    ),
    "prefill_once_per_group": (
        "CPU: the rollout's prefill 9x cheaper (2.00 s against 0.23 s: 2 prompts instead "
        "of 16, bench_rollout.py's prefill-only call). Accelerator: every row prefilled, "
        "so the rollout (P prompts x G rows) and an eval batch of P x G prompts are one "
        "sampler program (the H200's default run spent 15 s compiling the baseline "
        "eval's own program); a prefill of 16 rows is a few milliseconds there."
    ),
    "xla_cpu_options": (
        "CPU: 0.94x the update (--against ynn-reduce, twice): YNNPACK for the dots, XLA's "
        "loops for the reductions. Accelerator: XLA:CPU flags mean nothing to another "
        "backend's compiler."
    ),
    "partial_remat": (
        "CPU: 3/4 of the layers recomputed, then all where that does not fit: each layer "
        "kept costs 0.08 GiB of temporaries and saves part of its second forward (6.27 s "
        "all recomputed, 5.84 s with 20 of 30; --against remat-all, Zen 4). Accelerator: "
        "none (the batch usually fits; training.remat=true where it does not)."
    ),
    "scan_layers": (
        "CPU: unrolled, the faster per step: scanned, the default update took 9.11 s "
        "against 8.72 s (bench_update.py --against scan-layers, 5 calls each in turn; "
        "XLA's temporaries 1.36 against 1.26 GiB) and the rollout 3.90 against 3.76 s "
        "(bench_rollout.py --against scan-layers; a shared 2-core Zen 4 EPYC). "
        "Accelerator: one layer body compiled whatever the depth, as MaxText's "
        "scan_layers: the layers' programs do not grow with them (CI lowers the update "
        "and the sampler for cuda and tpu: 4 against 24 layers, the sampler 1.02x in "
        "ops, the whole update with AdamW 1.15x)."
    ),
    "background_saves": (
        "CPU: in the step, Orbax holding at most 256 MB of host copies at once (a save "
        "of the whole state at once raised the default run's resident memory by 0.8-1.3 "
        "GB, its peak); in the background it would keep a copy of the 1.6 GB state "
        "through the next step's update, in the same RAM. Accelerator: the state copied "
        "on the device (milliseconds) and written by a thread while the next steps run: "
        "the H200's default run stalled about 5 s at each of four saves between 0.24 s "
        "steps, the 1B run 21 s at its last."
    ),
    "norm_once": (
        "CPU: the metric's norm computed apart, as optax.global_norm, beside the "
        "optimizer's: the compiled update then stays bit for bit what it was (without "
        "it XLA fuses the gradients' last operations otherwise: after 3 steps of a tiny "
        "model 192 of 197k parameters differed by an ulp, and the default run's seed-0 "
        "trajectory with them: 0.219 -> 0.453 against 0.500). Accelerator: one norm, "
        "the optimizer's; a second costs about 6 operations per parameter array, which "
        "would make the update grow with depth again (test_lowering.py)."
    ),
    "logits_chunk_bytes": (
        "Every backend: 256 MB, so the default run's 16 x 48 x 49152 logits (151 MB) stay "
        "one chunk and a 16 x 8 x 256 batch's 6.4 GB never exist at once."
    ),
}


def platform_row(platform: str) -> str:
    """The table's row for JAX's backend name: ``cpu``, ``tpu``, else ``gpu``
    (``gpu``, ``cuda``, ``rocm``)."""
    return platform if platform in ("cpu", "tpu") else "gpu"


def choose(platform: str, override: str | None = None) -> Numerics:
    """The row for ``platform`` (JAX's backend), or ``override``'s (``RLCTL_NUMERICS``)."""
    name = (override or "").strip().lower()
    if name:
        if name not in TABLE:
            raise ConfigError(
                f"{ENV}={override!r}: one of {', '.join(TABLE)}",
                hint=f"unset {ENV} to use this backend's own",
            )
        return TABLE[name]
    return TABLE[platform_row(platform)]


def current() -> Numerics:
    """The row of JAX's default backend here, as ``RLCTL_NUMERICS`` may override it."""
    import jax

    return choose(jax.default_backend(), os.environ.get(ENV))
