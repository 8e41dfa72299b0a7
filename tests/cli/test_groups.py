"""Option groups: each command's options declared once, typed, and what typer makes of them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from rlctl.cli._groups import OptionGroup, grouped
from rlctl.cli._options import Cloud, RunWhere
from rlctl.cli.app import app
from rlctl.cli.train import FLAG_OF, ClusterFlags, SpecFlags, TrainOptions, _spec_paths

A = Annotated[int | None, typer.Option("--a", help="a")]
B = Annotated[str, typer.Option("--b", help="b")]


@dataclass(frozen=True)
class Inner(OptionGroup):
    b: B = "x"


@dataclass(frozen=True)
class Outer(OptionGroup):
    a: A = None
    inner: Inner = field(default_factory=Inner)


def _typer_app(fn) -> typer.Typer:
    t = typer.Typer()
    t.command()(fn)
    t.command("other")(lambda: None)  # two commands: the first is a subcommand
    return t


def test_a_group_is_flattened_for_typer_and_built_again_for_the_command():
    got: list[Outer] = []

    @grouped
    def cmd(ctx: typer.Context, opts: Outer, plain: Annotated[int, typer.Option()] = 1) -> None:
        assert hasattr(ctx, "find_root")  # the context, passed by name as typer does
        got.append(opts)

    r = CliRunner().invoke(_typer_app(cmd), ["cmd", "--a", "3", "--b", "y", "--plain", "2"])
    assert r.exit_code == 0, r.output
    assert got == [Outer(a=3, inner=Inner(b="y"))]
    r = CliRunner().invoke(_typer_app(cmd), ["cmd"])
    assert got[-1] == Outer()  # the defaults are the group's own
    help_ = CliRunner().invoke(_typer_app(cmd), ["cmd", "--help"]).output
    assert "--a" in help_ and "--b" in help_ and "--plain" in help_ and "--opts" not in help_


def test_an_option_declared_twice_in_one_command_is_refused_when_declared():
    with pytest.raises(TypeError, match="option names declared twice: a"):

        @grouped
        def cmd(opts: Outer, a: A = None) -> None: ...


def test_a_group_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Outer().a = 1  # type: ignore[misc]


def _options(*path: str) -> dict:
    cmd = get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return {p.name: p for p in cmd.params if p.name}


@pytest.mark.parametrize("algorithm", ["grpo", "gspo"])
def test_train_takes_every_field_of_its_options_and_nothing_else(algorithm):
    params = _options("train", algorithm)
    declared = [
        f.name
        for group in (TrainOptions, SpecFlags, ClusterFlags, Cloud)
        for f in dataclasses.fields(group)
        if f.name not in ("spec", "on", "cloud")
    ]
    assert sorted(params) == sorted(declared)
    assert len(declared) == 35  # the old 33-parameter closure's flags, --queue, --priority


def test_each_spec_flag_is_named_by_print_config_from_its_declaration():
    params = _options("train", "grpo")
    for name, path in _spec_paths():
        assert FLAG_OF[path] in params[name].opts, (name, path)
    assert len(FLAG_OF) == len(dataclasses.fields(SpecFlags)) + 1  # and --runs-dir


@pytest.mark.parametrize("command", [("status",), ("logs",), ("resume",), ("delete", "run")])
def test_the_run_commands_share_one_declaration_of_where_the_run_is(command):
    names = ("runs_dir", "cluster", "project", "region")

    def where(*path: str) -> list:
        return [(p.name, p.opts, p.help) for p in _options(*path).values() if p.name in names]

    # the four in RunWhere's order, each with the same flags and help in every command
    assert [name for name, _, _ in where(*command)] == list(names)
    assert where(*command) == where("status")
    assert {f.name for f in dataclasses.fields(RunWhere)} == {"runs_dir", "cluster", "cloud"}


def test_train_flags_reach_the_spec_through_the_options_object():
    r = CliRunner().invoke(
        app,
        ["train", "grpo", "--print-config", "--steps", "7", "--lr", "0.5", "-G", "3"],
    )
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert "  steps: 7  # from --steps" in lines
    assert "  learning_rate: 0.5  # from --lr" in lines
    assert "  num_generations: 3  # from --num-generations" in lines


def test_a_cluster_flag_without_cluster_is_still_one_line():
    r = CliRunner().invoke(app, ["train", "grpo", "--memory", "200G", "--print-config"])
    assert r.exit_code == 2
    assert "--memory is for cluster runs" in r.stderr
