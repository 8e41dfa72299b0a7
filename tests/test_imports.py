"""``rlctl --help`` must stay instant: no heavy import on the CLI path (fresh interpreter)."""

import subprocess
import sys

HEAVY = (
    "jax",
    "tunix",
    "flax",
    "orbax",
    "google.cloud",
    "google.auth",
    "kubernetes",
    "tensorboardX",
    "tensorboard",
    "optax",
    "matplotlib",
)


def test_cli_import_is_light():
    code = (
        "import sys, rlctl.cli.app\n"
        # (a None entry is an import blocked, by the fast loop's guard: not imported)
        f"heavy = [m for m, v in sys.modules.items() if v is not None and "
        f"(m.split('.')[0] in {HEAVY!r} or m.startswith({HEAVY!r}))]\n"
        "print(heavy); assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_runs_offline():
    out = subprocess.run([sys.executable, "-m", "rlctl", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "train" in out.stdout
