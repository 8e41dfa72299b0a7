"""``--print-config``: the resolved spec's YAML, each value a user set marked with where
it came from (a flag, ``--set``, ``RLCTL_SET``, the config file). Pure text work."""

from __future__ import annotations

import re

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


def annotated_yaml(text: str, sources: dict[str, str]) -> str:
    """``text`` (``dump_yaml`` of a spec: block style, two-space indents) with
    ``  # from SOURCE`` after each key line whose dotted path, or a path below it
    (a list or mapping value), has a source; the rest are defaults, unmarked."""
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing sections
    out = []
    for line in text.splitlines():
        m = _KEY.match(line)
        if not m:
            out.append(line)
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(k for _, k in stack), m["key"]])
        leaf = m["rest"].strip() != ""
        found = sources.get(path)  # a section is marked only as a whole (--reward)
        if found is None and leaf:
            below = {s for p, s in sources.items() if p.startswith(path + ".")}
            found = below.pop() if len(below) == 1 else None
        out.append(f"{line}  # from {found}" if found else line)
        if not leaf:
            stack.append((indent, m["key"]))
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")
