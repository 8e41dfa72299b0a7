"""``rlctl train grpo|gspo``: build a RunSpec from YAML + flags, then run it.

Without ``--cluster`` the trainer runs on this machine; the same spec is what a
cluster workload would run.
"""

from __future__ import annotations

from typing import Annotated

import typer

from rlctl.cli._errors import guarded
from rlctl.cli._options import ConfigOpt, OutputOpt, SetOpt, YesOpt, make_output

app = typer.Typer(help="Start a training run (GRPO or GSPO).", no_args_is_help=True)

_EXAMPLES = {
    "grpo": "rlctl train grpo --steps 20 --name my-first-run",
    "gspo": "rlctl train gspo --steps 20 --set training.num_iterations=2",
}

NameOpt = Annotated[str | None, typer.Option("--name", "-n", help="Run name (DNS-1035 label).")]
StepsOpt = Annotated[int | None, typer.Option("--steps", help="Optimizer steps.")]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="smollm2-135m-instruct, a local HF folder, or a hub id."),
]
DatasetOpt = Annotated[str | None, typer.Option("--dataset", help="arithmetic | gsm8k | jsonl.")]
DataPathOpt = Annotated[str | None, typer.Option("--data-path", help="Local .jsonl/.parquet file.")]
LrOpt = Annotated[float | None, typer.Option("--lr", help="Learning rate.")]
GenOpt = Annotated[int | None, typer.Option("--num-generations", "-G", help="Samples per prompt.")]
PromptsOpt = Annotated[int | None, typer.Option("--prompts-per-step", help="Prompts per step.")]
TokensOpt = Annotated[int | None, typer.Option("--max-new-tokens", help="Completion length cap.")]
BetaOpt = Annotated[float | None, typer.Option("--beta", help="KL weight (0 = no reference).")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Training seed.")]
EvalOpt = Annotated[int | None, typer.Option("--eval-size", help="Held-out prompts (0 = off).")]
RootOpt = Annotated[
    str | None, typer.Option("--runs-dir", help="Run store root.", envvar="RLCTL_RUNS_DIR")
]
ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", help="Run on this GKE cluster instead of locally.")
]
PrintOpt = Annotated[
    bool, typer.Option("--print-config", help="Print the resolved spec and exit.")
]


def _run(
    algorithm: str, ctx: typer.Context, config: str | None, overrides: list[str] | None,
    flags: dict[str, object], print_config: bool, cluster: str | None, output: str, yes: bool,
) -> None:
    from rlctl.core.config.load import dump_yaml
    from rlctl.core.errors import ConfigError
    from rlctl.core.runs.spec import resolve_run_spec

    out = make_output(ctx, output, yes)
    spec = resolve_run_spec(algorithm, config, overrides, flags)
    if print_config:
        out.result(spec.model_dump(mode="json"), dump_yaml(spec))
        return
    if cluster:
        raise ConfigError(
            "training on a cluster (--cluster) is not available in this version",
            hint="run locally without --cluster",
        )
    from rlctl.cli.progress import TrainProgress
    from rlctl.core.runs.local import train_local

    with TrainProgress(out) as progress:
        record = train_local(spec, progress=progress.callback)
    out.result(record, progress.summary(record))


def _command(algorithm: str):
    def command(
        ctx: typer.Context,
        config: ConfigOpt = None,
        set_: SetOpt = None,
        name: NameOpt = None,
        steps: StepsOpt = None,
        model: ModelOpt = None,
        dataset: DatasetOpt = None,
        data_path: DataPathOpt = None,
        lr: LrOpt = None,
        num_generations: GenOpt = None,
        prompts_per_step: PromptsOpt = None,
        max_new_tokens: TokensOpt = None,
        beta: BetaOpt = None,
        seed: SeedOpt = None,
        eval_size: EvalOpt = None,
        runs_dir: RootOpt = None,
        cluster: ClusterOpt = None,
        print_config: PrintOpt = False,
        output: OutputOpt = "table",
        yes: YesOpt = False,
    ) -> None:
        flags = {
            "name": name,
            "training.steps": steps,
            "model.source": model,
            "data.name": dataset,
            "data.path": data_path,
            "training.learning_rate": lr,
            "rollout.num_generations": num_generations,
            "training.prompts_per_step": prompts_per_step,
            "rollout.max_new_tokens": max_new_tokens,
            "training.beta": beta,
            "training.seed": seed,
            "eval.size": eval_size,
            "output.root": runs_dir,
        }
        _run(algorithm, ctx, config, set_, flags, print_config, cluster, output, yes)

    command.__name__ = f"train_{algorithm}"
    command.__doc__ = (
        f"Train with {algorithm.upper()} on this machine (default) or a cluster.\n\n"
        f"Runs the embedded SmolLM2-135M-Instruct on arithmetic word problems unless told "
        f"otherwise; writes ./runs/NAME (spec, status, metrics, TensorBoard, checkpoints, "
        f"eval).\n\nExample: {_EXAMPLES[algorithm]}"
    )
    return guarded(command)


app.command("grpo")(_command("grpo"))
app.command("gspo")(_command("gspo"))
