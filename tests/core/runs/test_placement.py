"""The fit check's lines as the user reads them: one per pod group, with a fix that is
true for this cluster (flags of ``train``, or the command that changes the cluster)."""

from __future__ import annotations

import pytest

from rlctl.core.config import nodes
from rlctl.core.errors import UnschedulableError
from rlctl.core.runs.placement import check_placement
from tests.core.k8s.test_fit import cluster_pools, objs_for


def _lines(objs, pools, acc="v6e-16") -> list[str]:
    with pytest.raises(UnschedulableError) as e:
        check_placement(objs, pools, [], "rl", "us-east5", acc)
    assert e.value.exit_code == 2
    return e.value.lines


def test_what_fits_is_placed_and_nothing_is_raised():
    report, notes = check_placement(
        objs_for("ray", "v6e-16", 2), cluster_pools("v6e-16", 2), [], "rl", "us-east5", "v6e-16"
    )
    assert report.fits and notes == []
    assert [p.role for p in report.placements] == ["ray-head", "ray-worker", "ray-submitter"]


@pytest.mark.parametrize(
    ("flag", "value", "hint"),
    [
        ("cpu", "100", "pass --cpu 80 (or leave --cpu out)"),
        ("memory", "700Gi", "pass --memory 628Gi (or leave --memory out)"),
    ],
)
def test_host_pods_larger_than_a_node_name_the_flag_and_its_largest_value(flag, value, hint):
    (line,) = _lines(objs_for("jobset", "v6e-16", 2, **{flag: value}), cluster_pools("v6e-16", 2))
    assert line.startswith("JobSet r1, replicated job slice (8 pods): each pod asks ")
    assert line.endswith(hint)


def test_pathways_without_its_pool_names_the_command_that_adds_it():
    (line,) = _lines(objs_for("pathways", "v6e-16", 2), cluster_pools("v6e-16", 2, pathways=False))
    assert (
        "re-run 'rlctl cluster create rl --region us-east5 -a v6e-16' to add the "
        "'pathways' pool (n2-standard-64" in line
    )


def test_pathways_on_one_chip_hosts_names_the_backends_that_work():
    (line,) = _lines(objs_for("pathways", "v6e-1", 1), cluster_pools("v6e-1", 1), "v6e-1")
    assert "pathways-job v0.1.4 asks 4 TPU chips of every host" in line
    assert line.endswith("use --backend jobset or ray")


def test_a_cpu_pool_too_small_is_not_promised_a_resize():
    objs = objs_for("ray", "v6e-16", 1)
    head = objs[-1]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    head["containers"][0]["resources"]["requests"]["cpu"] = "12"
    (line,) = _lines(objs, cluster_pools("v6e-16", 1))
    assert "RayJob r1, head (1 pod): each pod asks 12 CPU" in line
    assert "rlctl does not change an existing cluster's CPU pool" in line


def test_pools_rlctl_cannot_model_turn_a_refusal_into_a_note():
    objs = objs_for("jobset", "v6e-16", 2, cpu="100")
    report, notes = check_placement(
        objs, cluster_pools("v6e-16", 2), ["big (m9-mega)"], "rl", "us-east5", "v6e-16"
    )
    assert not report.fits
    assert notes[0].startswith("not checked: node pool(s) big (m9-mega)")
    assert "pass --cpu 80" in notes[1]


def test_every_line_is_one_line():
    pools = [nodes.node_pool("cpu", "e2-standard-8", 1)]  # no accelerator pool at all
    for line in _lines(objs_for("jobset", "v6e-16", 2), pools):
        assert "\n" not in line


def test_a_cluster_of_several_single_host_pools_is_refused_before_rendering():
    """Two v6e-8 pools (made by hand, or by an older rlctl) are no Multislice job: GKE
    joins multi-host slices only; train --cluster says so and how to fix the cluster."""
    from rlctl.core.config.catalog import lookup
    from rlctl.core.errors import ConfigError
    from rlctl.core.k8s.shapes import slice_shape
    from rlctl.core.runs.cluster import ClusterTarget

    target = ClusterTarget(
        name="rl",
        project="p",
        region="us-east5",
        endpoint="1.2.3.4",
        ca_cert=None,
        shapes={"v6e-8": slice_shape(lookup("v6e-8"), 2)},
    )
    with pytest.raises(ConfigError) as e:
        target.shape()
    assert "2 slices of v6e-8 cannot train as one job" in e.value.message
    assert "rlctl cluster create rl -a v6e-8" in e.value.hint
    one = ClusterTarget(
        name="rl",
        project="p",
        region="us-east5",
        endpoint="1.2.3.4",
        ca_cert=None,
        shapes={"v6e-8": slice_shape(lookup("v6e-8"), 1)},
    )
    assert one.shape()[0] == "v6e-8"
