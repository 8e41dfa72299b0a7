"""The docs' families table is the records' (``tools/gen_families_table.py``): a family
added, a capability changed or a refusal worded anew shows on the page, or this fails
and says how to regenerate it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlctl.core import families

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "checkpoints.md"
_spec = importlib.util.spec_from_file_location(
    "gen_families_table", ROOT / "tools" / "gen_families_table.py"
)
assert _spec is not None and _spec.loader is not None
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)


def test_the_page_holds_the_records_table():
    text = PAGE.read_text()
    assert table.rewrite(text) == text, (
        "docs/checkpoints.md's families table is stale: "
        "python tools/gen_families_table.py docs/checkpoints.md"
    )


def test_every_family_has_a_row_with_what_it_refuses():
    rows = [ln for ln in table.table().splitlines() if ln.startswith("| `")][1:]  # no header
    assert [r.split("`")[1] for r in rows] == list(families.FAMILIES)
    for fam, row in zip(families.FAMILIES.values(), rows):
        assert fam.refuses, f"{fam.model_type} says nothing of what it refuses"
        assert all(text in row for text in fam.refuses)


def test_a_page_without_the_markers_is_one_clear_error():
    with pytest.raises(ValueError, match="markers"):
        table.rewrite("# no table here\n")


def test_the_script_rewrites_a_stale_table(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"before\n{table.START}\nold rows\n{table.END}\nafter\n")
    table.main([str(page)])
    assert page.read_text() == f"before\n{table.table()}\nafter\n"
