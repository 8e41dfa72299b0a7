"""The fuzzer's cases are data (bench/fuzz_cases/*.yaml): every file loads, every hook
the Python registers is named by a case and documented, and each mistake a data file
can hold is refused when it is read, naming the file and the case, not a harness error
halfway through a 20-minute run. Nothing here runs rlctl."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from bench.fuzz.fixtures import Ctx, Fixtures
from bench.fuzz.loader import CASES_DIR, FAMILIES, CaseDataError, load_cases, load_family
from bench.fuzz.registry import CONTENTS, HOOKS


def _ctx() -> Ctx:
    return Ctx(Path("/T/case"), Fixtures(Path("/T"), listing=True), random.Random(0))


def test_every_family_loads_in_order_with_unique_ids():
    cases = load_cases()
    ids = [c.cid for c in cases]
    assert len(ids) == len(set(ids)) > 500
    assert list(dict.fromkeys(c.family for c in cases)) == list(FAMILIES)
    assert all((c.argv is None) != (c.runner is None) for c in cases)


def _strings(node: object) -> set[str]:
    if isinstance(node, dict):
        return {str(k) for k in node} | {s for v in node.values() for s in _strings(v)}
    if isinstance(node, list):
        return {s for v in node for s in _strings(v)}
    return {node} if isinstance(node, str) else set()


def test_every_hook_and_content_is_used_and_documented():
    named: set[str] = set()
    for path in CASES_DIR.glob("*.yaml"):
        named |= _strings(yaml.safe_load(path.read_text()))
    readme = (CASES_DIR / "README.md").read_text()
    assert sorted(set(HOOKS) - named) == []
    assert sorted(set(CONTENTS) - named - {"reward_module"}) == []  # reward_modules' own
    assert sorted(h for h in HOOKS if f"`{h}`" not in readme) == []


def test_placeholders_expand_when_the_case_runs():
    cases = {c.cid: c for c in load_cases()}
    c = _ctx()
    status = cases["names/status-upper"].argv
    assert status is not None and status(c) == ["status", "MyRun", "--runs-dir", "/T/case/runs"]
    train = cases["hyperparams/set-bad-int"].argv  # --steps left out, the field set
    assert train is not None
    argv = train(c)
    assert argv[:4] == ["train", "grpo", "--runs-dir", "/T/case/runs"]
    assert "--steps" not in argv and argv[-2:] == ["--set", "training.steps=abc"]
    gs = cases["messages/gs-closed-endpoint-status"]
    assert callable(gs.env)
    assert gs.env(c)["STORAGE_EMULATOR_HOST"] == c.state["url"]  # one port for the case


def _load(tmp_path: Path, body: str, family: str = "fam") -> None:
    path = tmp_path / f"{family}.yaml"
    path.write_text(f"family: {family}\ncases:\n{body}")
    load_family(path)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("  - {id: a, argv: [status], expct: [0]}\n", "unknown key(s) expct"),
        ("  - {id: a, argv: [status], setup: copy_stor}\n", "no hook named 'copy_stor'"),
        ("  - {id: a, argv: [status], check: copy_store}\n", "a setup hook, not a check"),
        ("  - {id: a, argv: [status], check: {json_error: {cod: 2}}}\n", "json_error:"),
        ("  - {id: a, argv: [status], post: {store_unchanged: {x: 1}}}\n", "takes no argument"),
        ("  - {id: a, argv: ['{tmpp}/x']}\n", "unknown placeholder {tmpp}"),
        ("  - {id: a, argv: ['x{P}']}\n", "{P} must be a whole argv item"),
        ("  - {id: a, argv: [status, 0]}\n", "0 is not a string (quote it)"),
        ("  - {id: a, argv: [status], env: {X: '{nope}'}}\n", "unknown placeholder {nope}"),
        ("  - {id: a, argv: [status]}\n  - {id: a, argv: [logs]}\n", "a second case"),
        ("  - id: a\n    argv: [status]\n    argv: [logs]\n", "key 'argv' twice"),
        ("  - {id: a, argv: [status], runner: extend_twice}\n", "one of argv"),
        ("  - {id: a}\n", "one of argv"),
        ("  - {id: a, argv: [status], train_args: {name: x}}\n", "no {train}"),
        ("  - {id: a, argv: ['{train}'], train_args: {steps: 3}}\n", "quote it"),
        ("  - {id: a, argv: ['{train}'], train_args: {nme: x}}\n", "unknown key(s) nme"),
        ("  - {id: a, argv: [s], setup: {write: {path: x, content: no}}}\n", "no content named"),
        ("  - {id: a, argv: [s], setup: {damaged_store: {damage: x}}}\n", "no damage named"),
        ("  - {id: a, runner: {signal_case: {sig: SIGHUP, when: early}}}\n", "no signal 'SIGHUP'"),
        ("  - {id: a, argv: [s], forbid: ['(']}\n", "forbid: '('"),
        ("  - {id: a, argv: [s], expect: [zero]}\n", "exit codes"),
        ("  - {id: a, argv: [s], needs: [gpu]}\n", "'gpu' is not a fixture"),
        ("  - {id: a, argv: [s], train: yes please}\n", "not true or false"),
    ],
)
def test_a_mistake_is_refused_naming_the_file_and_the_case(tmp_path, body, says):
    with pytest.raises(CaseDataError) as e:
        _load(tmp_path, body)
    where = "fam.yaml:" if "twice" in says else "fam.yaml: case a:"  # YAML's own: a line
    assert where in str(e.value) and says in str(e.value)


def test_a_file_must_be_its_family_and_listed(tmp_path):
    (tmp_path / "fam.yaml").write_text("family: other\ncases: []\n")
    with pytest.raises(CaseDataError, match="not its file's 'fam'"):
        load_family(tmp_path / "fam.yaml")
    (tmp_path / "fam.yaml").write_text("family: fam\ncases: []\n")
    (tmp_path / "stray.yaml").write_text("family: stray\ncases: []\n")
    with pytest.raises(CaseDataError, match="stray.yaml: not a family"):
        load_cases(tmp_path, ("fam",))
    with pytest.raises(CaseDataError, match="gone.yaml"):
        load_cases(tmp_path, ("fam", "stray", "gone"))


def test_defaults_and_groups_apply_and_a_case_overrides_them(tmp_path):
    path = tmp_path / "fam.yaml"
    path.write_text(
        "family: fam\n"
        "defaults: {argv: [status], needs: [store], timeout: 30}\n"
        "cases:\n"
        "  - {id: a}\n"
        "  - defaults: {expect: [0], setup: copy_store}\n"
        "    cases:\n"
        "      - {id: b, needs: []}\n"
        "      - {id: c, setup: null}\n"
    )
    a, b, c = load_family(path)
    assert (a.cid, a.needs, a.timeout, a.expect, a.setup) == ("fam/a", ("store",), 30.0, (2,), None)
    assert (b.needs, b.expect, b.setup is not None) == ((), (0,), True)
    assert (c.needs, c.setup) == (("store",), None)
