"""``rlctl cluster`` and ``rlctl network`` through typer's CliRunner with the fake injected."""

from __future__ import annotations

import json

import pytest

BASE = ["--project", "p", "--region", "us-central1", "--zone", "us-central1-b"]
CREATE = [
    "cluster",
    "create",
    "rl",
    *BASE,
    "-a",
    "v6e-16 x2",
    "--dcn-networks",
    "2",
    "--bucket",
    "rl-runs",
]


class TestClusterCreate:
    def test_dry_run_json_is_only_json_and_sends_no_mutation(self, cli, fake):
        r = cli(*CREATE, "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        plan = json.loads(r.stdout)  # nothing else on stdout
        assert plan["operation"] == "create"
        actions = {(c["kind"], c["name"]): c["action"] for c in plan["changes"]}
        assert actions[("nodepool", "v6e-16-1")] == "create"
        pool = next(c for c in plan["changes"] if c["name"] == "v6e-16-0")
        assert pool["fields"]["topology"] == "4x4" and pool["fields"]["nodes"] == 4
        assert pool["cost_per_hour"] > 0
        assert plan["cost"]["per_hour"] > 0 and "estimate" in plan["cost"]["note"]
        assert fake.mutations() == []

    def test_table_plan_shows_actions_and_cost_estimate(self, cli, fake):
        r = cli(*CREATE, "--dry-run", "--spot")
        assert r.exit_code == 0, r.stderr
        assert "v6e-16-0" in r.stdout and "create" in r.stdout
        assert "Estimated node cost (spot)" in r.stdout and "estimate from public list" in r.stdout
        assert "dry run" in r.stderr and fake.mutations() == []

    @pytest.mark.parametrize("flags", [["-a", "v6e-8 x2"], ["-a", "v6e-8", "--num-slices", "2"]])
    def test_several_single_host_slices_are_one_line_and_nothing_is_called(self, cli, fake, flags):
        r = cli("cluster", "create", "rl", *BASE, *flags, "--dry-run")
        assert r.exit_code == 2
        (err,) = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert "2 slices of v6e-8 cannot train as one job" in err
        assert "use one v6e-8 or one v6e-16 slice" in err
        assert "Traceback" not in r.stderr and fake.requests == []

    def test_num_slices(self, cli):
        r = cli(
            "cluster",
            "create",
            "rl",
            *BASE,
            "-a",
            "v6e-16",
            "--num-slices",
            "2",
            "--dry-run",
            "-o",
            "json",
        )
        names = [c["name"] for c in json.loads(r.stdout)["changes"] if c["kind"] == "nodepool"]
        assert names == ["v6e-16-0", "v6e-16-1", "pathways"]

    def test_without_yes_outside_a_terminal_refuses(self, cli, fake):
        r = cli(*CREATE)
        assert r.exit_code == 2 and "--yes" in r.stderr
        assert fake.mutations() == []

    def test_create_then_rerun_is_a_noop_that_says_so(self, cli, fake, kube):
        r = cli(*CREATE, "--yes", "-o", "json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        # 13 Google Cloud resources (the Pathways pool and the nodes' bucket binding
        # among them) + 2 controllers + the KSA (namespace: default)
        assert len(doc["result"]["applied"]) == 16
        assert {
            "controller/jobset",
            "controller/pathways-job",
            "serviceaccount/default/rlctl",
        } <= set(doc["result"]["applied"])
        n, k = len(fake.mutations()), len(kube.mutations())
        r = cli(*CREATE, "--yes")
        assert r.exit_code == 0, r.stderr
        assert "nothing to do: rl already matches the spec" in r.stderr
        assert len(fake.mutations()) == n and len(kube.mutations()) == k

    def test_config_file(self, cli, fake, tmp_path):
        cfg = tmp_path / "infra.yaml"
        cfg.write_text(
            "project: p\nregion: us-central1\ncluster: rl\naccelerators: ['v5litepod-16']\n"
        )
        r = cli("cluster", "create", "-c", str(cfg), "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        pool = next(c for c in json.loads(r.stdout)["changes"] if c["kind"] == "nodepool")
        assert pool["fields"]["machine_type"] == "ct5lp-hightpu-4t"

    def test_quota_error_is_one_line_and_exits_6(self, cli, fake):
        fake.fail_operation(
            r"/nodePools$", 8, "Insufficient quota to satisfy the request: TPUV6E chips limit 16"
        )
        r = cli(*CREATE, "--yes")
        assert r.exit_code == 6
        err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert len(err) == 1 and "quota exceeded" in err[0]
        assert "Traceback" not in r.stderr

    def test_permission_error_is_one_line_and_exits_5(self, cli, fake):
        fake.fail(
            "GET", r"/services:batchGet$", 403, "Permission denied on project p", reason="forbidden"
        )
        r = cli(*CREATE, "--yes")
        assert r.exit_code == 5
        err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert len(err) == 1 and "permission denied" in err[0]
        assert fake.mutations() == []

    def test_preflight_failure_exits_2_before_mutation(self, cli, fake):
        fake.enabled.discard("container.googleapis.com")
        r = cli(*CREATE, "--yes")
        assert r.exit_code == 2 and "gcloud services enable container.googleapis.com" in r.stderr
        assert fake.mutations() == []

    def test_unknown_accelerator(self, cli):
        r = cli("cluster", "create", "rl", *BASE, "-a", "v6e-17", "--dry-run")
        assert r.exit_code == 2 and "did you mean" in r.stderr and "v6e-16" in r.stderr


class TestClusterOthers:
    def test_describe_list_delete(self, cli, fake):
        assert cli(*CREATE, "--yes").exit_code == 0
        r = cli("cluster", "describe", "rl", *BASE[:4], "-o", "json")
        d = json.loads(r.stdout)
        assert d["status"] == "RUNNING" and d["addons"]["ray_operator"]
        assert {p["name"]: p["status"] for p in d["node_pools"]} == {
            "cpu": "RUNNING",
            "v6e-16-0": "RUNNING",
            "v6e-16-1": "RUNNING",
            "pathways": "RUNNING",
        }
        r = cli("cluster", "describe", "rl", *BASE[:4])
        assert "v6e-16-1" in r.stdout and "4x4" in r.stdout
        r = cli("cluster", "list", "--project", "p", "-o", "json")
        assert [c["name"] for c in json.loads(r.stdout)] == ["rl"]
        r = cli("cluster", "delete", "rl", *BASE[:4], "--dry-run")
        assert r.exit_code == 0 and "network" in r.stdout and "rl-dcn-1-internal" in r.stdout
        r = cli("cluster", "delete", "rl", *BASE[:4], "--yes", "-o", "json")
        assert r.exit_code == 0, r.stderr
        applied = json.loads(r.stdout)["result"]["applied"]
        assert len(applied) == 13  # 11 Google Cloud resources + 2 controllers
        assert {"controller/jobset", "controller/pathways-job"} <= set(applied)
        assert fake.is_empty()
        r = cli("cluster", "delete", "rl", *BASE[:4], "--yes")
        assert r.exit_code == 0 and "nothing to delete" in r.stderr

    def test_describe_missing_exits_3(self, cli):
        r = cli("cluster", "describe", "nope", *BASE[:4])
        assert r.exit_code == 3 and "not found" in r.stderr


class TestNetwork:
    def test_create_show_delete(self, cli, fake):
        r = cli("network", "create", "rl", *BASE[:4], "--count", "2", "--yes")
        assert r.exit_code == 0, r.stderr
        assert sorted(fake.networks) == ["rl-dcn-0", "rl-dcn-1"]
        assert {n["mtu"] for n in fake.networks.values()} == {8896}
        r = cli("network", "show", "rl", *BASE[:4], "-o", "json")
        assert len(json.loads(r.stdout)) == 6
        r = cli("network", "delete", "rl", *BASE[:4], "--yes")
        assert r.exit_code == 0, r.stderr
        assert fake.is_empty()


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["cluster"],
        ["network"],
        ["cluster", "create"],
        ["cluster", "delete"],
        ["cluster", "list"],
        ["cluster", "describe"],
        ["network", "create"],
        ["network", "show"],
        ["network", "delete"],
    ],
)
def test_help(args):
    from typer.testing import CliRunner

    from rlctl.cli.app import app

    r = CliRunner().invoke(app, [*args, "--help"])
    assert r.exit_code == 0, r.output
    if len(args) == 2:
        assert "Example:" in r.stdout
