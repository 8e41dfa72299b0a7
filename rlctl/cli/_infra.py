"""Shared by ``rlctl network`` and ``rlctl cluster``: client lookup, the infra spec from
flags, plan rendering, apply.

Plans go to stdout (a table, or JSON with ``-o json``); confirmation, progress and
chatter go to stderr, so ``-o json`` output always parses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from rlctl.cli._options import state
from rlctl.cli._output import Output, make_table, styled

if TYPE_CHECKING:  # pragma: no cover
    from rlctl.core.plan import Change, Plan

_STYLE = {
    "create": "green",
    "update": "yellow",
    "delete": "red",
    "wait": "cyan",
    "unchanged": "dim",
}


def clients_for(ctx: typer.Context, project: str | None, region: str | None) -> Any:
    """The injected factory (tests) or the real one, built without I/O."""
    injected = state(ctx).clients
    if injected is not None:
        return injected
    from rlctl.core.clients import Clients

    return Clients(project, region)


def plan_clients(ctx: typer.Context, assumed: tuple[str, str] | None, spec: Any) -> Any:
    """The clients a plan reads: an empty project where the dry run assumed its
    location (no credentials: nothing is read), else ``clients_for``'s."""
    if assumed:
        from rlctl.core.clients import EmptyProject

        return EmptyProject(spec.project, spec.region)
    return clients_for(ctx, spec.project, spec.region)


# Where a dry run without credentials, project or region plans: placeholders it says it
# assumed (the project is never read: it is empty by assumption)
ASSUMED_PROJECT, ASSUMED_REGION = "my-project", "us-east5"


def assumed_location(
    ctx: typer.Context, dry_run: bool, config: str | None, project: str | None, region: str | None
) -> tuple[str, str] | None:
    """(project, region) when this ``--dry-run`` plans against an empty project: no
    injected clients and no Google Cloud credentials on this machine (the way
    ``terraform plan`` plans with no state). None: plan against the real project."""
    if not dry_run or state(ctx).clients is not None:
        return None
    from rlctl.core.clients import credentials_available

    if credentials_available():
        return None
    from rlctl.core.config.infra import check_location, resolve_location
    from rlctl.core.errors import ConfigError

    try:  # flags, config, RLCTL_*/CLOUDSDK_* env, gcloud's config: never ADC's network
        where = resolve_location(config, project, region)
    except ConfigError:  # one missing: a placeholder; one given is checked as given
        where = project or ASSUMED_PROJECT, region or ASSUMED_REGION
    check_location(*where, known_only=True)  # no API will read it: a known region
    return where


def assumed_note(project: str, region: str) -> str:
    return (
        f"no Google Cloud credentials: this plan assumes an empty project {project} "
        f"in {region} with every API enabled and no quota short (nothing was read or "
        "changed); 'gcloud auth application-default login' plans against the real one"
    )


def existing_cluster(
    ctx: typer.Context,
    name: str | None,
    config: str | None,
    project: str | None,
    region: str | None,
) -> tuple[str, str, str, Any]:
    """(name, project, region, clients) of a cluster named by argument or --config."""
    from rlctl.core.config.infra import resolve_cluster_name, resolve_location

    name = resolve_cluster_name(name, config)
    project, region = resolve_location(config, project, region, adc_project=adc_project)
    return name, project, region, clients_for(ctx, project, region)


def build_spec(config: str | None, name: str | None, **opts: Any):
    """Flags the user gave (None = not given) layered over the config file."""
    from rlctl.core.config.infra import build_infra_spec
    from rlctl.core.config.load import read_yaml

    accel = opts.pop("accelerators", None) or None
    num_slices = opts.pop("num_slices", None)
    if accel is None and num_slices and config:
        accel = [
            a if isinstance(a, str) else f"{a['type']} x{a.get('count', 1)}"
            for a in read_yaml(config).get("accelerators", [])
        ]
    if accel and num_slices:
        accel = [a if " x" in a else f"{a} x{num_slices}" for a in accel]
    capacity = None
    if opts.get("spot") and opts.get("reservation"):
        from rlctl.core.errors import ConfigError

        raise ConfigError(
            "--spot and --reservation exclude each other",
            hint="pick one: spot capacity, or the named reservation",
        )
    if opts.pop("spot", False):
        capacity = {"kind": "spot"}
    reservation = opts.pop("reservation", None)
    if reservation:
        capacity = {"kind": "reservation", "reservation": reservation}
    dcn = {
        "count": opts.pop("dcn_networks", None),
        "mtu": opts.pop("mtu", None),
        "cidrs": opts.pop("dcn_cidrs", None) or None,
    }
    bucket = {"name": opts.pop("bucket", None), "location": opts.pop("bucket_location", None)}
    flags: dict[str, Any] = {
        "cluster": name,
        "accelerators": accel,
        "capacity": capacity,
        "dcn": dcn,
        "bucket": bucket,
        "mode": "autopilot" if opts.pop("autopilot", False) else None,
        **opts,
    }
    overrides = flags.pop("overrides", None)
    return build_infra_spec(config, flags, overrides, adc_project=adc_project)


def adc_project() -> str | None:
    from rlctl.core.errors import require_extra

    require_extra("google.auth", "gcp")
    from rlctl.core.clients import adc_project as find

    return find()


def _details(c: Change) -> str:
    if c.diff:
        return ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in c.diff.items())
    parts = []
    for k, v in c.fields.items():
        if isinstance(v, list):
            v = ",".join(str(x) for x in v)
        parts.append(f"{k}={v}")
    return " ".join(parts)


def _cost(plan: Plan, c: Change) -> str:
    if c.kind in ("nodepool", "cluster") and c.cost_per_hour is None and plan.cost:
        return "n/a"
    return "" if c.cost_per_hour is None else f"${c.cost_per_hour:,.2f}"


def _title(plan: Plan) -> str:
    return f"Plan: {plan.operation} {plan.target} ({plan.project}, {plan.location})"


def plan_table(plan: Plan):
    rows = [
        [styled(c.action, _STYLE.get(c.action, "")), c.kind, c.name, _details(c), _cost(plan, c)]
        for c in plan.changes
    ]
    return make_table(_title(plan), ["ACTION", "RESOURCE", "NAME", "DETAILS", "EST. $/H"], rows)


def plan_text(plan: Plan, width: int) -> str:
    """The plan where its table does not fit one line per change (a cluster's plan on
    most terminals; any plan in a pipe): one line per change with its name whole, then
    its details wrapped below it. A table at 80 columns cut names and every detail to
    a few letters."""
    import textwrap

    lines = [_title(plan)]
    for c in plan.changes:
        cost = _cost(plan, c)
        lines.append(f"  {c.action:<9} {c.kind} {c.name}" + (f"  ({cost}/h)" if cost else ""))
        details = _details(c)
        if details:
            lines += textwrap.wrap(
                details,
                width=max(width - 1, 40),
                initial_indent=" " * 12,
                subsequent_indent=" " * 12,
                break_long_words=False,
                break_on_hyphens=False,
            )
    return "\n".join(lines)


def summary(plan: Plan) -> str:
    n = plan.counts()
    parts = [f"{n.get(a, 0)} to {a}" for a in ("create", "update", "delete")]
    if n.get("wait"):
        parts.append(f"{n['wait']} to wait for")
    parts.append(f"{n.get('unchanged', 0)} unchanged")
    lines = ["Plan: " + ", ".join(parts) + "."]
    if plan.cost:
        total = "n/a" if plan.cost.per_hour is None else f"${plan.cost.per_hour:,.2f}/hour"
        lines.append(f"Estimated node cost ({plan.cost.capacity}): {total} -- {plan.cost.note}")
        if plan.cost.unknown:
            lines.append(f"  no list price for: {', '.join(plan.cost.unknown)}")
    lines += [f"note: {x}" for x in plan.notes]
    return "\n".join(lines)


def show_plan(out: Output, plan: Plan) -> None:
    """Table mode: the plan on stdout. JSON mode prints later, once, with the result."""
    if not out.json:
        table = plan_table(plan)
        out.result(None, table if out.fits(table) else plan_text(plan, out.width))
        out.result(None, summary(plan))


def apply_with_progress(out: Output, plan: Plan, apply: Any) -> dict[str, Any]:
    """Run ``apply(on_event)`` showing one progress line per change on stderr."""
    pending = plan.pending()
    with out.progress() as progress:
        tasks = {
            c.key: progress.add_task(f"{c.action} {c.key}", total=1, info="queued") for c in pending
        }

        def on_event(key: str, state_: str, info: str) -> None:
            t = tasks.get(key)
            if t is None:
                return
            if state_ == "done":
                progress.update(t, completed=1, info="done")
            elif state_ == "error":
                progress.update(t, info=f"failed: {info[:80]}")
            else:
                progress.update(t, info=info)

        return apply(on_event)


def run_plan(out: Output, plan: Plan, dry_run: bool, apply: Any, done_msg: str) -> None:
    """The plan -> confirm -> apply -> report sequence every mutating command shares."""
    show_plan(out, plan)
    dump = plan.model_dump(mode="json")
    if dry_run:
        if out.json:
            out.result(dump)
        else:
            out.info("dry run: nothing was changed")
        return
    if plan.noop:
        msg = (
            f"nothing to do: {plan.target} already matches the spec"
            if plan.operation == "create"
            else f"nothing to delete for {plan.target}"
        )
        out.info(msg)
        if out.json:
            out.result({"plan": dump, "result": {"noop": True, "applied": []}})
        return
    n = len(plan.pending())
    out.confirm(f"Apply {n} change{'s' if n != 1 else ''} to {plan.project}?")
    result = apply_with_progress(out, plan, apply)
    out.info(done_msg)
    if out.json:
        out.result({"plan": dump, "result": result})
