"""Read the cases from bench/fuzz_cases/FAMILY.yaml and check them as they are read.

The data's form is bench/fuzz_cases/README.md's; the placeholders are templates.py's
and the hooks registry.py's. Everything a typo could get wrong is an error here,
naming the file and the case, before any case runs: an unknown key, hook, content or
placeholder, a hook argument its function does not take, a value of the wrong type
(YAML reads ``no`` as false and ``0`` as a number: quote them), a regex that does not
compile, an id twice, a key twice in one mapping.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

import bench.fuzz.hooks  # noqa: F401  (registers every hook)
from bench.fuzz.case import Case
from bench.fuzz.fixtures import Ctx
from bench.fuzz.proc import CMD_TIMEOUT, REPO
from bench.fuzz.registry import HOOKS
from bench.fuzz.templates import TRAIN_ARGS, expand, expand_argv, problems

CASES_DIR = REPO / "bench" / "fuzz_cases"
# the families, in the order they run (--list, a full run); one FAMILY.yaml each
FAMILIES = (
    "names",
    "hyperparams",
    "config-files",
    "data",
    "model",
    "rewards",
    "runs-dir",
    "store-damage",
    "cloud-no-creds",
    "concurrency",
    "signals",
    "status-width",
    "non-finite",
    "spec-roundtrip",
    "first-save",
    "store-truth",
    "messages",
    "reward-guest",
)
FILE_KEYS = {"family", "defaults", "cases"}
GROUP_KEYS = {"defaults", "cases"}
HOOK_SLOTS = ("setup", "check", "post", "skip", "runner")
CASE_KEYS = {
    "id",
    "argv",
    "train_args",
    "expect",
    "keywords",
    "ok_keywords",
    "forbid",
    "env",
    "timeout",
    "needs",
    "train",
    "one_line",
    "allow_traceback",
    "desc",
    *HOOK_SLOTS,
}
NEEDS = ("model", "store", "gcs")
ARGV_ARGS = ("argv", "argvs")  # hook arguments that are argv templates


class CaseDataError(ValueError):
    """A data file that cannot be run as it is."""


class _Loader(yaml.SafeLoader):
    """yaml.safe_load, but a key twice in one mapping is an error (not the last wins)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_cases(folder: Path = CASES_DIR, families: Iterable[str] = FAMILIES) -> list[Case]:
    """Every family's cases, in order."""
    families = tuple(families)
    strays = sorted(p.name for p in folder.glob("*.yaml") if p.stem not in families)
    if strays:
        raise CaseDataError(
            f"{_where(folder)}: {', '.join(strays)}: not a family (bench/fuzz/loader.py FAMILIES)"
        )
    return [case for family in families for case in load_family(folder / f"{family}.yaml")]


def load_family(path: Path) -> list[Case]:
    where = _where(path)
    try:
        doc = yaml.load(path.read_text(), Loader=_Loader)
    except (OSError, yaml.YAMLError) as e:
        raise CaseDataError(f"{where}: {e}") from None
    if not isinstance(doc, dict):
        raise CaseDataError(f"{where}: not a mapping with 'family' and 'cases'")
    _no_strays(doc, FILE_KEYS, f"{where}:")
    if doc.get("family") != path.stem:
        raise CaseDataError(f"{where}: family {doc.get('family')!r}, not its file's {path.stem!r}")
    defaults = _defaults(doc.get("defaults"), f"{where}: defaults:")
    cases: list[Case] = []
    seen: set[str] = set()
    for n, entry in enumerate(_list(doc.get("cases"), f"{where}: cases"), 1):
        if isinstance(entry, dict) and "cases" in entry:  # a group: defaults for its cases
            _no_strays(entry, GROUP_KEYS, f"{where}: group #{n}:")
            inner = {**defaults, **_defaults(entry.get("defaults"), f"{where}: group #{n}:")}
            for m, sub in enumerate(_list(entry["cases"], f"{where}: group #{n}: cases"), 1):
                cases.append(_case(path.stem, sub, inner, where, f"#{n}.{m}", seen))
        else:
            cases.append(_case(path.stem, entry, defaults, where, f"#{n}", seen))
    return cases


# ----------------------------------------------------------------- one case


def _case(
    family: str, raw: Any, defaults: dict[str, Any], where: str, pos: str, seen: set[str]
) -> Case:
    if not isinstance(raw, dict):
        raise CaseDataError(f"{where}: case {pos}: not a mapping")
    cid = raw.get("id")
    label = f"{where}: case {cid if isinstance(cid, str) and cid else pos}:"
    if not isinstance(cid, str) or not cid.strip():
        raise CaseDataError(f"{label} no id (a non-empty string)")
    if cid in seen:
        raise CaseDataError(f"{label} a second case with this id")
    seen.add(cid)
    d = {**defaults, **raw}
    _no_strays(d, CASE_KEYS, label)
    try:
        return _build(f"{family}/{cid}", d)
    except CaseDataError as e:
        raise CaseDataError(f"{label} {e}") from None


def _build(cid: str, d: dict[str, Any]) -> Case:
    if (d.get("argv") is None) == (d.get("runner") is None):
        raise CaseDataError("needs one of argv (a command) and runner (a custom case)")
    train_args = _train_args(d.get("train_args"))
    argv = _argv(d["argv"], "argv") if d.get("argv") is not None else None
    hooks: dict[str, Any] = {}
    names: dict[str, str] = {}
    for slot in HOOK_SLOTS:
        if d.get(slot) is not None:
            hooks[slot], names[slot] = _hook(d[slot], slot, train_args)
    if train_args and not _mentions_train(d):
        raise CaseDataError("train_args, but no {train} in argv or a hook's argv")
    env = _env(d.get("env"))
    return Case(
        cid,
        argv=(lambda c: expand_argv(argv, c, train_args)) if argv is not None else None,
        expect=tuple(_ints(d.get("expect", [2]), "expect")),
        keywords=_keywords(d.get("keywords", []), "keywords"),
        ok_keywords=_keywords(d.get("ok_keywords", []), "ok_keywords"),
        forbid=_regexes(d.get("forbid", [])),
        env=(lambda c: {k: None if v is None else expand(v, c) for k, v in env.items()})
        if env
        else None,
        setup=hooks.get("setup"),
        post=hooks.get("post"),
        check=hooks.get("check"),
        runner=hooks.get("runner"),
        timeout=_timeout(d.get("timeout")),
        needs=_needs(d.get("needs", [])),
        skip=hooks.get("skip"),
        allow_traceback=_bool(d, "allow_traceback", False),
        one_line=_bool(d, "one_line", True),
        train=_bool(d, "train", False),
        desc=_str(d.get("desc", ""), "desc"),
        runner_name=names.get("runner", ""),
    )


def _argv(value: Any, what: str) -> list[str]:
    items = _list(value, what)
    for item in items:
        if not isinstance(item, str):
            raise CaseDataError(f"{what}: {item!r} is not a string (quote it)")
        if bad := problems(item, splice=True):
            raise CaseDataError(f"{what}: {bad[0]}")
    return items


def _train_args(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    args = _mapping(value, "train_args")
    _no_strays(args, set(TRAIN_ARGS), "train_args:")
    for key, v in args.items():
        if key == "override":
            for flag, x in _mapping(v, "train_args.override").items():
                _template(x, f"train_args.override.{flag}", nullable=True)
        else:
            _template(v, f"train_args.{key}", nullable=key == "rewards")
    return args


def _env(value: Any) -> dict[str, str | None]:
    env = _mapping(value or {}, "env")
    for k, v in env.items():
        if not isinstance(k, str):
            raise CaseDataError(f"env: the name {k!r} is not a string")
        _template(v, f"env.{k}", nullable=True)
    return env


def _template(value: Any, what: str, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if not isinstance(value, str):
        raise CaseDataError(f"{what}: {value!r} is not a string (quote it)")
    if bad := problems(value):
        raise CaseDataError(f"{what}: {bad[0]}")


def _mentions_train(d: dict[str, Any]) -> bool:
    found = []

    def walk(x: Any) -> None:
        if isinstance(x, str):
            found.append(x == "{train}")
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk([d.get("argv", []), *(d.get(s) for s in HOOK_SLOTS)])
    return any(found)


# --------------------------------------------------------------------- hooks


def _hook(ref: Any, slot: str, train_args: Mapping[str, Any]) -> tuple[Callable[..., Any], str]:
    """The function a hook reference names: ``name``, ``{name: {arg: value}}`` or (a
    setup) a list of them, run in order."""
    if slot == "setup" and isinstance(ref, list):
        if not ref:
            raise CaseDataError("setup: an empty list")
        parts = [_hook(r, slot, train_args) for r in ref]
        steps = [fn for fn, _ in parts]

        def setup(c: Ctx) -> None:
            for step in steps:
                step(c)

        return setup, "+".join(name for _, name in parts)
    if isinstance(ref, str):
        name, args = ref, None
    elif isinstance(ref, dict) and len(ref) == 1:
        name, args = next(iter(ref.items()))
    else:
        raise CaseDataError(f"{slot}: {ref!r}: a hook is NAME or {{NAME: {{ARG: VALUE}}}}")
    h = HOOKS.get(name) if isinstance(name, str) else None
    if h is None:
        near = difflib.get_close_matches(str(name), [k for k, v in HOOKS.items() if v.slot == slot])
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise CaseDataError(f"{slot}: no hook named {name!r}{hint}")
    if h.slot != slot:
        raise CaseDataError(f"{slot}: {name!r} is a {h.slot} hook, not a {slot}")
    if not h.factory:
        if args:
            raise CaseDataError(f"{slot}: {name!r} takes no arguments")
        return h.fn, name
    kwargs = dict(_mapping(args or {}, f"{slot}: {name}"))
    for key in ARGV_ARGS:
        if key in kwargs:
            kwargs[key] = _bound_argvs(kwargs[key], key, f"{slot}: {name}: {key}", train_args)
    try:
        inspect.signature(h.fn).bind(**kwargs)
    except TypeError as e:
        raise CaseDataError(f"{slot}: {name}: {e}") from None
    try:
        return h.fn(**kwargs), name
    except (TypeError, ValueError, KeyError) as e:
        raise CaseDataError(f"{slot}: {name}: {e}") from None


def _bound_argvs(value: Any, key: str, what: str, train_args: Mapping[str, Any]) -> Any:
    """An ``argv`` argument as a function of the Ctx (``argvs``: a list of them)."""

    def bind(template: Any, label: str) -> Callable[[Ctx], list[str]]:
        items = _argv(template, label)
        return lambda c: expand_argv(items, c, train_args)

    if key == "argv":
        return bind(value, what)
    return [bind(t, f"{what}[{i}]") for i, t in enumerate(_list(value, what))]


# --------------------------------------------------------------------- values


def _where(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def _no_strays(d: dict[str, Any], known: set[str], label: str) -> None:
    strays = sorted(str(k) for k in d if k not in known)
    if strays:
        raise CaseDataError(f"{label} unknown key(s) {', '.join(strays)}")


def _defaults(value: Any, label: str) -> dict[str, Any]:
    d = _mapping(value or {}, label)
    if "id" in d:
        raise CaseDataError(f"{label} defaults cannot give an id")
    _no_strays(d, CASE_KEYS, label)
    return d


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise CaseDataError(f"{what}: {value!r} is not a list")
    return value


def _mapping(value: Any, what: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise CaseDataError(f"{what}: {value!r} is not a mapping")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise CaseDataError(f"{what}: {value!r} is not a string")
    return value


def _bool(d: dict[str, Any], key: str, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise CaseDataError(f"{key}: {value!r} is not true or false")
    return value


def _ints(value: Any, what: str) -> list[int]:
    items = _list(value, what)
    if not items or any(isinstance(x, bool) or not isinstance(x, int) for x in items):
        raise CaseDataError(f"{what}: {value!r} is not a list of exit codes")
    return items


def _keywords(value: Any, what: str) -> tuple:
    """Each a string, or a list of strings of which one will do."""
    out: list[str | tuple[str, ...]] = []
    for kw in _list(value, what):
        if isinstance(kw, str):
            out.append(kw)
        elif isinstance(kw, list) and kw and all(isinstance(x, str) for x in kw):
            out.append(tuple(kw))
        else:
            raise CaseDataError(f"{what}: {kw!r} is neither a string nor a list of strings")
    return tuple(out)


def _regexes(value: Any) -> tuple[str, ...]:
    for pat in _list(value, "forbid"):
        _str(pat, "forbid")
        try:
            re.compile(pat)
        except re.error as e:
            raise CaseDataError(f"forbid: {pat!r}: {e}") from None
    return tuple(value)


def _timeout(value: Any) -> float:
    if value is None:
        return CMD_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise CaseDataError(f"timeout: {value!r} is not a number of seconds")
    return float(value)


def _needs(value: Any) -> tuple[str, ...]:
    items = _list(value, "needs")
    for x in items:
        if x not in NEEDS:
            raise CaseDataError(f"needs: {x!r} is not a fixture ({', '.join(NEEDS)})")
    return tuple(items)
