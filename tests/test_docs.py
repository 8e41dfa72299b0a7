"""The documentation a newcomer reads: a short README that leads into docs/, whose pages'
links all resolve, and a CLI reference generated from the CLI itself (issue #46)."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_cli_reference", ROOT / "tools" / "gen_cli_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_read_in_ten_minutes():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move a section into docs/"


def _relative_links(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # not in code blocks
    text = re.sub(r"`[^`\n]*`", "", text)
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor on the page itself (mkdocs --strict checks those)
        yield target.split("#", 1)[0]


def test_every_relative_link_points_at_a_file():
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages
        for target in _relative_links(page)
        if not (page.parent / target).resolve().is_file()
    ]
    assert not broken, broken
    # and the README leads into every page
    readme = set(_relative_links(ROOT / "README.md"))
    missing = {str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md")} - readme - {"docs/index.md"}
    assert not missing, f"README.md links to none of {sorted(missing)}"


def test_the_site_nav_lists_every_page():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert "strict: true" in nav
    # a top-level entry (``  - Title: page.md``) or a section's (``      - page.md``)
    listed = set(re.findall(r"^ +- (?:[^:\n]+: )?(\S+\.md)$", nav, re.MULTILINE))
    assert listed == {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}


def test_the_site_home_has_the_readme_set_up_commands():
    blocks = re.findall(r"```bash\n.*?```", (ROOT / "README.md").read_text(), re.DOTALL)[:2]
    home = (DOCS / "index.md").read_text()
    assert all(block in home for block in blocks)


def test_the_cli_reference_is_current():
    """Regenerated from rlctl.cli.app, it equals the committed page: a new command, option
    or help text without `python tools/gen_cli_reference.py` fails here."""
    text = _generator().render()
    assert text == (DOCS / "reference" / "cli.md").read_text(), (
        "docs/reference/cli.md is out of date: run python tools/gen_cli_reference.py"
    )
    for command in (
        "rlctl train grpo",
        "rlctl resume",
        "rlctl cluster create",
        "rlctl checkpoint-convert",
        "rlctl delete run",
    ):
        assert f"## `{command}`" in text
    assert "| 130 |" in text  # the README's exit-code table, copied


def test_ci_builds_the_site_strictly():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "mkdocs build --strict" in ci
    assert ci.index("bash .ci/user-path") < ci.index("mkdocs build --strict")


def test_the_docs_extra_is_pinned_and_kept_apart():
    """`pip install -c constraints.txt '.[docs]'` gets the versions CI builds with; the docs
    tools stay out of `all` and `test`, which users and the suite install."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0] for r in extras["docs"]}
    assert names == {"mkdocs", "mkdocs-material"}
    assert "docs" not in " ".join(extras["all"] + extras["test"])
    pins = {
        line.split("==")[0].lower()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line
    }
    assert names <= pins


def test_one_way_to_build_the_docs_and_a_page_on_loading_an_export():
    """#53: the README built the site from '.[docs]', development.md (and CI) in a venv of
    its own; and no page said how to install torch and peft to load an export (nor that
    PyPI's Linux torch is the CUDA build)."""
    install = ".venvs/docs/bin/pip install -c constraints.txt mkdocs mkdocs-material"
    for text in (
        (ROOT / "README.md").read_text(),
        (DOCS / "development.md").read_text(),
        (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install "),
    ):
        assert install in text
    assert "'.[docs]'" not in (ROOT / "README.md").read_text()
    page = (DOCS / "checkpoints.md").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu" in page
    assert "transformers peft" in page and "CUDA build" in page
