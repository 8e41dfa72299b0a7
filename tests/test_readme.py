"""The README's set-up commands are the ones CI runs, on the recorded versions."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    return [line for b in blocks[:2] for line in b.splitlines() if line and line[0] != "#"]


def test_ci_runs_the_readme_test_command():
    main_job, tests = readme_commands()[:2]
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci
    assert main_job.endswith("rlctl train grpo")
    assert "pytest" in tests
    assert "bash .ci/user-path" in ci  # the user's path, after the tests


def test_installs_use_the_recorded_versions():
    main_job, tests = readme_commands()[:2]
    for cmd in (main_job, tests):
        installs = [part for part in cmd.split("&&") if "pip install" in part]
        assert installs and all("-c constraints.txt" in p for p in installs), cmd


def test_constraints_pin_the_trainer_stack():
    pins = dict(
        line.split("==", 1)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for name in (
        "jax",
        "jaxlib",
        "orbax-checkpoint",
        "flax",
        "google-tunix",
        "typer",
        "pydantic",
        "kubernetes",
        "kubernetes-validate",
        "jsonschema",
        "google-cloud-storage",
        "tokenizers",
    ):
        assert name in pins, f"{name} is not pinned in constraints.txt"


def test_the_exit_code_table_names_every_error_class_with_its_code():
    """README's exit-code table (which rlctl/core/errors.py and the CLI point at)
    lists each error class under the code it exits with, and no code nobody uses."""
    import inspect
    import re

    from rlctl.core import errors

    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\d+) \| [^|]+ \|\s*([^|]*?)\s*\|$", text, re.MULTILINE)
    assert rows, "no exit-code table in README.md"
    documented = {name: int(code) for code, names in rows for name in re.findall(r"`(\w+)`", names)}
    classes = {
        name: cls
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.RlctlError)
    }
    assert set(documented) == set(classes)
    for name, cls in classes.items():
        assert documented[name] == cls.exit_code, name
    codes = {int(code) for code, _ in rows}
    assert codes == {0, *(cls.exit_code for cls in classes.values())}


def test_the_cluster_half_begins_with_the_cloud_extras_it_needs():
    """#53: the README gave '.[train]' first and '.[all]' only inside a paragraph on
    recorded versions; a user following it met ModuleNotFoundError in the cluster half.
    Its section now begins with the install line (the one a cloud command's exit 8 names),
    before any command of the cluster half."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### A first cluster run", 1)[1]
    install = ".venv/bin/pip install -c constraints.txt -e '.[all]'"
    first_block = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)[0]
    assert first_block.strip() == install
    before = text.split(install, 1)[0]
    assert not re.search(r"^rlctl (cluster|image|network)|--cluster", before, re.MULTILINE)
    assert "bash .ci/user-path" in (ROOT / ".ci" / "run").read_text()
    assert "cloud_install=" in (ROOT / ".ci" / "user-path").read_text()  # walks it in order
