"""Placeholders: how a case's data names what exists only when it runs (its folder,
the fake GCS server's URL, the standard training command).

``{word}`` in an argv item, an env value, a ``train_args`` value or a hook's ``argv``
is replaced by ``VALUES[word]``; ``{P}`` and ``{train}`` stand for several argv items
and must be whole items. bench/fuzz_cases/README.md lists them with what they become.
Any other ``{word}`` is an error when the data is loaded; braces around anything but a
bare word (``rewards=[{"fn": ...}]``) are kept as they are.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from bench.fuzz.fixtures import Ctx, P
from bench.fuzz.proc import REPO

PATTERN = re.compile(r"\{(\w+)\}")
TRAIN_ARGS = ("name", "steps", "algo", "runs", "rewards", "override")


def closed_port() -> int:
    """A local port that was free a moment ago: nothing listens on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


VALUES: dict[str, Callable[[Ctx], str]] = {
    "tmp": lambda c: str(c.tmp),  # the case's folder, its working directory
    "runs": lambda c: str(c.runs),  # {tmp}/runs
    "repo": lambda c: str(REPO),  # the checkout (tests.fakes imports from there)
    "gcs_url": lambda c: c.fx.gcs_url,  # fixture gcs's fake-gcs-server
    # a port nothing listens on, the same for the whole case
    "closed_url": lambda c: c.state.setdefault("url", f"http://127.0.0.1:{closed_port()}"),
}
SPLICES = ("P", "train")  # the project flags; the standard training command


def problems(text: str, *, splice: bool = False) -> list[str]:
    """What is wrong with the placeholders of ``text`` (an argv item when ``splice``)."""
    bad = []
    for name in PATTERN.findall(text):
        if name in SPLICES:
            if not splice or text != "{" + name + "}":
                bad.append(f"{{{name}}} must be a whole argv item, in {text!r}")
        elif name not in VALUES:
            bad.append(f"unknown placeholder {{{name}}} in {text!r}")
    return bad


def expand(text: str, c: Ctx) -> str:
    return PATTERN.sub(lambda m: VALUES[m.group(1)](c), text)


def train_argv(c: Ctx, args: Mapping[str, Any]) -> list[str]:
    """``{train}``: the standard training argv, changed by ``args`` (``train_args``)."""
    kw: dict[str, Any] = {}
    for key, value in args.items():
        if key == "override":
            kw[key] = {f: None if v is None else expand(v, c) for f, v in value.items()}
        else:
            kw[key] = None if value is None else expand(value, c)
    return c.train(**kw)


def expand_argv(template: Iterable[str], c: Ctx, train_args: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for item in template:
        if item == "{P}":
            out += P
        elif item == "{train}":
            out += train_argv(c, train_args)
        else:
            out.append(expand(item, c))
    return out
