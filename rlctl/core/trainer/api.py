"""The trainer's one public face: what the run driver (``rlctl.core.runs``) and the
benchmarks' run path call, and nothing else of the trainer's modules.

* ``preflight(spec, emit)``: fail on a bad dataset, model, prompt length, LoRA
  configuration or reward before a run folder is written;
* ``load_libraries(emit)``: import JAX, Flax and Tunix, saying so first;
* ``train(spec, run, progress, on_status, ...)``: one run trained, checkpointed and
  evaluated (``loop.Trainer``), with an optional ``Watch`` around its phases;
* the fit check's pieces (``DeviceFit``, ``fit_missing_extra``, ``source_config``,
  ``FIT_MODULE``: the process that compiles a run's programs for an accelerator that
  is not here, ``device_fit/``);
* the events a run emits (``Stage``, ``phase``, ``parse_phase``: events.py), the stop
  protocol between the driver's signal handlers and the loop (``stops``), the rollout
  engine a spec picks (``Engine``, ``pick_engine``), the processes of a multi-host run
  (``initialize``, ``agree``), and the checks and refusals a resume makes before it
  writes anything (``recover_candidates``, ``nothing_to_recover``, ``refusal``,
  ``restore_noise``).

Importing this module is light (no JAX: ``rlctl --help`` imports the run driver);
the heavy trainer is imported inside ``preflight``, ``load_libraries`` and ``train``.
The modules behind it are the trainer's own to rearrange; tests/test_architecture.py
holds ``rlctl.core.runs`` to this module.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from rlctl.core.errors import ConfigError
from rlctl.core.trainer.checkpoint.checkpoint_damage import (
    nothing_to_recover,
    recover_candidates,
    refusal,
)
from rlctl.core.trainer.checkpoint.checkpoint_noise import restore_noise
from rlctl.core.trainer.device_fit.report import DeviceFit, ProgramFit
from rlctl.core.trainer.rollout.engines import Engine
from rlctl.core.trainer.rollout.engines import pick as pick_engine
from rlctl.core.trainer.runtime import stops
from rlctl.core.trainer.runtime.distributed import Topology, agree, initialize
from rlctl.core.trainer.runtime.events import Stage, parse_phase, phase

if TYPE_CHECKING:
    from rlctl.core.config.models import RunSpec
    from rlctl.core.phases import StatusUpdate
    from rlctl.core.store.base import RunDir

Progress = Callable[[dict[str, Any]], None]
OnStatus = Callable[["StatusUpdate"], None]  # what status.json should now say
# around each phase: (its name, the object doing it) -> the context it runs in (loop.Watch)
Watch = Callable[[str, Any], AbstractContextManager[Any]]

# the fit check's process: ``python -m`` it with a JSON request (device_fit/__main__.py)
FIT_MODULE = "rlctl.core.trainer.device_fit"
FIT_PROGRESS = "rlctl-fit: "  # its progress lines on stderr start with this

__all__ = [
    "FIT_MODULE",
    "FIT_PROGRESS",
    "DeviceFit",
    "Engine",
    "OnStatus",
    "ProgramFit",
    "Progress",
    "Stage",
    "Topology",
    "Watch",
    "agree",
    "fit_fix",
    "fit_missing_extra",
    "initialize",
    "load_libraries",
    "nothing_to_recover",
    "parse_phase",
    "phase",
    "pick_engine",
    "preflight",
    "recover_candidates",
    "refusal",
    "restore_noise",
    "source_config",
    "stops",
    "train",
]


def preflight(spec: RunSpec, emit: Progress) -> None:
    """Fail on a bad dataset, model, prompt length or reward before anything is written.

    The data first: reading it needs no trainer library, so a file with no usable
    columns, or a hub dataset that is offline and not cached, fails in a second or
    two, not after JAX has loaded."""
    from rlctl.core.trainer.data import load_source
    from rlctl.core.trainer.model.models import resolve_model_dir
    from rlctl.core.trainer.model.tokenizer import ChatTokenizer
    from rlctl.core.trainer.rewards import Sample, resolve, score

    source = load_source(spec.data, spec.eval.size)
    folder = resolve_model_dir(
        spec.model.source,
        on_convert=lambda: emit(
            phase(Stage.CONVERTING, "converting the default model to safetensors (first use only)")
        ),
    )
    load_libraries(emit)
    from rlctl.core.trainer.tunix_adapter import check_family
    from rlctl.core.trainer.tunix_adapter.lora import check_lora

    check_lora(check_family(folder), spec.training)  # a bad LoRA config: no run folder
    tokenizer = ChatTokenizer(folder)  # its files parse and name an eos token
    if source.finite:  # every prompt of the data fits rollout.max_prompt_tokens
        from rlctl.core.trainer.rollout.rollout import Rollout

        prompts = source.eval_set + source.every_train()
        Rollout(
            spec.rollout,
            tokenizer,
            sampler=None,  # type: ignore[arg-type]  # set by the caller before use
            prompt=spec.prompt,
        ).probe(prompts, complete=True)
    # one trial call of each reward, in its own form, on the data's first problem
    # answered right: a reward that raises or returns no number fails here, not at step 1
    first = source.batch(0, 1)[0]
    trial = Sample(
        f"<answer>{first.answer}</answer>",
        first.question,
        first.answer,
        first.columns,
        first.messages,
        [0],
    )

    def said(line: str) -> None:
        emit({"event": "message", "message": line})

    for reward in resolve(spec.rewards):
        try:
            score([reward], [trial], said)
        except ConfigError as e:  # no run exists yet, so there is nothing to resume
            raise ConfigError(
                e.message,
                hint="fix the reward function and run the same "
                "'rlctl train' again (nothing was written)",
            ) from e


def load_libraries(emit: Progress) -> None:
    """Import the trainer (JAX, Flax, Tunix: seconds on a fast machine, more on a busy
    one), saying so first unless this process already has."""
    import sys

    if "rlctl.core.trainer.tunix_adapter" not in sys.modules:
        emit(phase(Stage.LIBRARIES, "loading libraries (jax, flax, tunix)"))
    import rlctl.core.trainer.run.loop
    import rlctl.core.trainer.tunix_adapter  # noqa: F401


def train(
    spec: RunSpec,
    run: RunDir,
    progress: Progress | None,
    on_status: OnStatus,
    topology: Topology | None = None,
    recover: bool = False,
    watch: Watch | None = None,
) -> dict[str, Any]:
    """Train ``run`` as ``spec`` says, from its latest intact checkpoint (``recover``:
    first bring back the checkpoints set aside whose data may be intact); the
    baseline and final evals. ``on_status``: what status.json should now say (process
    0's; the others get a no-op). ``watch``: a hook around each rollout, update,
    checkpoint save and eval (``Watch``; a benchmark's)."""
    from rlctl.core.trainer.rollout.placement import host_devices

    with host_devices(spec.rollout):  # a CPU's second device, for a split run
        import jax

        jax.devices()  # the backends start now, with them
    from rlctl.core.trainer.run.loop import run_trainer

    return run_trainer(spec, run, progress, on_status, topology, recover, watch)


def fit_fix(report: DeviceFit, spec: RunSpec, acc: Any = None, count: int = 1) -> str:
    """The setting that makes a run that does not fit fit (``device_fit/fixes.py``)."""
    from rlctl.core.trainer.device_fit.fixes import fix_for

    return fix_for(report, spec, acc, count)


def fit_missing_extra(target: Any) -> str | None:
    """Why this environment cannot compile for ``target`` (a ``CompileTarget``), or
    None; looks for libtpu or JAX's CUDA plugin without importing JAX."""
    from rlctl.core.trainer.runtime.targets import missing_extra

    return missing_extra(target)


def source_config(source: str) -> tuple[dict[str, Any] | None, str | None]:
    """(config.json, None) of ``model.source`` without its weights, or (None, why it
    cannot be read here)."""
    from rlctl.core.trainer.model.models import source_config as read

    return read(source)


def rollout_share(devices: int, asked: float) -> tuple[int, int]:
    """(learner's, generator's) devices of a ``rollout.placement=split`` run over
    ``devices`` (``rollout/placement.py``): the plan says it, and refuses a share that
    leaves either side none, before anything is applied."""
    from rlctl.core.trainer.rollout.placement import share

    return share(devices, asked)
