"""Streaming conversion vs loading the whole model first, on a generated multi-shard
Llama-shaped model (>= 2 GB of float32).

Prints, for HF -> trainer (Orbax) and trainer -> HF: peak RSS as a multiple of the
largest tensor (also net of the interpreter's own footprint after imports), and
throughput as a fraction of a plain copy of the same bytes on the same disk, two
ways: ``cp`` (in-kernel, the bytes never reach user space) and a read+write loop
through a 16 MiB buffer (what any converter that looks at the bytes must do). Each
conversion runs in a fresh process so its peak RSS is its own. Goal (issue 11):
streaming peak RSS within 3x the largest tensor, throughput above 0.5 of a copy.

    .venv/bin/python -m bench.bench_convert [--layers 9] [--dir /tmp/bench-convert]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

if __name__ == "__main__" and find_spec("bench") is None:  # by path: bench/_by_path.py
    import _by_path

    _by_path.rerun_as_module(__file__)

ROOT = Path(__file__).resolve().parents[1]

# Llama-shaped: vocab 32000, hidden 2048, 16 heads / 4 KV heads, FFN 5632 (untied)
SHAPE = {"vocab": 32000, "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn": 5632}
if "--tiny-shape" in sys.argv:  # a quick check of the script itself
    sys.argv.remove("--tiny-shape")
    SHAPE = {"vocab": 3200, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512}


def generate(folder: Path, layers: int, shard_bytes: int = 512 << 20) -> tuple[int, int]:
    """A random model written shard by shard (never whole in memory); (bytes, largest)."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    v, d, h, k, f = (SHAPE[x] for x in ("vocab", "hidden", "heads", "kv_heads", "ffn"))
    hd = d // h
    shapes = {"model.embed_tokens.weight": (v, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (h * hd, d),
                p + "self_attn.k_proj.weight": (k * hd, d),
                p + "self_attn.v_proj.weight": (k * hd, d),
                p + "self_attn.o_proj.weight": (d, h * hd),
                p + "mlp.gate_proj.weight": (f, d),
                p + "mlp.up_proj.weight": (f, d),
                p + "mlp.down_proj.weight": (d, f),
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
            }
        )
    shapes.update({"model.norm.weight": (d,), "lm_head.weight": (v, d)})
    rng = np.random.default_rng(0)
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 4
        if groups[-1] and size + n > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += n
    files = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map = {}
    for names, fname in zip(groups, files):
        save_file(
            {n: (rng.standard_normal(shapes[n], np.float32) * 0.02) for n in names},
            str(folder / fname),
        )
        weight_map.update({n: fname for n in names})
    total = sum(int(np.prod(s)) * 4 for s in shapes.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": v,
                "hidden_size": d,
                "intermediate_size": f,
                "num_hidden_layers": layers,
                "num_attention_heads": h,
                "num_key_value_heads": k,
                "head_dim": hd,
                "tie_word_embeddings": False,
                "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0,
            }
        )
    )
    return total, v * d * 4


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith(field + ":"))


def child(mode: str, src: str, dst: str) -> None:
    """One measurement in this (fresh) process; prints a JSON line."""
    import numpy as np  # noqa: F401  (imports counted in the baseline, not the work)
    import tensorstore  # noqa: F401

    from rlctl.core.checkpoints import convert as conv
    from rlctl.core.checkpoints.sources import open_source

    base = _status("VmRSS")  # after imports: the interpreter's own footprint
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM: the peak from here on is the conversion's
    t0 = time.perf_counter()
    if mode.startswith("copy"):
        out = Path(dst)
        out.mkdir()
        for p in sorted(Path(src).iterdir()):
            if mode == "copy":  # what cp does: in-kernel (copy_file_range/sendfile)
                shutil.copyfile(p, out / p.name)
                continue
            with p.open("rb") as fi, (out / p.name).open("wb") as fo:  # through memory
                while block := fi.read(16 << 20):
                    fo.write(block)
    elif mode.startswith("stream"):
        conv.convert(src, dst, to="trainer" if mode.endswith("trainer") else "hf")
    else:  # load-all: every tensor read into memory first, then the same writer
        source = open_source(src)
        held = {r.key: source.read_rule(r) for r in source.rules}

        class Held(type(source)):  # type: ignore[misc]
            def read_rule(self, rule):
                return held[rule.key]

            def read(self, name):
                rule = self.by_hf[name]
                return rule.to_hf(held[rule.key])[rule.hf.index(name)]

        source.__class__ = Held
        out = conv.open_output(dst, False)
        if mode.endswith("trainer"):
            conv._to_trainer(source, out, None, lambda *a: None, dst)
        else:
            conv._to_hf(source, out, None, lambda *a: None, conv.hf.SHARD_BYTES)
        out.commit()
    seconds = time.perf_counter() - t0
    print(json.dumps({"mode": mode, "seconds": seconds, "peak": _status("VmHWM"), "base": base}))


def run(mode: str, src: Path, dst: Path) -> dict:
    shutil.rmtree(dst, ignore_errors=True)
    p = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(src), str(dst)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=9)
    ap.add_argument("--dir", default="/tmp/bench-convert")
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    work = Path(a.dir)
    shutil.rmtree(work, ignore_errors=True)
    hf_dir, trainer_dir = work / "hf", work / "trainer"
    total, largest = generate(hf_dir, a.layers)
    shards = len(list(hf_dir.glob("*.safetensors")))
    print(
        f"model: {total / 2**30:.2f} GiB float32 in {shards} shards, largest tensor "
        f"{largest / 2**20:.0f} MiB (embedding)"
    )
    rates = {}
    for mode, what in (
        ("copy", "cp (in-kernel copy_file_range)"),
        ("copy-userspace", "read+write, 16 MiB buffer"),
    ):
        r = run(mode, hf_dir, work / "copy")
        shutil.rmtree(work / "copy")
        rates[mode] = total / r["seconds"]
        print(f"plain copy, {what}: {r['seconds']:.1f} s ({rates[mode] / 2**20:.0f} MiB/s)")
    copy_rate = rates["copy"]
    print(
        f"{'conversion':<22}{'s':>6}{'MiB/s':>7}{'x cp':>7}{'x r+w':>7}{'peak RSS':>10}"
        f"{'x largest':>11}{'net x largest':>15}"
    )
    for direction, src, dst in (
        ("trainer", hf_dir, trainer_dir),
        ("hf", trainer_dir, work / "hf-out"),
    ):
        for kind in ("stream", "load-all"):
            dst = dst if kind == "stream" else work / "load-all-out"
            r = run(f"{kind}-{direction}", src, dst)
            rate = total / r["seconds"]
            print(
                f"{f'{kind} -> {direction}':<22}{r['seconds']:>6.1f}{rate / 2**20:>7.0f}"
                f"{rate / copy_rate:>7.2f}{rate / rates['copy-userspace']:>7.2f}"
                f"{r['peak'] / 2**20:>9.0f}M"
                f"{r['peak'] / largest:>11.2f}{(r['peak'] - r['base']) / largest:>15.2f}"
            )
            if not (kind == "stream" and direction == "trainer"):
                shutil.rmtree(dst, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
