"""No module outside ``rlctl/core/families/`` tells a model family by its name.

A family used to be keyed three ways across 9+ files (``info.family == "llama"``, the
Tunix package, attributes of Tunix's config), and a family missing from one of them
silently lost the fast decode and the recomputation paths. Now the registry resolves
a family once and the rest of rlctl asks its record (``capabilities``, ``layout``).
This test reads every module of ``rlctl/`` and fails on a string literal that is a
family's name (its ``model_type``, a refused alias, its Tunix package or its GGUF
architecture): comparing one, keying a dict by one or passing one to the registry.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rlctl
from rlctl.core import families

ROOT = Path(rlctl.__file__).parent
OWN = ROOT / "core" / "families"


def names() -> set[str]:
    """Every name a family is known by outside its record."""
    out: set[str] = set()
    for fam in families.FAMILIES.values():
        out |= {fam.model_type, fam.tunix_package, *fam.refused_aliases}
        if fam.gguf_architecture:
            out.add(fam.gguf_architecture)
    return out


def named(source: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, literal) of each string literal in ``source`` that is a family's name
    (exactly, or ignoring case: ``"Llama"`` is the same lookup)."""
    lowered = {n.lower() for n in known}
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.strip().lower() in lowered
    ]


def test_the_names_are_the_registered_families():
    assert {"llama", "llama3", "mistral", "qwen2", "qwen3", "gemma3", "gemma3_text"} <= names()


@pytest.mark.parametrize(
    "source",
    [
        'if info.family == "llama":\n    pass\n',
        'x = fam.tunix_package != "llama3"\n',
        'TABLE = {"qwen2": 1}\n',
        'f = families.family("Mistral")\n',
    ],
)
def test_the_check_finds_a_name(source):
    assert named(source, names())


def test_no_module_outside_the_registry_compares_a_family_name():
    known = names()
    found = [
        f"{path.relative_to(ROOT.parent)}:{line}: {value!r}"
        for path in sorted(ROOT.rglob("*.py"))
        if OWN not in path.parents
        for line, value in named(path.read_text(), known)
    ]
    assert not found, "a family told apart by its name (ask its record instead):\n" + "\n".join(
        found
    )
