"""rlctl against TRL's GRPOTrainer on the default task, side by side, in one invocation.

The default task (``rlctl train grpo`` with no options): SmolLM2-135M-Instruct, GRPO,
20 steps of 2 arithmetic prompts x 8 completions of at most 48 new tokens,
temperature 1, top-p 1, lr 1e-5, beta 0, AdamW (0.9, 0.99, no weight decay, global
norm clipped to 1), rewards ``correct`` + 0.1 x ``format``. Each run is a child
process of its own, so its peak RSS (``wait4``'s ``ru_maxrss``) is its own:

* rlctl: the real ``python -m rlctl train grpo --steps N`` in a temporary run store
  (baseline and final eval, checkpoints every 5 steps, TensorBoard: the default
  run, whose per-step figures exclude them); ``--rlctl-set KEY=VALUE`` passes
  ``--set`` to it (e.g. ``model.compute_dtype=bfloat16``). The persistent compilation cache
  is off, so step 1 always includes compiling.
* TRL, once per ``--trl-settings`` entry (``bench/trl_grpo_child.py`` in TRL's own
  virtual environment, TRL being a bench-only dependency): the same model folder,
  the same prompt texts and tokens (rendered here by rlctl's chat template, passed
  as plain strings, which TRL tokenizes without a template), the same prompts per
  step in rlctl's order, the same sampling, optimizer and loss settings
  (``loss_type="grpo"`` is rlctl's sequence-mean-token-mean) and rlctl's reward
  code. ``fp32`` is TRL's defaults (gradient checkpointing on) in float32; ``bf16``
  is TRL's own default precision (``bf16=True``: autocast over float32 weights);
  the ``-nockpt`` settings turn gradient checkpointing off; ``fp32-compile`` is
  ``fp32-nockpt`` with ``torch_compile`` (it recompiles for each new sequence
  length: minutes, no faster after). ``NAME:N`` runs a setting N steps at most: the
  default runs ``bf16`` for 2, as without AVX512-BF16 or AMX one step of it takes
  about 7 minutes on a 2-core EPYC (14x fp32). "TRL's fastest" is the setting with
  the lowest median step.

Per run: step 1, the median of steps 2..N, the rollout (sampling) and update (the
rest: rewards, log-probs, backward, optimizer) medians, completion tokens/s over
steps 2..N (their tokens over their seconds), peak RSS and the whole run's wall
time; then rlctl / TRL-fastest and rlctl / TRL-fp32 as ratios (seconds and memory:
below 1 is rlctl better; tokens/s: above 1 is). Also the machine (CPU model, cores,
whether it has the AVX512-BF16/AMX instructions that bf16 speed depends on) and
rlctl's held-out eval before and after training.

TRL's virtual environment, once (torch is the CPU build: it must be pinned and
installed with the rest, or pip may fetch a CUDA one)::

    python3 -m venv .venvs/trl && .venvs/trl/bin/pip install -r bench/requirements-trl.txt

    python -m bench.bench_vs_trl            # rlctl; TRL fp32, fp32-nockpt, bf16 (2 steps)
    python -m bench.bench_vs_trl --steps 3 --only trl --trl-settings fp32-nockpt
    python -m bench.bench_vs_trl --rlctl-set model.compute_dtype=bfloat16 -o vs-trl.json
    python -m bench.bench_vs_trl --from-json vs-trl.json     # the tables again
    python -m bench.bench_vs_trl --trl-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

REPO = Path(__file__).resolve().parents[1]

CHILD = REPO / "bench" / "trl_grpo_child.py"
TRL_VENV = REPO / ".venvs" / "trl"
TRL_PYTHON = TRL_VENV / "bin" / "python"
VENV_COMMAND = (
    "python3 -m venv .venvs/trl && .venvs/trl/bin/pip install -r bench/requirements-trl.txt"
)
TRL_SETTINGS = ("fp32", "bf16", "fp32-nockpt", "bf16-nockpt", "fp32-compile")
# bf16 capped at 2 steps: without AVX512-BF16/AMX one step of it takes minutes
DEFAULT_SETTINGS = "fp32,fp32-nockpt,bf16:2"
RUN_NAME = "bench-vs-trl"
GiB = 2**30


# --- the prompts TRL is given ----------------------------------------------------


def prompt_rows(steps: int, tokenizer: Any = None, spec: Any = None) -> list[dict[str, Any]]:
    """The training prompts of ``steps`` steps of the run ``spec`` (default: the default
    run), in rlctl's order: each its chat-rendered text, gold answer and tokens.
    ``tokenizer``: rlctl's ChatTokenizer of the run's model unless given."""
    from rlctl.core.config.models import RunSpec
    from rlctl.core.trainer.data import load_source
    from rlctl.core.trainer.data.prompts import prompt_text

    spec = spec or RunSpec()
    if tokenizer is None:
        from rlctl.core.trainer.model.models import resolve_model_dir
        from rlctl.core.trainer.model.tokenizer import ChatTokenizer

        tokenizer = ChatTokenizer(resolve_model_dir(spec.model.source))
    # the eval size matters: generated problems that are held out are skipped
    source = load_source(spec.data, spec.eval.size)
    rows = []
    for step in range(steps):
        for problem in source.batch(step, spec.training.prompts_per_step):
            text = prompt_text(tokenizer, problem, spec.prompt)
            rows.append(
                {
                    "step": step + 1,
                    "prompt": text,
                    "answer": problem.answer,
                    "prompt_ids": [int(i) for i in tokenizer.encode(text)],
                }
            )
    return rows


def write_prompts(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- one run's figures -----------------------------------------------------------


@dataclass
class Run:
    name: str  # "rlctl" or "trl-<setting>"
    steps: list[dict[str, Any]] = field(default_factory=list)  # step_seconds, ...
    peak_rss: int = 0  # bytes
    wall_s: float = 0.0
    cpu_s: float = 0.0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.steps)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def figures(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Step 1's seconds, and over steps 2..N: the median step, rollout and update
    (step - rollout) seconds and completion tokens per second (their sum over the
    sum of their seconds). The accuracy of the sampled completions over the first
    and the second half of the steps, where the rows have it."""
    later = steps[1:]
    secs = sum(r["step_seconds"] for r in later)
    acc = [r["accuracy"] for r in steps if r.get("accuracy") is not None]
    half = len(acc) // 2
    return {
        "steps": len(steps),
        "first_step": steps[0]["step_seconds"] if steps else None,
        "median_step": _median([r["step_seconds"] for r in later]),
        "median_rollout": _median([r["rollout_seconds"] for r in later]),
        "median_update": _median([r["step_seconds"] - r["rollout_seconds"] for r in later]),
        "tokens_per_s": sum(r["completion_tokens"] for r in later) / secs if secs else None,
        "mean_tokens": (statistics.mean(r["completion_tokens"] for r in steps) if steps else None),
        "accuracy_halves": (
            [statistics.mean(acc[:half]), statistics.mean(acc[half:])] if half else None
        ),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(ours: Run, theirs: Run) -> dict[str, float | None]:
    """ours / theirs for the median step, peak RSS and tokens/s."""
    fa, fb = figures(ours.steps), figures(theirs.steps)
    return {
        "median_step": ratio(fa["median_step"], fb["median_step"]),
        "peak_rss": ratio(ours.peak_rss, theirs.peak_rss),
        "tokens_per_s": ratio(fa["tokens_per_s"], fb["tokens_per_s"]),
    }


def fastest(runs: list[Run]) -> Run | None:
    """The TRL run with the lowest median step (among those that ran 2 steps)."""
    timed = [r for r in runs if r.ok and figures(r.steps)["median_step"] is not None]
    return min(timed, key=lambda r: figures(r.steps)["median_step"], default=None)


# --- child processes -------------------------------------------------------------


def run_child(
    args: list[str], env: dict[str, str], log: Path, cwd: Path = REPO
) -> tuple[int, Any, float]:
    """(exit code, the child's rusage, wall seconds) of ``args``, output to ``log``."""
    t0 = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = code = os.waitstatus_to_exitcode(status)  # Popen does not wait again
    return code, usage, time.perf_counter() - t0


def _fill(run: Run, code: int, usage: Any, wall: float, log: Path) -> None:
    run.wall_s = round(wall, 1)
    run.peak_rss = usage.ru_maxrss * 1024  # KiB on Linux
    run.cpu_s = round(usage.ru_utime + usage.ru_stime, 1)
    if code != 0 and not run.error:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        run.error = exit_reason(code, tail[-1] if tail else "")
        print(
            f"{run.name} failed ({run.error}); its log's tail:\n" + "\n".join(tail), file=sys.stderr
        )


def exit_reason(code: int, last_line: str) -> str:
    """A failed child in a few words: the signal that ended it, or its exit code and
    the start of its last line of output."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    line = last_line.strip()
    return f"exit {code}" + (f": {line[:100]}" if line else "")


def read_rlctl_run(folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """metrics.jsonl's rows and the baseline and final evals of a run folder."""
    metrics = folder / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        if metrics.is_file()
        else []
    )
    evals = {}
    for which in ("baseline", "final"):
        path = folder / "eval" / f"{which}.json"
        if path.is_file():
            e = json.loads(path.read_text())
            evals[which] = {k: e.get(k) for k in ("n", "accuracy", "format_rate", "seconds")}
    return rows, evals


def run_rlctl(steps: int, sets: list[str], work: Path) -> Run:
    run = Run("rlctl")
    args = [
        sys.executable,
        "-m",
        "rlctl",
        "train",
        "grpo",
        "--runs-dir",
        str(work),
        "--name",
        RUN_NAME,
        "--steps",
        str(steps),
    ]
    for s in sets:
        args += ["--set", s]
    if sets:
        run.name = "rlctl " + " ".join(sets)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RLCTL_COMPILE_CACHE": "off"}
    log = work / "rlctl.log"
    code, usage, wall = run_child(args, env, log)
    rows, evals = read_rlctl_run(work / RUN_NAME)
    run.steps = [
        {
            k: r.get(k)
            for k in (
                "step",
                "step_seconds",
                "rollout_seconds",
                "completion_tokens",
                "accuracy",
                "reward_mean",
            )
        }
        for r in rows
    ]
    status = work / RUN_NAME / "status.json"
    status = json.loads(status.read_text()) if status.is_file() else {}
    # what its update's and its sampler's matmuls read (precision.choose on this machine)
    run.extra = {
        "eval": evals,
        "sets": sets,
        "precision": {k: status.get(k) for k in ("precision", "sampling_precision")},
    }
    if code == 0 and len(rows) < steps:
        run.error = f"{len(rows)} of {steps} steps in metrics.jsonl"
    _fill(run, code, usage, wall, log)
    return run


def parse_settings(text: str, steps: int) -> list[tuple[str, int]]:
    """``fp32,bf16:3`` -> [("fp32", steps), ("bf16", 3)]: each TRL setting and its
    steps (``:N`` caps them at N, for a setting too slow to run all ``steps``)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, _, cap = item.partition(":")
        if name not in TRL_SETTINGS:
            raise ValueError(f"unknown TRL setting {name!r}; choose from {', '.join(TRL_SETTINGS)}")
        if cap and not (cap.isdigit() and int(cap) >= 1):
            raise ValueError(f"{item!r}: the steps after ':' must be a whole number >= 1")
        out.append((name, min(steps, int(cap)) if cap else steps))
    return out


def run_trl(python: Path, setting: str, prompts: Path, model: Path, steps: int, work: Path) -> Run:
    run = Run(f"trl-{setting}")
    out = work / f"trl-{setting}.json"
    args = [
        str(python),
        str(CHILD),
        "--model",
        str(model),
        "--prompts",
        str(prompts),
        "--setting",
        setting,
        "--steps",
        str(steps),
        "--out",
        str(out),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TOKENIZERS_PARALLELISM"] = "false"
    log = work / f"trl-{setting}.log"
    code, usage, wall = run_child(args, env, log)
    if out.is_file():
        result = json.loads(out.read_text())
        run.steps = result["steps"]
        run.extra = {
            k: result.get(k)
            for k in ("config", "versions", "torch_threads", "setup_seconds", "train_seconds")
        }
        if len(run.steps) < steps and not code:
            run.error = f"{len(run.steps)} of {steps} steps"
    elif code == 0:
        run.error = "no result file"
    _fill(run, code, usage, wall, log)
    return run


# --- the machine and the report --------------------------------------------------


def machine(cpuinfo: str | None = None) -> dict[str, Any]:
    """CPU model, logical cores and the instruction sets bf16 speed depends on."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model, flags = None, None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model is None:
            model = value.strip()
        elif key.strip() == "flags" and flags is None:
            flags = set(value.split())
    model, flags = model or platform.processor() or "unknown", flags or set()
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return {"cpu": model, "cores": os.cpu_count(), "flags": {f: f in flags for f in wanted}}


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def report(result: dict[str, Any]) -> str:
    """The tables of a result (``collect``'s dict, or a --json file's)."""
    m = result["machine"]
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in m["flags"].items())
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores ({flags})",
        f"{result['steps']} steps of 2 prompts x 8 completions, <= 48 new tokens; "
        "medians and tokens/s over steps 2..N",
        "",
    ]
    head = (
        f"{'run':<22} {'steps':>5} {'step 1 s':>8} {'step s':>7} {'rollout':>7} {'update':>7} "
        f"{'tok/s':>6} {'tok/step':>8} {'RSS GiB':>7} {'wall s':>7} {'acc 1st->2nd half':>18}"
    )
    lines += [head, "-" * len(head)]
    runs = [Run(**r) for r in result["runs"]]
    for r in runs:
        if r.error and not r.steps:
            lines.append(f"{r.name:<22} failed: {r.error}")
            continue
        f = figures(r.steps)
        acc = f["accuracy_halves"]
        acc_s = "-" if acc is None else f"{acc[0]:.2f} -> {acc[1]:.2f}"
        lines.append(
            f"{r.name:<22} {f['steps']:>5} {_f(f['first_step']):>8} "
            f"{_f(f['median_step'], '.2f'):>7} {_f(f['median_rollout'], '.2f'):>7} "
            f"{_f(f['median_update'], '.2f'):>7} "
            f"{_f(f['tokens_per_s']):>6} {_f(f['mean_tokens'], '.0f'):>8} "
            f"{r.peak_rss / GiB:>7.2f} {r.wall_s:>7.0f} {acc_s:>18}"
            + (f"  (cut short: {r.error[:60]})" if r.error else "")
        )
    ours = next((r for r in runs if r.name.startswith("rlctl") and r.ok), None)
    trl = [r for r in runs if r.name.startswith("trl-")]
    best = fastest(trl)
    fp32 = next((r for r in trl if r.name == "trl-fp32" and r.ok), None)
    if ours:
        evals = ours.extra.get("eval", {})
        if "baseline" in evals and "final" in evals:
            b, e = evals["baseline"], evals["final"]
            lines += [
                "",
                f"rlctl held-out eval ({b['n']} prompts, greedy): accuracy "
                f"{b['accuracy']:.3f} -> {e['accuracy']:.3f} "
                f"({e['accuracy'] - b['accuracy']:+.3f}); the evals took "
                f"{(b['seconds'] or 0) + (e['seconds'] or 0):.0f} s of its wall time",
            ]
        p = ours.extra.get("precision") or {}
        if p.get("precision"):
            lines.append(
                f"rlctl's matmuls: {p['precision']} in the update, "
                f"{p.get('sampling_precision') or p['precision']} in sampling"
            )
        against = [("TRL's fastest (" + best.name + ")", best)] if best else []
        if fp32 and fp32 is not best:
            against.append(("TRL fp32", fp32))
        if against:
            lines += [
                "",
                f"{ours.name} / TRL  (seconds and RSS: < 1 is rlctl better; tokens/s: > 1 is)",
            ]
        for label, other in against:
            q = ratios(ours, other)
            lines.append(
                f"  vs {label:<34} median step {_x(q['median_step'])}  peak RSS "
                f"{_x(q['peak_rss'])}  tokens/s {_x(q['tokens_per_s'])}"
            )
    return "\n".join(lines)


def trl_python_or_exit(path: Path | None) -> Path:
    """The TRL interpreter, or a one-line error with the command that makes it (exit 2)."""
    python = path or TRL_PYTHON
    if not python.exists():
        print(
            f"bench_vs_trl: no TRL interpreter at {python}; create TRL's venv: "
            f"{VENV_COMMAND}  (or pass --trl-python PATH, or --only rlctl)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return python


def collect(
    a: argparse.Namespace, settings: list[tuple[str, int]], trl_python: Path | None
) -> dict:
    from rlctl.core.config.models import RunSpec
    from rlctl.core.trainer.model.models import resolve_model_dir

    runs: list[Run] = []
    work = Path(tempfile.mkdtemp(prefix="bench-vs-trl-"))
    keep = False
    try:
        if a.only in (None, "rlctl"):
            print(f"rlctl train grpo --steps {a.steps} ...", file=sys.stderr, flush=True)
            runs.append(run_rlctl(a.steps, a.rlctl_set, work))
        if a.only in (None, "trl") and trl_python is not None:
            model = resolve_model_dir(RunSpec().model.source)
            prompts = write_prompts(work / "prompts.jsonl", prompt_rows(a.steps))
            for s, n in settings:
                print(f"TRL {s}, {n} steps ...", file=sys.stderr, flush=True)
                runs.append(run_trl(trl_python, s, prompts, model, n, work))
        keep = any(r.error for r in runs)
    finally:
        if keep:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    best = fastest([r for r in runs if r.name.startswith("trl-")])
    return {
        "machine": machine(),
        "steps": a.steps,
        "runs": [asdict(r) for r in runs],
        "figures": {r.name: figures(r.steps) for r in runs if r.steps},
        "trl_fastest": best.name if best else None,
        "ratios": {
            other.name: ratios(ours, other)
            for ours in runs[:1]
            if ours.name.startswith("rlctl") and ours.ok
            for other in runs[1:]
            if other.ok
        },
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="steps of each run (default 20)")
    p.add_argument("--only", choices=["rlctl", "trl"], help="run one side only")
    p.add_argument(
        "--trl-settings",
        default=DEFAULT_SETTINGS,
        help=f"comma-separated, of {', '.join(TRL_SETTINGS)}; NAME:N runs that "
        f"one N steps at most (default {DEFAULT_SETTINGS})",
    )
    p.add_argument(
        "--trl-python",
        type=Path,
        help=f"TRL's interpreter (default {TRL_PYTHON.relative_to(REPO)})",
    )
    p.add_argument(
        "--rlctl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to rlctl train as --set (repeatable)",
    )
    p.add_argument("-o", "--json", type=Path, metavar="PATH", help="also write the figures")
    p.add_argument("--from-json", type=Path, help="run nothing: the tables of an -o file")
    a = p.parse_args(argv)
    if a.from_json:
        print(report(json.loads(a.from_json.read_text())))
        return
    if a.steps < 1:
        p.error("--steps must be at least 1")
    try:
        settings = parse_settings(a.trl_settings, a.steps)
    except ValueError as e:
        p.error(f"--trl-settings: {e}")
    if a.only == "trl" and not settings:
        p.error("--only trl needs --trl-settings")
    trl_python = trl_python_or_exit(a.trl_python) if a.only != "rlctl" and settings else None
    result = collect(a, settings, trl_python)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    print(report(result))


if __name__ == "__main__":
    main()
