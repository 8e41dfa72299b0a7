"""What the fit check found: each program's device memory per chip against the chip's.

Pure and light (no JAX): the run driver and the CLI import it to render a plan, and the
fit check's own process (``device_fit/check.py``) fills it in and prints it as JSON.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from rlctl.core.units import human_bytes

# what stops a run from fitting, when it does not
Reason = Literal["state", "update", "rollout", "eval"]
ProgramName = Literal["update", "rollout", "eval"]  # a program is a reason a run may not fit


class ProgramFit(BaseModel):
    """One compiled program's device memory on one chip (XLA's memory analysis)."""

    name: ProgramName
    arguments: int  # bytes of its inputs on one device (the state's shard among them)
    temporaries: int
    outputs: int  # not written over a donated input
    peak: int  # what the device holds while it runs: the resident state and its needs
    compile_seconds: float
    micro_batch: int | None = None  # the update's sequences per micro-batch
    # the CPU's own numerics found in the compiled program (by their named scopes):
    # none belongs in an accelerator's program (the numerics table's rows)
    cpu_only: list[str] = []


class DeviceFit(BaseModel):
    """The run's update, rollout and eval compiled for ``target`` without it: the peak
    device memory per chip beside the chip's (``line``), and what makes it fit when it
    does not (``reason``; the run driver words the fix with the catalog's sizes)."""

    target: str  # "v6e-16 x2"
    checked: bool = True
    why_not: str | None = None  # not checked: why (and what to install)
    device: str = ""  # "TPU v6e", "NVIDIA H200 141GB HBM3e"
    unit: str = "chip"  # what one device is called: chip, GPU
    devices: int = 0
    device_memory: int = 0  # bytes
    usable: int = 0  # what a run may fill (the allocator's headroom kept)
    state: int = 0  # model, optimizer and reference weights resident on one device
    peak: int = 0
    fits: bool = True
    reason: Reason | None = None
    programs: list[ProgramFit] = []
    compile_seconds: float = 0.0
    notes: list[str] = []
    # filled by the run driver: the setting that makes the run fit
    fix: str | None = None

    def program(self, name: str) -> ProgramFit | None:
        return next((p for p in self.programs if p.name == name), None)

    @property
    def amount(self) -> str:
        """``11.20 GiB of 27.20 GiB per chip`` (and where the peak is, when it does not fit)."""
        worst = max(self.programs, key=lambda p: p.peak, default=None)
        if self.fits:
            at = ""
        elif self.reason == "state":
            at = " in its weights and optimizer state alone"
        else:
            at = f" in the {worst.name if worst else self.reason}"
        return f"{human_bytes(self.peak)} of {human_bytes(self.usable)} per {self.unit}{at}"

    @property
    def line(self) -> str:
        """``fits: 11.20 GiB of 27.20 GiB per chip, v6e-16 x2, compiled in 48 s``."""
        if not self.checked:
            return f"not checked: {self.why_not}"
        verdict = "fits" if self.fits else "does not fit"
        took = f", compiled in {self.compile_seconds:.0f} s" if self.compile_seconds else ""
        return f"{verdict}: {self.amount}, {self.target}{took}"

    def detail(self) -> list[str]:
        """One line per program: what it holds at its peak on one device."""
        out = []
        for p in self.programs:
            micro = f", micro-batches of {p.micro_batch}" if p.micro_batch else ""
            out.append(
                f"{p.name}: {human_bytes(p.peak)} at its peak (temporaries "
                f"{human_bytes(p.temporaries)}{micro}; compiled in {p.compile_seconds:.0f} s)"
            )
            if p.cpu_only:
                out.append(
                    f"{p.name} holds the CPU's {', '.join(p.cpu_only)} (a bug in rlctl's "
                    "numerics table: please report it)"
                )
        return out
