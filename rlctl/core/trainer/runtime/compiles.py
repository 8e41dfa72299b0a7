"""XLA compilations: kept on disk between runs, counted, and explained when late.

A compiled step of the default model runs in well under a second on a GPU, but
compiling it takes tens of seconds; a run that compiles again at step 2 or 7
(a new padded width, a second trace) loses more time than all its steps. So the
run's shapes are fixed up front (rollout.py, step.py), compiled programs go to a
persistent cache that a second run or a ``resume`` reads instead of compiling,
and any compilation after the first step is reported with JAX's own reason.
A run whose store is on gs:// (a cluster's) keeps that cache beside it, in
``xla/`` of the run: each pod pulls it into its staging folder before its first
compile and pushes what it added, so a restarted pod or a resumed run loads its
programs instead of compiling them (JAX 0.10's cache needs a file system with
file locks for its eviction, which gs:// is not; the store's copy is a mirror).
Pitfall: JAX's cache key holds the cache folder's path (its GPU autotuning cache
lives under it and is a compile option), so the local copy must have the same path
in every pod: ``xla-runs/<run>`` under rlctl's cache, not the random staging folder.
Before that, each compilation of the run's own programs (and any other that takes
a second or more) says what it compiled and how long it took, tracing and lowering
included: a line of the run's log, and ``compiles`` in status.json.
"""

from __future__ import annotations

import logging
import os
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.core.paths import cache_dir

CACHE_ENV = "RLCTL_COMPILE_CACHE"  # a folder, or "off"
CACHE_MAX_BYTES = 4 * 2**30  # least recently used entries go beyond this
_OFF = {"off", "0", "false", "no", "none"}
# where JAX explains a cache miss (jax_explain_cache_misses) and a persistent-cache miss
_EXPLAINERS = ("jax._src.interpreters.partial_eval", "jax._src.pjit", "jax._src.compiler")
# The run's programs, by the function JAX compiles (step.py, sampler.py), as a log line
# names them; any other is named by its function when it takes REPORT_SECONDS or more.
PROGRAMS = {
    "step": "the update",
    "sample_groups": "the sampler",
    "policy_logps": "the log-probs (reference or rollout policy)",
}
REPORT_SECONDS = 1.0
# JAX's three stages of a compilation, each timed under the function's name
_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_BACKEND = "/jax/core/compile/backend_compile_duration"


def program_name(fun_name: str) -> str:
    """The function's own name from any stage's spelling of it: ``jit(step)`` (the
    backend's), ``jit_step`` (the lowered module's) or ``step`` (the trace's)."""
    name = fun_name
    if name.startswith("jit(") and name.endswith(")"):
        name = name[4:-1]
    elif name.startswith("jit_"):
        name = name[4:]
    return name


def program_label(fun_name: str) -> str:
    """What a log line calls a compiled function: ``the update (jit(step))``."""
    name = program_name(fun_name)
    return f"{PROGRAMS[name]} (jit({name}))" if name in PROGRAMS else f"jit({name})"


def compile_cache_dir() -> Path | None:
    """The persistent compilation cache folder: ``$RLCTL_COMPILE_CACHE`` (``off``
    disables it), else ``xla/`` under rlctl's cache (``$RLCTL_CACHE``)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() in _OFF and value:
        return None
    return Path(value).expanduser() if value else cache_dir() / "xla"


STORE_CACHE = "xla"  # a gs:// run's own compilation cache, beside its checkpoints


def in_store(run: Any) -> bool:
    """Whether ``run`` keeps its compilation cache in its store: a gs:// run, unless
    ``$RLCTL_COMPILE_CACHE`` or ``JAX_COMPILATION_CACHE_DIR`` names the cache."""
    return (
        run is not None
        and str(getattr(run, "uri", "")).startswith("gs://")
        and not os.environ.get(CACHE_ENV, "").strip()
        and not os.environ.get("JAX_COMPILATION_CACHE_DIR")
    )


def enable_persistent_cache(warn: Callable[[str], None], run: Any = None) -> Path | None:
    """Point JAX's persistent compilation cache at ``compile_cache_dir()``, caching
    every program whatever its compile time; for a ``run`` on gs:// (``in_store``), at
    its staging copy of the store's ``xla/``, pulled first. A user's own
    ``JAX_COMPILATION_CACHE_DIR`` wins. A folder that cannot be made, or a store that
    cannot be read, is a warning: the cache only saves time."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    folder = compile_cache_dir()
    if in_store(run):
        folder = _run_cache(run)
        try:
            run.pull(STORE_CACHE)  # through the staging link, into ``folder``
        except Exception as e:  # the store's cache only saves time
            warn(
                f"compilation cache: could not read {run.uri}/{STORE_CACHE} "
                f"({type(e).__name__}: {str(e)[:160]}); compiling afresh"
            )
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            warn(
                f"compilation cache off: cannot create {folder} ({e.strerror or e}); "
                f"set {CACHE_ENV} to a writable folder"
            )
            folder = None
    jax.config.update("jax_compilation_cache_dir", None if folder is None else str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    cc.reset_cache()  # read the folder anew, whatever this process did before
    return folder


def _run_cache(run: Any) -> Path:
    """A gs:// run's local cache folder, the same path in every pod of the run (see the
    module's pitfall), linked from the run's staging folder as its ``xla/`` so that the
    store's pull and push of ``xla/`` read and write it."""
    folder = cache_dir() / "xla-runs" / run.name
    folder.mkdir(parents=True, exist_ok=True)
    link = Path(run.path_for(STORE_CACHE))
    if not link.exists() and not link.is_symlink():
        link.symlink_to(folder, target_is_directory=True)
    return folder


def push_cache(run: Any, warn: Callable[[str], None]) -> bool:
    """Upload what this process added to a gs:// run's compilation cache (files that
    changed since they were pulled or last pushed). False, with a warning, where the
    store refused: the run goes on, its restarts compile again."""
    if not in_store(run):
        return False
    try:
        run.push(STORE_CACHE)
    except Exception as e:
        warn(
            f"compilation cache: could not write {run.uri}/{STORE_CACHE} "
            f"({type(e).__name__}: {str(e)[:160]})"
        )
        return False
    return True


class _Explanations(logging.Handler):
    """Keeps JAX's last cache-miss explanation instead of printing it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "CACHE MISS" in text:
            self.last = text


class CompileWatch:
    """Counts this process's XLA compilations by function (a persistent-cache hit
    is no compilation) and, after ``warm()``, reports each one with its reason.

    One watch is active at a time; JAX's listeners are process-wide and cannot be
    removed, so one listener is registered once and forwards to the active watch.
    """

    _active: CompileWatch | None = None
    _registered = False

    def __init__(
        self,
        report: Callable[[str], None] | None = None,
        on_compile: Callable[[dict[str, float]], None] | None = None,
    ) -> None:
        self.report = report or (lambda message: None)
        # called with ``seconds`` after each compilation of a run's program (status.json)
        self.on_compile = on_compile or (lambda seconds: None)
        self.compiled: Counter[str] = Counter()  # fun_name -> compilations
        self.hits: Counter[str] = Counter()  # fun_name -> loaded from the persistent cache
        self.late: list[str] = []  # what compiled after warm-up
        # a run's program (``PROGRAMS``' key) -> seconds its compilations took, summed
        # (the CPU's sampler compiles one program for the evals and one for the
        # rollout), tracing and lowering included (a load from the persistent cache:
        # its time)
        self.seconds: dict[str, float] = {}
        # program -> its trace and lowering so far (seconds)
        self._staged: defaultdict[str, float] = defaultdict(float)
        self._warm = False
        self._hit = False
        self._why = _Explanations()
        self._levels: dict[str, tuple[int, bool]] = {}
        self._explain = False

    def __enter__(self) -> CompileWatch:
        import jax

        if not CompileWatch._registered:
            jax.monitoring.register_event_listener(CompileWatch._on_event)
            jax.monitoring.register_event_duration_secs_listener(CompileWatch._on_duration)
            CompileWatch._registered = True
        # a flag jax defines at import time, which its type stubs do not list
        self._explain = jax.config.jax_explain_cache_misses  # type: ignore[attr-defined]
        jax.config.update("jax_explain_cache_misses", True)
        for name in _EXPLAINERS:
            log = logging.getLogger(name)
            log.addHandler(self._why)
            self._levels[name] = (log.level, log.propagate)
            log.setLevel(logging.WARNING)
            log.propagate = False
        CompileWatch._active = self
        return self

    def __exit__(self, *exc: object) -> None:
        import jax

        CompileWatch._active = None
        jax.config.update("jax_explain_cache_misses", self._explain)
        for name, (level, propagate) in self._levels.items():
            log = logging.getLogger(name)
            log.removeHandler(self._why)
            log.setLevel(level)
            log.propagate = propagate

    def warm(self) -> None:
        """From now on the run's programs all exist: any compilation is reported."""
        self._warm = True

    @property
    def total(self) -> int:
        return sum(self.compiled.values())

    @staticmethod
    def _on_event(event: str, **_: object) -> None:
        watch = CompileWatch._active
        if watch is not None and event == "/jax/compilation_cache/cache_hits":
            watch._hit = True

    @staticmethod
    def _on_duration(event: str, duration_secs: float, **kw: str | int) -> None:
        watch = CompileWatch._active
        if watch is None:
            return
        name = str(kw.get("fun_name", "?"))
        if event in (_TRACE, _LOWER):
            watch._staged[program_name(name)] += duration_secs
            return
        if event != _BACKEND:
            return
        total = watch._staged.pop(program_name(name), 0.0) + duration_secs
        if watch._hit:
            watch._hit = False
            watch.hits[name] += 1
            watch._said(name, total, "loaded {what} from the compilation cache in {s:.1f} s")
            return
        watch.compiled[name] += 1
        if not watch._warm:
            watch._said(name, total, "compiled {what} in {s:.1f} s")
        else:
            why = _reason(watch._why.last)
            watch._why.last = ""
            line = f"compiled {name} again after warm-up ({duration_secs:.1f} s)" + (
                f": {why}" if why else ""
            )
            watch.late.append(line)
            watch.report(line)

    def _said(self, fun_name: str, seconds: float, line: str) -> None:
        """Report a compilation (or a load) of a run's program, or of any other that
        took ``REPORT_SECONDS`` or more, and keep a program's seconds for status."""
        name = program_name(fun_name)
        if name in PROGRAMS:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + seconds, 1)
            self.on_compile(dict(self.seconds))
        elif seconds < REPORT_SECONDS:
            return
        self.report(line.format(what=program_label(fun_name), s=seconds))


def _reason(text: str) -> str:
    """JAX's cache-miss explanation, cut to its first reason ("different input
    types: at x, now f32[5] and before f32[3]")."""
    lines = [ln.strip(" *") for ln in text.splitlines()[1:] if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("for ", "all previously seen"))]
    return " ".join(lines[:2])[:240]


# XLA:CPU hands these to YNNPACK in the update: its dots, not its reductions.
UPDATE_YNN_FUSIONS = "LIBRARY_FUSION_TYPE_DOT"
# ... and in a narrow (bfloat16) update: its dots one by one. Pitfall: with
# LIBRARY_FUSION_TYPE_DOT, XLA:CPU (jax 0.10.2) converts every bfloat16 dot's inputs
# back to float32 (a 768 x 576 x 1536 product: 6.7 ms, the float32 time, against 3.9 ms
# with INDIVIDUAL_DOT or XLA's default).
NARROW_UPDATE_YNN_FUSIONS = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"


def update_options(
    compute_dtype: str = "float32", numerics: Any = None
) -> dict[str, str | bool] | None:
    """Compiler options of the update: on the CPU, YNNPACK runs its dots but not its
    reductions, which XLA's own loops fuse with their neighbours instead (jax 0.10's
    default gives YNNPACK both; the figure: docs/decisions/trainer.md). The sampler keeps
    the default: its vocabulary-wide reductions need
    YNNPACK's threads. A user's own ``--xla_cpu_experimental_ynn_fusion_type`` in
    ``XLA_FLAGS`` wins. Only where ``numerics`` (the numerics table's row; this
    backend's when None) has ``xla_cpu_options``, and only on the CPU."""
    import jax

    from rlctl.core.trainer.runtime import numerics as numerics_lib

    row = numerics or numerics_lib.current()
    if (
        not row.xla_cpu_options
        or jax.default_backend() != "cpu"
        or "ynn_fusion_type" in os.environ.get("XLA_FLAGS", "")
    ):
        return None
    fusions = UPDATE_YNN_FUSIONS if compute_dtype == "float32" else NARROW_UPDATE_YNN_FUSIONS
    return {"xla_cpu_experimental_ynn_fusion_type": fusions}
