"""``rlctl train grpo|gspo``: build a RunSpec from YAML + flags, then run it.

Without ``--cluster`` the trainer runs on this machine; with it, the same spec is
written to the cluster's gs:// run store and a JobSet/PathwaysJob/RayJob runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

import typer

from rlctl.cli._complete import accelerators, run_spec_keys
from rlctl.cli._errors import guarded
from rlctl.cli._groups import OptionGroup, grouped
from rlctl.cli._options import (
    BackendOpt,
    Cloud,
    ConfigOpt,
    DryRunOpt,
    OutputOpt,
    TrainClusterOpt,
    TrainImageOpt,
    TrainRootOpt,
    YesOpt,
    make_output,
)

if TYPE_CHECKING:  # pragma: no cover
    from rlctl.core.runs.where import OnCluster, Where

app = typer.Typer(
    help="Start a training run (GRPO or GSPO).\n\n"
    "Example: rlctl train grpo --steps 20 --name my-first-run",
    no_args_is_help=True,
)

_EXAMPLES = {
    "grpo": "rlctl train grpo --steps 20 --name my-first-run",
    "gspo": "rlctl train gspo --steps 20 --set training.num_iterations=2",
}
_CLUSTER_EXAMPLES = {
    "grpo": "rlctl train grpo --cluster rl --image us-docker.pkg.dev/p/r/rlctl:1 --dry-run",
    "gspo": "rlctl train gspo --cluster rl --backend pathways --image IMG --steps 200",
}


@dataclass(frozen=True)
class Sets:
    """An option's ``Annotated`` mark: the run-spec field it sets (typer ignores it)."""

    path: str


NameOpt = Annotated[
    str | None, typer.Option("--name", "-n", help="Run name (DNS-1035 label)."), Sets("name")
]
StepsOpt = Annotated[
    int | None, typer.Option("--steps", help="Optimizer steps."), Sets("training.steps")
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="smollm2-135m-instruct, a local HF folder, or a hub id."),
    Sets("model.source"),
]
DatasetOpt = Annotated[
    str | None,
    typer.Option(
        "--dataset",
        help="arithmetic (embedded generator, the default), gsm8k "
        "(openai/gsm8k), or a Hugging Face hub dataset id OWNER/NAME (config: --set "
        "data.config=main; splits: data.split, data.eval_split).",
    ),
    Sets("data.dataset"),
]
DataPathOpt = Annotated[
    str | None,
    typer.Option(
        "--data-path",
        help="Train on a local file: JSONL, JSON, Parquet or CSV, "
        "with question/answer, prompt + answer (or solution, ...) or chat 'messages' "
        "columns (else name them: --set data.prompt_column=C --set "
        "data.answer_column=C); eval file: --set data.eval_path=F.",
    ),
    Sets("data.path"),
]
LrOpt = Annotated[
    float | None, typer.Option("--lr", help="Learning rate."), Sets("training.learning_rate")
]
GenOpt = Annotated[
    int | None,
    typer.Option("--num-generations", "-G", help="Samples per prompt."),
    Sets("rollout.num_generations"),
]
PromptsOpt = Annotated[
    int | None,
    typer.Option("--prompts-per-step", help="Prompts per step."),
    Sets("training.prompts_per_step"),
]
TokensOpt = Annotated[
    int | None,
    typer.Option("--max-new-tokens", help="Completion length cap."),
    Sets("rollout.max_new_tokens"),
]
BetaOpt = Annotated[
    float | None,
    typer.Option("--beta", help="KL weight (0 = no reference)."),
    Sets("training.beta"),
]
SeedOpt = Annotated[
    int | None, typer.Option("--seed", help="Training seed."), Sets("training.seed")
]
EvalOpt = Annotated[
    int | None, typer.Option("--eval-size", help="Held-out prompts (0 = off)."), Sets("eval.size")
]
AcceleratorOpt = Annotated[
    str | None,
    typer.Option(
        "--accelerator",
        "-a",
        autocompletion=accelerators,
        help="Which accelerator pools to use when the cluster has several (v6e-16).",
    ),
]
DcnNetworksOpt = Annotated[
    int | None,
    typer.Option(
        "--dcn-networks",
        min=0,
        max=4,
        help="Cluster dry runs without credentials: the DCN networks of the cluster "
        "planned against, as 'cluster create --dcn-networks N' makes them (default 0); a "
        "real cluster's node pools say their own.",
    ),
]
MinSlicesOpt = Annotated[
    int | None,
    typer.Option(
        "--min-slices",
        min=1,
        help="Cluster runs, ray backend: fewest slices the elastic job may shrink "
        "to (default: all of them).",
    ),
]
QueueOpt = Annotated[
    str | None,
    typer.Option(
        "--queue",
        help="Cluster runs: the Kueue LocalQueue of the namespace the workload waits in "
        "for quota (label kueue.x-k8s.io/queue-name; Kueue installed on the cluster).",
    ),
]
PriorityOpt = Annotated[
    str | None,
    typer.Option(
        "--priority",
        help="Cluster runs: the Kueue WorkloadPriorityClass of the workload, by name "
        "(e.g. high; label kueue.x-k8s.io/priority-class).",
    ),
]
HostMemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--memory",
        help="Cluster runs: memory of each accelerator host's pod, "
        "requested and limited (e.g. 200G; default: what a node of its pool offers "
        "pods; checked before submitting).",
    ),
]
HostCpuOpt = Annotated[
    str | None,
    typer.Option(
        "--cpu",
        help="Cluster runs: CPUs each accelerator host's pod requests "
        "(default: what a node of its pool offers pods, after threads per core; "
        "checked before submitting).",
    ),
]
RewardOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--reward",
        help="A reward function, repeatable (they are summed, each "
        "weighted): correct, format, package.module:function or "
        "file.py:function (TRL's signature or fn(completion, gold)), with :WEIGHT "
        "to weigh it (default 1, format 0.1), e.g. --reward my_rewards.py:length:0.5. "
        "Replaces the default correct + format.",
    ),
    Sets("rewards"),
]
LoraRankOpt = Annotated[
    int | None,
    typer.Option(
        "--lora-rank",
        help="Train LoRA adapters of this rank instead of every weight (as TRL's peft_config r).",
    ),
    Sets("training.lora_rank"),
]
LoraAlphaOpt = Annotated[
    float | None,
    typer.Option("--lora-alpha", help="LoRA scale numerator (default 2 x --lora-rank)."),
    Sets("training.lora_alpha"),
]
TrainSetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        autocompletion=run_spec_keys,
        help="Override any spec field: --set training.steps=5 (repeatable; "
        "keys complete with TAB).",
    ),
]
PrintOpt = Annotated[
    bool,
    typer.Option(
        "--print-config",
        help="Print the resolved spec and exit, each value "
        "set by a flag, --set, RLCTL_SET or --config marked with its source.",
    ),
]
PrintPromptOpt = Annotated[
    bool,
    typer.Option(
        "--print-prompt",
        help="Print the exact prompt text (chat template applied) of the first "
        "training and the first eval problem, and exit; reads the model's "
        "tokenizer and the data, creates no run.",
    ),
]


@dataclass(frozen=True)
class SpecFlags(OptionGroup):
    """The flags that each set one field of the run spec (``--set`` sets any of them).

    The flag is the field's name with dashes (``data_path`` is ``--data-path``), so
    ``--print-config`` names each value's source from this declaration alone.
    """

    name: NameOpt = None
    steps: StepsOpt = None
    model: ModelOpt = None
    dataset: DatasetOpt = None
    data_path: DataPathOpt = None
    lr: LrOpt = None
    num_generations: GenOpt = None
    prompts_per_step: PromptsOpt = None
    max_new_tokens: TokensOpt = None
    beta: BetaOpt = None
    seed: SeedOpt = None
    eval_size: EvalOpt = None
    reward: RewardOpt = None
    lora_rank: LoraRankOpt = None
    lora_alpha: LoraAlphaOpt = None

    def values(self) -> dict[str, object]:
        """Each spec path with its flag's value (None: not given)."""
        got: dict[str, object] = {path: getattr(self, name) for name, path in _spec_paths()}
        if self.reward:
            from rlctl.core.runs.spec import reward_flag

            got["rewards"] = [reward_flag(r) for r in self.reward]
        return got


def _spec_paths() -> list[tuple[str, str]]:
    """(field, spec path) of each SpecFlags field, from its option's ``Sets``."""
    hints = get_type_hints(SpecFlags, include_extras=True)
    paths = []
    for f in fields(SpecFlags):
        (path,) = [m.path for m in hints[f.name].__metadata__ if isinstance(m, Sets)]
        paths.append((f.name, path))
    return paths


# the flag that sets each spec path, for --print-config's "where it came from"
FLAG_OF = {path: "--" + name.replace("_", "-") for name, path in _spec_paths()}
FLAG_OF["output.root"] = "--runs-dir"


@dataclass(frozen=True)
class ClusterFlags(OptionGroup):
    """Where and how a cluster run goes (each refused without --cluster)."""

    cluster: TrainClusterOpt = None
    backend: BackendOpt = "jobset"
    image: TrainImageOpt = None
    accelerator: AcceleratorOpt = None
    dcn_networks: DcnNetworksOpt = None
    min_slices: MinSlicesOpt = None
    queue: QueueOpt = None
    priority: PriorityOpt = None
    memory: HostMemoryOpt = None
    cpu: HostCpuOpt = None
    cloud: Cloud = field(default_factory=Cloud)

    def submit_options(self) -> dict[str, Any]:
        """What each host's pod asks and where it queues (``core.runs.cluster.HostResources``)."""
        return {
            "min_slices": self.min_slices,
            "memory": self.memory,
            "cpu": self.cpu,
            "queue": self.queue,
            "priority": self.priority,
        }


@dataclass(frozen=True)
class TrainOptions(OptionGroup):
    """Every option of ``train grpo|gspo``, typed, as the command receives them."""

    config: ConfigOpt = None
    set_: TrainSetOpt = None
    spec: SpecFlags = field(default_factory=SpecFlags)
    runs_dir: TrainRootOpt = None
    on: ClusterFlags = field(default_factory=ClusterFlags)
    print_config: PrintOpt = False
    print_prompt: PrintPromptOpt = False
    output: OutputOpt = "table"
    yes: YesOpt = False
    dry_run: DryRunOpt = False


def _run(algorithm: str, ctx: typer.Context, opts: TrainOptions, where: Where) -> None:
    from rlctl.core.config.load import dump_yaml
    from rlctl.core.runs.spec import resolve_run_spec
    from rlctl.core.runs.where import Local

    out = make_output(ctx, opts.output, opts.yes)
    local = isinstance(where, Local)
    # on a cluster the pods write to the cluster's gs:// store
    flags = {**opts.spec.values(), "output.root": where.root if isinstance(where, Local) else None}
    resources = opts.on.submit_options()
    given = [f for f, v in resources.items() if v is not None]
    if given and local:
        from rlctl.core.errors import ConfigError

        raise ConfigError(
            f"--{given[0].replace('_', '-')} is for cluster runs",
            hint="add --cluster NAME, or leave it out for a run on this machine",
        )
    spec = resolve_run_spec(algorithm, opts.config, opts.set_, flags)
    if opts.print_prompt:
        _print_prompts(out, spec)
        return
    if opts.print_config or (opts.dry_run and local):
        from rlctl.cli._sources import annotated_yaml
        from rlctl.core.config.load import env_overrides
        from rlctl.core.runs.spec import spec_sources

        named = {k: FLAG_OF.get(k, k) for k, v in flags.items() if v is not None}
        if isinstance(where, Local) and where.root is None:
            named.pop("output.root", None)
        sources = spec_sources(opts.config, opts.set_, named, env_overrides())
        out.result(spec.model_dump(mode="json"), annotated_yaml(dump_yaml(spec), sources))
        return
    if not isinstance(where, Local):
        _no_reward_files(spec)
        _submit(out, spec, where, opts.on.backend, opts.on.image, opts.dry_run, resources)
        return
    from rlctl.cli.progress import TrainProgress
    from rlctl.core.runs.local import train_local

    with out.stdout_for_json_only(), TrainProgress(out) as progress:
        record = train_local(spec, progress=progress.callback)
    out.result(record.model_dump(mode="json"), progress.summary(record))


def _print_prompts(out, spec) -> None:
    from rlctl.core.errors import require_extra

    require_extra("tokenizers", "train")
    from rlctl.core.trainer.data.prompts import first_prompts

    shown = first_prompts(spec)
    text = [f"--- first training prompt (step 1) ---\n{shown['train']}"]
    text.append(
        f"--- first eval prompt ---\n{shown['eval']}"
        if shown["eval"] is not None
        else "--- no eval prompt (eval.size is 0) ---"
    )
    out.result(shown, "\n".join(text).rstrip("\n"))


def _no_reward_files(spec) -> None:
    """A reward file is on this machine; a pod cannot read it."""
    from rlctl.core.config.models import is_reward_file
    from rlctl.core.errors import ConfigError

    files = [e.fn for e in spec.rewards if is_reward_file(e.fn)]
    if files:
        raise ConfigError(
            f"reward {files[0]!r} is a file on this machine, which the cluster's pods cannot read",
            hint="put the function in a package installed in the --image and "
            "name it package.module:function",
        )


def _submit(
    out,
    spec,
    where: OnCluster,
    backend: str,
    image: str | None,
    dry_run: bool,
    resources: dict[str, Any],
) -> None:
    from rlctl.core.clients import EmptyProject
    from rlctl.core.runs import cluster as core
    from rlctl.core.runs.results import SubmitPreview

    clients = where.clients
    if isinstance(clients, EmptyProject):  # a dry run without credentials
        import shlex

        from rlctl.cli._infra import assumed_note

        name = where.ref.cluster
        assert name is not None, "train --cluster NAME: locate_new sets it"
        out.info(
            f"{assumed_note(clients.project, clients.region)}; cluster {name} as "
            f'"rlctl cluster create {name} -a {shlex.quote(where.ref.accelerator or "")} '
            f'--bucket {core.assumed_bucket(clients.project, name)}" makes it'
        )
    # the HF token comes from the environment only: a flag would land in shell history
    with out.phases(f"looking up cluster {where.ref.cluster} ...") as say:
        result = core.submit(
            clients,
            where.ref,
            spec,
            backend,
            image,
            hf_token=core.hf_token_from_env(),
            dry_run=dry_run,
            resources=core.HostResources(**resources),
            on_progress=lambda line: say(f"device memory: {line} ..."),
        )
    for p in result.placements:  # where each pod group goes (the fit check passed)
        out.info(f"  {p.group}: {p.pods} pod{'s' * (p.pods != 1)} -> {', '.join(p.pools)}")
    fit = result.device_fit
    if fit is not None:  # its programs compiled for the accelerator (or why not)
        out.info(f"  device memory: {fit.line}")
        for line in [*fit.detail(), *fit.notes]:
            out.info(f"    {line}")
    for note in result.notes:
        out.info(f"  note: {note}")
    if isinstance(result, SubmitPreview):
        out.info(
            f"dry run: {len(result.manifests)} objects for {where.ref.cluster} "
            f"({result.accelerator}), run store {result.runs_dir}; nothing changed"
        )
        if out.json:
            out.result(result.manifests)
        else:  # raw text: YAML brackets must not be read as rich markup
            out.line(out.yaml_documents(result.manifests).rstrip("\n"))
        return
    for line in result.applied:
        out.info(f"  {line}")
    out.info(
        f"next: rlctl status {result.name} --runs-dir {result.runs_dir}"
        f"  |  rlctl logs {result.name} -f --runs-dir {result.runs_dir}"
    )
    out.result(
        result.model_dump(mode="json"),
        f"submitted run {result.name} to "
        f"{result.cluster} ({result.backend}, {result.accelerator}); store {result.path}",
    )


def _command(algorithm: str):
    @grouped
    def command(ctx: typer.Context, opts: TrainOptions) -> None:
        on, cloud = opts.on, opts.on.cloud
        if on.dcn_networks is not None and not on.cluster:
            from rlctl.core.errors import ConfigError

            raise ConfigError(
                "--dcn-networks is for cluster runs",
                hint="add --cluster NAME, or leave it out for a run on this machine",
            )
        if on.cluster and not (opts.print_config or opts.print_prompt):
            from rlctl.core.errors import require_cloud

            require_cloud()  # before any work: exit 8 with the install line
        from rlctl.cli._infra import assumed_location, clients_for
        from rlctl.core.runs.where import locate_new

        assumed = (
            assumed_location(ctx, opts.dry_run, None, cloud.project, cloud.region)
            if on.cluster
            else None
        )
        # no credentials: plan against the cluster 'cluster create' would make
        if assumed and on.cluster:  # (assumed implies cluster; mypy needs it said)
            from rlctl.core.runs.cluster import assumed_cluster

            cluster = on.cluster
            where = locate_new(
                opts.runs_dir,
                cluster,
                *assumed,
                on.accelerator,
                lambda: assumed_cluster(*assumed, cluster, on.accelerator, on.dcn_networks or 0),
            )
        else:
            if on.cluster and on.dcn_networks is not None:
                make_output(ctx, opts.output, opts.yes).info(
                    f"note: --dcn-networks {on.dcn_networks} is for a dry run without "
                    f"credentials; cluster {on.cluster}'s node pools say how many it has"
                )
            where = locate_new(
                opts.runs_dir,
                on.cluster,
                cloud.project,
                cloud.region,
                on.accelerator,
                lambda: clients_for(ctx, cloud.project, cloud.region),
            )
        _run(algorithm, ctx, opts, where)

    command.__name__ = f"train_{algorithm}"
    command.__doc__ = (
        f"Train with {algorithm.upper()} on this machine (default) or a cluster.\n\n"
        f"Runs the embedded SmolLM2-135M-Instruct on arithmetic word problems unless told "
        f"otherwise; writes ./runs/NAME (spec, status, metrics, TensorBoard, checkpoints, "
        f"eval).\n\nWith --cluster NAME it submits the run to that GKE cluster instead: the "
        f"accelerator shape comes from the cluster's node pools, the run store is "
        f"gs://BUCKET/runs of the cluster's bucket (or --runs-dir gs://...), and --dry-run "
        f"prints the manifests (YAML; a JSON list with -o json) and changes nothing. Both first "
        f"place every pod on the cluster's pools and, with the compile-tpu or compile-gpu "
        f"extra, compile the run for the accelerator to check each chip's memory (a run "
        f"that cannot fit is refused with the setting that fixes it). A Hugging "
        f"Face token for gated models is read from $HF_TOKEN only and stored in a Secret."
        f"\n\nExample: {_EXAMPLES[algorithm]}\n\nExample: {_CLUSTER_EXAMPLES[algorithm]}"
    )
    return guarded(command)


app.command("grpo")(_command("grpo"))
app.command("gspo")(_command("gspo"))
