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
    for name in ("jax", "jaxlib", "orbax-checkpoint", "flax", "google-tunix", "typer",
                 "pydantic", "kubernetes", "kubernetes-validate", "jsonschema",
                 "google-cloud-storage", "tokenizers"):
        assert name in pins, f"{name} is not pinned in constraints.txt"
