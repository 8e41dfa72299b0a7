"""Messages that say what is wrong: the cloud commands' names before credentials, one
env var per kind of config, and --debug keeping the exit code."""

from __future__ import annotations

import time

from tests.faults.conftest import one_error

NO_CREDS = {"GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent/credentials.json"}


def test_network_create_without_a_name(cli):
    one_error(
        cli("network", "create", "--project", "p", "--region", "us-central1"),
        2,
        "no cluster name given",
    )


def test_a_bad_cluster_name_is_reported_before_credentials(cli):
    t = time.monotonic()
    r = cli("cluster", "create", "Bad_Name", "--region", "us-central1", "--dry-run", env=NO_CREDS)
    one_error(r, 2, "cluster name 'Bad_Name'")
    assert time.monotonic() - t < 30


def test_network_count_is_checked_before_credentials(cli):
    r = cli(
        "network",
        "create",
        "rl",
        "--count",
        "0",
        "--project",
        "p",
        "--region",
        "us-central1",
        env=NO_CREDS,
    )
    assert r.returncode == 2 and "--count" in r.stderr and "credentials" not in r.stderr


def test_a_training_config_in_rlctl_config_is_not_the_clusters(cli, tmp_path):
    (tmp_path / "train.yaml").write_text("training:\n  steps: 5\n")
    r = cli(
        "cluster",
        "create",
        "Bad_Name",
        "--project",
        "p",
        "--region",
        "us-central1",
        env={"RLCTL_CONFIG": str(tmp_path / "train.yaml")},
    )
    one_error(r, 2, "cluster name 'Bad_Name'")  # not "training: unknown field"


def test_debug_adds_the_traceback_and_keeps_the_exit_code(cli, tmp_path):
    r = cli("--debug", "status", "nope", "--runs-dir", str(tmp_path))
    assert r.returncode == 3 and "Traceback" in r.stderr and "error: run 'nope'" in r.stderr


def test_a_bad_run_name_is_reported_before_credentials(cli):
    r = cli(
        "delete",
        "run",
        "MyRun",
        "--runs-dir",
        "gs://b/runs",
        "--project",
        "p",
        "--region",
        "us-central1",
        "--dry-run",
        env=NO_CREDS,
    )
    one_error(r, 2, "run name 'MyRun'")


def test_a_missing_credentials_file_is_named(cli):
    r = cli("cluster", "list", "--project", "p", "--region", "us-central1", env=NO_CREDS)
    one_error(r, 5, "GOOGLE_APPLICATION_CREDENTIALS=/nonexistent/credentials.json")


def test_flags_that_exclude_each_other_and_bad_buckets_come_before_credentials(cli):
    base = (
        "cluster",
        "create",
        "rl",
        "--project",
        "p",
        "--region",
        "us-central1",
        "-a",
        "v6e-16",
        "--dry-run",
    )
    one_error(cli(*base, "--spot", "--reservation", "r", env=NO_CREDS), 2, "--spot")
    one_error(cli(*base, "--bucket", "Bad_Bucket!", env=NO_CREDS), 2, "bucket name")


def test_a_value_outside_a_choice_is_shown(cli):
    # --dataset is no longer a closed choice (#26: any hub id), but the value given is
    # still named beside what is accepted
    one_error(
        cli("train", "grpo", "--dataset", "csv", "--dry-run"), 2, "'csv' is not", "hub dataset id"
    )
    one_error(cli("train", "grpo", "--set", "rollout.engine=fast", "--dry-run"), 2, "(got 'fast')")
