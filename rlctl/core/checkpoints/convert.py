"""``checkpoint-convert``: stream a model from any input into HF safetensors or a
trainer (Orbax) folder, one tensor at a time.

Memory: a tensor is read (one ranged read), reshaped and cast, written, and
released before the next one is read, so the peak is a few copies of the largest
tensor plus a fixed overhead, whatever the model's size (``bench/bench_convert.py``
measures it). Output: into ``<DST>.rlctl-partial`` first (places.py), renamed to
DST only when whole; a re-run after a crash or Ctrl-C skips the shards (HF) or
arrays (trainer) that staging already holds complete.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlctl.core.checkpoints import hf
from rlctl.core.checkpoints.kept import KEPT_FILE
from rlctl.core.checkpoints.kept import write as write_kept
from rlctl.core.checkpoints.places import Output, open_output
from rlctl.core.checkpoints.sources import TRAINER_MARKER, LoraSource, Source, open_source
from rlctl.core.errors import ConfigError
from rlctl.core.store.base import atomic_write

Target = Literal["hf", "trainer", "peft"]
_TARGETS: dict[str, Target] = {"hf": "hf", "trainer": "trainer", "peft": "peft"}


def target(value: str) -> Target:
    """``--to``'s value (any case) as a target, or the one line naming the three."""
    found = _TARGETS.get(value.lower())
    if found is None:
        raise ConfigError(f"--to {value.lower()!r}: use hf, trainer or peft")
    return found


DTYPES = {"bf16": "bfloat16", "fp32": "float32", "bfloat16": "bfloat16", "float32": "float32"}
PROGRESS = "rlctl-progress.json"  # trainer staging: the arrays already written
# progress callback: (tensors done, tensors in all, bytes done, bytes in all)
OnProgress = Callable[[int, int, int, int], None]


@dataclass
class ConvertResult:
    src: str
    src_kind: str
    dst: str
    to: str
    family: str
    step: int | None
    dtype: str
    tensors: int
    bytes: int
    seconds: float
    peak_rss_bytes: int
    resumed: int = 0  # tensors a previous, interrupted run had already written
    skipped: list[str] = field(default_factory=list)  # source tensors not in the model
    verified: bool | None = None
    # a multimodal checkpoint's tensors outside its text model (kept.py), carried along
    kept: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def peak_rss() -> int:
    """This process's peak resident memory in bytes: Linux's VmHWM (its own, unlike
    ``ru_maxrss``, which a child inherits from the process that started it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def check_finite(source: Source, name: str, arr: np.ndarray) -> None:
    """Refuse a tensor holding NaN or infinity: a run that diverged (an older rlctl's,
    which trained on after its loss went NaN) must not reach an export unnoticed."""
    if arr.dtype.kind not in "fcV" or arr.size == 0:  # "V": bfloat16 (ml_dtypes)
        return
    finite = np.isfinite(arr)
    if finite.all():
        return
    bad = int(arr.size - np.count_nonzero(finite))
    where = f"checkpoint {source.step} of " if source.step is not None else ""
    raise ConfigError(
        f"{where}{source.uri}: tensor {name!r} holds {bad} non-finite value"
        f"{'s' if bad > 1 else ''} (NaN or inf) of {arr.size}: the model diverged",
        hint="convert an earlier checkpoint (--step N), or pass --allow-non-finite to "
        "export it as it is",
    )


def _cast(arr: np.ndarray, dtype: str | None) -> np.ndarray:
    if dtype is None or arr.dtype == hf.np_dtype(dtype) or arr.dtype.kind not in "fV":
        return arr
    return arr.astype(hf.np_dtype(dtype))


def convert(
    src: str,
    dst: str,
    *,
    to: Target = "hf",
    step: int | None = None,
    dtype: str | None = None,
    verify: bool = False,
    overwrite: bool = False,
    client: Any = None,
    runs_dir: str | None = None,
    on_progress: OnProgress | None = None,
    shard_bytes: int = hf.SHARD_BYTES,
    allow_non_finite: bool = False,
) -> ConvertResult:
    """Convert SRC into DST (see the module docstring); with ``verify``, read DST
    back and compare every tensor with SRC (verify.py). A tensor holding NaN or inf
    is refused (``check_finite``) unless ``allow_non_finite``."""
    started = time.monotonic()
    want = None if dtype is None else DTYPES.get(dtype)
    if dtype is not None and want is None:
        raise ConfigError(f"--dtype {dtype!r}: use bf16 or fp32")
    to = target(to)  # a library caller's value, checked as the CLI's is
    source = open_source(src, step, client, runs_dir)
    if to == "peft" and not isinstance(source, LoraSource):
        raise ConfigError(
            f"--to peft: {src!r} is not a LoRA run (it has no adapters)",
            hint="use --to hf for the whole model",
        )
    if _same_place(src, dst):
        raise ConfigError("SRC and DST are the same place")
    out = open_output(dst, overwrite, client)
    report = on_progress or (lambda *a: None)
    check = (
        (lambda name, arr: None)
        if allow_non_finite
        else (lambda name, arr: check_finite(source, name, arr))
    )
    try:
        if to == "hf":
            n, nbytes, resumed, out_dtype = _to_hf(source, out, want, report, shard_bytes, check)
        elif to == "peft":
            assert isinstance(source, LoraSource)
            n, nbytes, resumed, out_dtype = _to_peft(source, out, want, report, check)
        else:
            n, nbytes, resumed, out_dtype = _to_trainer(source, out, want, report, dst, check)
        for f in source.sidecar_files():
            if not out.done(f):
                out.write_bytes(f, source.sidecars.read_bytes(f))
        if verify and to == "peft":
            raise ConfigError(
                "--verify reads back a model; a PEFT adapter folder is not one",
                hint="convert --to hf --verify for the merged model",
            )
        if verify:  # before commit: a DST that differs from SRC never appears
            from rlctl.core.checkpoints.verify import verify_against

            verify_against(source, open_source(out.staging_uri, None, client), want)
    except ConfigError:
        out.abort()  # bad data found midway: nothing to resume, nothing left behind
        raise
    # anything else (Ctrl-C, a kill, a network error) keeps staging for a re-run
    out.commit()
    return ConvertResult(
        src=source.uri,
        src_kind=source.kind,
        dst=out.uri,
        to=to,
        family=source.family,
        step=source.step,
        dtype=out_dtype,
        tensors=n,
        bytes=nbytes,
        seconds=round(time.monotonic() - started, 3),
        peak_rss_bytes=peak_rss(),
        resumed=resumed,
        skipped=source.skipped,
        verified=True if verify else None,
        kept=len(source.kept.names) if source.kept is not None else 0,
    )


def prefetched(items: list[Any], produce: Callable[[Any], np.ndarray]) -> Iterator[np.ndarray]:
    """``produce(item)`` for each item in order, the next one built on a thread while
    the caller writes the current one: reading and reshaping overlap writing (numpy,
    file I/O and TensorStore all release the GIL). At most two tensors are in hand,
    the one being written and the next."""
    from concurrent.futures import Future, ThreadPoolExecutor

    if not items:
        return
    with ThreadPoolExecutor(1, thread_name_prefix="rlctl-read") as pool:
        nxt: Future[np.ndarray] | None = pool.submit(produce, items[0])
        for i in range(len(items)):
            assert nxt is not None  # submitted for each item, None only past the last
            arr = nxt.result()
            nxt = pool.submit(produce, items[i + 1]) if i + 1 < len(items) else None
            yield arr
            del arr
        if nxt is not None:
            nxt.cancel()


def _same_place(a: str, b: str) -> bool:
    if a.startswith("gs://") or b.startswith("gs://"):
        return a.rstrip("/") == b.rstrip("/")
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _out_dtype(source: Source, want: str | None) -> str:
    dtypes = {source.shape_dtype(n)[1] for n in source.names()}
    return want or ("+".join(sorted(dtypes)) if len(dtypes) > 1 else dtypes.pop())


Check = Callable[[str, np.ndarray], None]  # a tensor's name and values: raise to refuse


def _to_hf(
    source: Source,
    out: Output,
    want: str | None,
    report: OnProgress,
    shard_bytes: int,
    check: Check,
) -> tuple[int, int, int, str]:
    planned = []
    for name in source.names():
        shape, dt = source.shape_dtype(name)
        planned.append(
            hf.Planned(
                name, shape, want if want and dt in ("float32", "bfloat16", "float16") else dt
            )
        )
    shards = hf.plan_shards(planned, shard_bytes)
    names = hf.shard_names(len(shards))
    total = sum(t.nbytes for t in planned)
    done_n = done_b = resumed = 0
    todo = [t for shard, fname in zip(shards, names) if not out.done(fname) for t in shard]
    arrays = prefetched(todo, lambda t: _cast(source.read(t.name), t.dtype))
    for shard, fname in zip(shards, names):
        if out.done(fname):  # complete from an interrupted run
            done_n += len(shard)
            resumed += len(shard)
            done_b += sum(t.nbytes for t in shard)
            report(done_n, len(planned), done_b, total)
            continue
        with out.open(fname) as f:
            f.write(hf.shard_header(shard))
            for t in shard:
                arr = next(arrays)
                check(t.name, arr)
                if arr.shape != t.shape or arr.dtype != hf.np_dtype(t.dtype):
                    raise ConfigError(
                        f"{source.uri}: tensor {t.name!r} is {arr.dtype}"
                        f"{list(arr.shape)}, expected {t.dtype}{list(t.shape)}"
                    )
                f.write(hf.byte_view(arr))
                del arr
                done_n += 1
                done_b += t.nbytes
                report(done_n, len(planned), done_b, total)
    hf.write_index(out, shards, names)
    return len(planned), total, resumed, _out_dtype(source, want)


def _to_peft(
    source: LoraSource, out: Output, want: str | None, report: OnProgress, check: Check
) -> tuple[int, int, int, str]:
    """A PEFT adapter folder (adapter_config.json, adapter_model.safetensors; PEFT's
    save_pretrained layout) that ``PeftModel.from_pretrained`` loads onto the base."""
    from rlctl.core.checkpoints import lora

    tensors: list[tuple[str, np.ndarray]] = []
    for rule in source.adapted.values():
        a, b = source.adapter(rule)
        assert rule.t_shape is not None  # adapted projections are "t" rules
        a2, b2 = lora.as_matrices(rule, rule.t_shape(source.base.shape_dtype(rule.hf[0])[0]), a, b)
        name_a, name_b = lora.peft_name(rule.hf[0])
        check(name_a, a2)
        check(name_b, b2)
        tensors += [
            (name_a, _cast(np.ascontiguousarray(a2.T), want)),
            (name_b, _cast(np.ascontiguousarray(b2.T), want)),
        ]
    bf16 = hf.np_dtype("bfloat16")
    planned = [
        hf.Planned(n, tuple(x.shape), "bfloat16" if x.dtype == bf16 else str(x.dtype))
        for n, x in tensors
    ]
    total = sum(t.nbytes for t in planned)
    with out.open("adapter_model.safetensors") as f:
        f.write(hf.shard_header(planned))
        for _, x in tensors:
            f.write(hf.byte_view(x))
    base, hub_id = lora.peft_base(str(source.record.get("base", {}).get("source") or ""))
    config = lora.peft_config(source.record, base)
    out.write_bytes("adapter_config.json", (json.dumps(config, indent=1) + "\n").encode())
    out.write_bytes("README.md", lora.model_card(base, hub_id).encode())
    report(len(planned), len(planned), total, total)
    dtypes = {t.dtype for t in planned}
    return len(planned), total, 0, dtypes.pop() if len(dtypes) == 1 else "+".join(dtypes)


def _to_trainer(
    source: Source, out: Output, want: str | None, report: OnProgress, dst: str, check: Check
) -> tuple[int, int, int, str]:
    from rlctl.core.checkpoints.orbax import CHECKPOINT, OrbaxWriter

    stage = out.staging_dir()
    if stage is None:  # gs://: Orbax's files are built locally, then uploaded whole
        import hashlib

        from rlctl.core.paths import cache_dir

        tag = hashlib.sha256(dst.encode()).hexdigest()[:16]
        stage = Path(cache_dir()) / "convert" / tag
        stage.mkdir(parents=True, exist_ok=True)
    progress_file = stage / PROGRESS
    done: set[str] = set()
    if progress_file.is_file():
        done = set(json.loads(progress_file.read_text()).get("done", []))
    writer = OrbaxWriter(stage / CHECKPOINT)
    total_n = len(source.rules)
    sizes = {}
    for r in source.rules:
        shape_dtypes = [source.shape_dtype(n) for n in r.hf]
        # a "zeros" rule (layout.py) reads no HF tensor
        item = hf.np_dtype(want or (shape_dtypes[0][1] if shape_dtypes else "float32")).itemsize
        sizes[r.key] = sum(int(np.prod(s, dtype=np.int64)) for s, _ in shape_dtypes) * item
    total_b = sum(sizes.values())
    done_b = resumed = 0
    arrays = prefetched(
        [r for r in source.rules if r.key not in done], lambda r: _cast(source.read_rule(r), want)
    )
    for i, r in enumerate(source.rules, 1):
        if r.key in done:
            resumed += 1
        else:
            arr = next(arrays)
            check(r.key, arr)
            writer.write(r.key, arr)
            del arr
            done.add(r.key)
            atomic_write(progress_file, json.dumps({"done": sorted(done)}))
        done_b += sizes[r.key]
        report(i, total_n, done_b, total_b)
    writer.finish([r.key for r in source.rules])
    if source.kept is not None and not out.done(KEPT_FILE):  # a multimodal model's rest
        write_kept(out, source.kept, want)
    out_dtype = _out_dtype(source, want)
    marker = {
        "format": "rlctl-trainer",
        "version": 1,
        "family": source.family,
        "dtype": out_dtype,
        "tensors": len(source.rules),
        "bytes": total_b,
    }
    progress_file.unlink(missing_ok=True)
    if out.staging_dir() is None:  # upload what was built locally
        for p in sorted(stage.rglob("*")):
            rel = str(p.relative_to(stage))
            if p.is_file() and not out.done(rel):
                with out.open(rel) as f, p.open("rb") as src_f:
                    while block := src_f.read(16 << 20):
                        f.write(block)
    out.write_bytes(TRAINER_MARKER, (json.dumps(marker, indent=1) + "\n").encode())
    if out.staging_dir() is None:
        import shutil

        shutil.rmtree(stage, ignore_errors=True)
    return total_n, total_b, resumed, out_dtype
