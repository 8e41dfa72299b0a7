"""``rlctl checkpoint-convert``: models in (HF, GGUF) and trained policies out (HF).

Parses the options, calls ``core/checkpoints/convert.py::convert`` once, renders
its ``ConvertResult``; progress (tensors, bytes) goes to stderr.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer

from rlctl.cli._errors import guarded
from rlctl.cli._options import OutputOpt, RootOpt, make_output

SrcArg = Annotated[
    str,
    typer.Argument(
        help="A run (runs/NAME, NAME, gs://BUCKET/runs/NAME), an Orbax checkpoint folder, a "
        "trainer folder, a Hugging Face safetensors folder or file, or a .gguf file."
    ),
]
DstArg = Annotated[str, typer.Argument(help="Output folder: a local path or gs://BUCKET/PATH.")]
ToOpt = Annotated[
    str,
    typer.Option(
        "--to",
        help="hf (safetensors + config + tokenizer, for transformers/vLLM; a LoRA run's "
        "adapters merged into its base), trainer (an Orbax checkpoint that model.source can "
        "name) or peft (a LoRA run's adapters alone, as a PEFT adapter folder).",
        case_sensitive=False,
    ),
]
StepOpt = Annotated[
    int | None,
    typer.Option("--step", help="Checkpoint step of a run (default: its latest complete one)."),
]
DtypeOpt = Annotated[
    str | None,
    typer.Option("--dtype", help="bf16 or fp32 (default: the source's).", case_sensitive=False),
]
VerifyOpt = Annotated[
    bool,
    typer.Option(
        "--verify", help="Read DST back: count, names, shapes, dtypes, SHA-256 of each tensor."
    ),
]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace DST if it exists.")]
AllowNonFiniteOpt = Annotated[
    bool,
    typer.Option(
        "--allow-non-finite",
        help="Export tensors holding NaN or inf as they are (refused "
        "otherwise: a model that diverged).",
    ),
]


@guarded
def checkpoint_convert(
    ctx: typer.Context,
    src: SrcArg,
    dst: DstArg,
    to: ToOpt = "hf",
    step: StepOpt = None,
    dtype: DtypeOpt = None,
    verify: VerifyOpt = False,
    overwrite: OverwriteOpt = False,
    allow_non_finite: AllowNonFiniteOpt = False,
    runs_dir: RootOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Convert a model or a trained policy, one tensor at a time.

    Peak memory: a few of the largest tensors; locally or straight between gs:// locations.

    DST appears only when complete; an interrupted conversion, run again, skips what it did.

    Example: rlctl checkpoint-convert runs/my-run ./my-run-hf --to hf --verify

    Example: rlctl checkpoint-convert ./Qwen3-0.6B gs://BUCKET/models/qwen3 --to trainer
    """
    from rlctl.core.checkpoints.convert import convert, target
    from rlctl.core.units import human_bytes

    out = make_output(ctx, output)
    with out.progress() as bar:
        task = None
        last = 0.0

        def on_progress(n: int, total: int, done_b: int, total_b: int) -> None:
            # at most one update a second (a log gets a line a second, not one per
            # tensor of a model with thousands), and always the last one
            nonlocal task, last
            now = time.monotonic()
            if task is not None and n < total and now - last < 1.0:
                return
            last = now
            info = f"{human_bytes(done_b)} / {human_bytes(total_b)}"
            if task is None:
                task = bar.add_task("tensors", total=total, info=info)
            bar.update(task, completed=n, info=info)

        result = convert(
            src,
            dst,
            to=target(to),
            step=step,
            dtype=None if dtype is None else dtype.lower(),
            verify=verify,
            overwrite=overwrite,
            runs_dir=runs_dir,
            on_progress=on_progress,
            allow_non_finite=allow_non_finite,
        )
    rate = result.bytes / result.seconds if result.seconds else 0.0
    human = (
        f"wrote {result.dst} ({result.to}, {result.family}, {result.dtype}): "
        f"{result.tensors} tensors, {human_bytes(result.bytes)} in {result.seconds:.1f} s "
        f"({human_bytes(rate)}/s), peak RSS {human_bytes(result.peak_rss_bytes)}"
        + (f", {result.resumed} already done by an earlier run" if result.resumed else "")
        + (
            f"; {result.kept} tensors outside the text model (vision tower) carried unchanged"
            if result.kept
            else ""
        )
        + ("; verified" if result.verified else "")
    )
    out.result(result.to_dict(), human)
