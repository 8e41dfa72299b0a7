"""The cluster half tried on a fresh machine: no Google account, no gcloud, no network.

``--dry-run`` without credentials plans against an empty project (as ``terraform plan``
with no state, or ``helm template``) and says so first: ``cluster create`` shows the
whole plan, ``train --cluster`` the manifests and where each pod would go on the cluster
``cluster create -a ...`` makes, ``image build`` the build it would run. Each runs as a
user runs it, ``rlctl`` in a subprocess, with an empty HOME and every socket refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.core.k8s import backends

REPO = Path(__file__).resolve().parents[2]
ASSUMED = "no Google Cloud credentials: this plan assumes an empty project my-project in us-east5"
# every socket refused in the subprocess: a dry run reaches nothing, not even the
# metadata server
NO_NETWORK = """
import socket
def _refuse(self, address):
    raise OSError(f"no network in this test: {address!r}")
socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
"""


def _rlctl(
    args: list[str], home: Path, hide: tuple[str, ...] = (), **extra: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``hide``: modules this Python cannot import, as with only ``.[train]`` installed."""
    site = home / "site"
    site.mkdir(exist_ok=True)
    hidden = "".join(f"sys.modules[{m!r}] = None\n" for m in hide)
    (site / "sitecustomize.py").write_text(f"{NO_NETWORK}\nimport sys\n{hidden}")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RLCTL_", "GOOGLE_", "CLOUDSDK_", "GCE_"))
    }
    env.update(HOME=str(home), PYTHONPATH=f"{site}{os.pathsep}{REPO}", **extra)
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "rlctl", *args],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r, time.monotonic() - t0


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_cluster_create_plans_an_empty_project_and_says_so_first(home):
    r, took = _rlctl(["cluster", "create", "demo", "-a", "v6e-16 x2", "--dry-run"], home)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0].startswith(ASSUMED)
    for line in (
        "Plan: create demo (my-project, us-east5)",
        "nodepool v6e-16-0",
        "nodepool v6e-16-1",
        "controller jobset",
        "9 to create",
    ):
        assert line in r.stdout, line
    assert "Estimated node cost (on-demand): $" in r.stdout
    assert "Traceback" not in r.stderr and took < 20


def test_its_json_is_the_plan_with_the_assumption_as_its_first_note(home):
    r, _ = _rlctl(["cluster", "create", "demo", "-a", "v6e-16 x2", "--dry-run", "-o", "json"], home)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["notes"][0].startswith(ASSUMED)
    assert {c["name"] for c in plan["changes"] if c["kind"] == "nodepool"} == {
        "v6e-16-0",
        "v6e-16-1",
        "pathways",
    }


@pytest.mark.parametrize("backend", ["jobset", "lws", "pathways", "ray"])
def test_train_renders_and_places_on_the_cluster_create_would_make(home, backend):
    r, took = _rlctl(
        [
            "train",
            "grpo",
            "--cluster",
            "demo",
            "-a",
            "v6e-16 x2",
            "--backend",
            backend,
            "--dry-run",
            "-o",
            "json",
        ],
        home,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0].startswith(ASSUMED)
    assert "rlctl cluster create demo -a 'v6e-16 x2' --bucket my-project-demo-runs" in r.stderr
    kinds = [m["kind"] for m in json.loads(r.stdout)]
    assert kinds[-1] == backends.get(backend).kind
    assert "-> v6e-16-0, v6e-16-1" in r.stderr  # the fit check, against the planned pools
    assert "run store gs://my-project-demo-runs/runs" in r.stderr
    assert took < 20


def test_image_build_shows_the_build(home):
    r, _ = _rlctl(["image", "build", "--cluster", "demo", "-a", "tpu", "--dry-run"], home)
    assert r.returncode == 0, r.stderr
    assert "create    image us-east5-docker.pkg.dev/my-project/rlctl/rlctl-tpu:" in r.stdout


def test_what_it_cannot_assume_is_one_line(home):
    r, _ = _rlctl(["train", "grpo", "--cluster", "demo", "--dry-run"], home)
    assert r.returncode == 2
    err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert err == [
        "error: without Google Cloud credentials rlctl cannot read the node pools of cluster demo"
    ]
    assert "-a 'v6e-16 x2'" in r.stderr and "Traceback" not in r.stderr


def test_with_credentials_or_without_dry_run_nothing_is_assumed(home):
    """A plan against the real project needs credentials: a broken credentials file is
    reported as such, and without --dry-run nothing is ever planned on assumptions."""
    r, _ = _rlctl(
        [
            "cluster",
            "create",
            "demo",
            "-a",
            "v6e-16 x2",
            "--dry-run",
            "--project",
            "p",
            "--region",
            "us-east5",
        ],
        home,
        GOOGLE_APPLICATION_CREDENTIALS=str(home / "missing.json"),
    )
    assert r.returncode == 5 and "GOOGLE_APPLICATION_CREDENTIALS" in r.stderr
    assert ASSUMED not in r.stderr
    r, _ = _rlctl(
        [
            "cluster",
            "create",
            "demo",
            "-a",
            "v6e-16 x2",
            "--project",
            "p",
            "--region",
            "us-east5",
            "--yes",
        ],
        home,
    )
    assert r.returncode == 5 and "no Google Cloud credentials found" in r.stderr
    assert ASSUMED not in r.stderr


@pytest.mark.parametrize(
    "command", [["cluster", "create"], ["image", "build"], ["network", "create"]]
)
def test_the_help_example_runs_on_a_fresh_machine(home, command):
    """The example a newcomer copies first from --help is one the command accepts."""
    import shlex

    r, _ = _rlctl([*command, "--help"], home)
    lines = r.stdout.splitlines()
    (at,) = [i for i, ln in enumerate(lines) if "Example: rlctl" in ln]
    example = []  # the paragraph, as the help wraps it
    for ln in lines[at:]:
        if not ln.strip():
            break
        example.append(ln.strip())
    args = shlex.split(" ".join(example).split("Example: rlctl", 1)[1])
    assert "--dry-run" in args
    r, _ = _rlctl(args, home)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0].startswith(ASSUMED)


# What '.[train]' alone lacks of the cloud half (pyproject.toml's gcp and k8s extras)
TRAIN_ONLY = ("google.api_core", "google.cloud", "kubernetes", "jsonschema", "kubernetes_validate")


@pytest.mark.parametrize(
    ("args", "hide"),
    [
        (["cluster", "create", "demo", "-a", "v6e-16 x2", "--dry-run"], TRAIN_ONLY),
        (["train", "grpo", "--cluster", "demo", "-a", "v6e-16 x2", "--dry-run"], TRAIN_ONLY),
        (["image", "build", "--cluster", "demo", "--dry-run"], TRAIN_ONLY),
        (["network", "create", "demo", "--count", "2", "--dry-run"], TRAIN_ONLY),
        # one module short, the others there: the check names it before any work
        (["cluster", "create", "demo", "-a", "v6e-16 x2", "--dry-run"], ("google.api_core",)),
        (["train", "grpo", "--cluster", "demo", "-a", "v6e-16 x2", "--dry-run"], ("kubernetes",)),
        (
            ["train", "grpo", "--cluster", "demo", "-a", "v6e-16 x2", "--dry-run"],
            ("google.cloud.container_v1",),
        ),
        (["cluster", "list"], ("google.cloud",)),
        (["image", "list"], ("google.cloud",)),
        (["network", "show", "demo"], ("google.cloud",)),
    ],
)
def test_a_cloud_command_without_the_cloud_extras_is_exit_8_with_the_readmes_line(home, args, hide):
    """#53: after the README's first install ('.[train]'), 'cluster create --dry-run' got
    as far as its API check ('No module named google.api_core', exit 7), 'train --cluster
    --dry-run' ended 'unexpected error: ImportError' (exit 1); the others' hints dropped
    '-c constraints.txt'. One check at the top of each cloud command, before any work."""
    from rlctl.core.install import extra_install_command

    r, _ = _rlctl(args, home, hide=hide)
    assert r.returncode == 8, r.stderr
    assert "Traceback" not in r.stderr and "report it" not in r.stderr
    assert r.stderr.splitlines()[0].startswith("error: this command needs the cloud extras ")
    assert r.stderr.splitlines()[1:] == [f"hint: {extra_install_command('all', constrained=True)}"]
    assert f"-c {REPO}/constraints.txt" in r.stderr and "[all]" in r.stderr


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--region", "mars-1"], "'mars-1' is not a Google Cloud region"),
        (["--project", "BAD PROJECT"], "'BAD PROJECT' is not a Google Cloud project id"),
        (["--project", "my-project-"], "is not a Google Cloud project id"),
        (["--project", "1project"], "is not a Google Cloud project id"),
        (["--project", "short"], "is not a Google Cloud project id"),
        # well-formed, but no region: only a known one is planned without credentials
        (["--region", "us-est5"], "'us-est5' is not a Google Cloud region rlctl knows"),
        (["--zone", "us-central1-a"], "'us-central1-a' is not a zone of region us-east5"),
    ],
)
def test_a_region_or_project_that_cannot_exist_is_refused_offline(home, flags, words):
    """#53: 'cluster create --region mars-1 --dry-run' planned and priced mars-1, and
    --project 'BAD PROJECT' was planned; both are checked against their published forms."""
    for args in (
        ["cluster", "create", "demo", "-a", "v6e-16 x2", *flags, "--dry-run"],
        ["network", "create", "demo", *flags, "--dry-run"],
        ["train", "grpo", "--cluster", "demo", "-a", "v6e-16 x2", *flags, "--dry-run"],
    ):
        if args[0] != "cluster" and "--zone" in flags:
            continue  # only cluster create takes a zone
        r, _ = _rlctl(args, home)
        assert r.returncode == 2, (args, r.stderr)
        errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert len(errors) == 1 and words in errors[0], (args, r.stderr)
        assert "Traceback" not in r.stderr and "Plan:" not in r.stdout
    r, _ = _rlctl(["cluster", "create", "demo", "-a", "v6e-16 x2", "--region", "us-est5",
                   "--dry-run"], home)  # fmt: skip
    assert "did you mean us-east5?" in r.stderr


def test_real_forms_are_planned(home):
    r, _ = _rlctl(
        ["cluster", "create", "demo", "-a", "v6e-16 x2", "--project", "acme-rl-2",
         "--region", "europe-west4", "--zone", "europe-west4-a", "--dry-run"],
        home,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Plan: create demo (acme-rl-2, europe-west4)" in r.stdout


def test_network_create_plans_an_empty_project_without_credentials(home):
    """#53: its own help example failed without credentials ('no project given') where
    'cluster create' planned against a placeholder."""
    r, _ = _rlctl(["network", "create", "rl", "--count", "2", "--dry-run"], home)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0].startswith(ASSUMED)
    assert "network rl-dcn-1" in r.stdout and "Plan: 6 to create" in r.stdout


def test_the_train_dry_run_plans_against_the_dcn_networks_the_readme_creates(home):
    """#53: the README's step 1 makes 2 DCN networks; the train dry run planned against a
    cluster without them, with no flag to say otherwise."""
    base = ["train", "grpo", "--cluster", "demo", "-a", "v6e-16 x2", "--dry-run", "-o", "json"]
    r, _ = _rlctl([*base, "--dcn-networks", "2"], home)
    assert r.returncode == 0, r.stderr
    manifests = json.loads(r.stdout)
    assert any(m["kind"] == "ResourceClaimTemplate" for m in manifests), [
        m["kind"] for m in manifests
    ]
    assert "eth1,eth2" in r.stdout  # both networks' interfaces in the TPU flags
    r, _ = _rlctl(base, home)
    assert r.returncode == 0 and "eth1" not in r.stdout
    r, _ = _rlctl(["train", "grpo", "--dcn-networks", "2", "--steps", "1"], home)
    assert r.returncode == 2 and "--dcn-networks is for cluster runs" in r.stderr
