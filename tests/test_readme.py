"""The README's set-up commands are the ones CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    return [line for b in blocks[:2] for line in b.splitlines() if line and line[0] != "#"]


def test_ci_runs_the_readme_test_command():
    main_job, tests = readme_commands()[:2]
    assert tests in (ROOT / ".ci" / "run").read_text()
    assert main_job.endswith("rlctl train grpo")
    assert "pytest" in tests
