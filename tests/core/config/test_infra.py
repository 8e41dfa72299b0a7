"""InfraSpec: YAML + flags, defaults chain (flags > file > env > gcloud config > ADC)."""

from __future__ import annotations

import pytest

from rlctl.core.config.infra import build_infra_spec
from rlctl.core.errors import ConfigError
from rlctl.core.plan import Change, topo_order


def _gcloud(tmp_path, project="from-gcloud", region="europe-west4"):
    d = tmp_path / "gcloud"
    (d / "configurations").mkdir(parents=True)
    (d / "configurations" / "config_default").write_text(
        f"[core]\nproject = {project}\n[compute]\nregion = {region}\n"
    )
    return {"CLOUDSDK_CONFIG": str(d)}


class TestDefaults:
    def test_precedence(self, tmp_path):
        env = _gcloud(tmp_path)
        cfg = tmp_path / "infra.yaml"
        cfg.write_text("project: from-file\ncluster: rl\n")
        s = build_infra_spec(cfg, {"region": "us-east5"}, env={**env, "RLCTL_PROJECT": "env"})
        assert (s.project, s.region, s.zone) == ("from-file", "us-east5", "us-east5-b")
        s = build_infra_spec(None, {"cluster": "rl"}, env={**env, "RLCTL_PROJECT": "env"})
        assert (s.project, s.region) == ("env", "europe-west4")
        s = build_infra_spec(None, {"cluster": "rl", "project": "flag"}, env=env)
        assert s.project == "flag"

    def test_adc_is_last(self, tmp_path):
        env = {"CLOUDSDK_CONFIG": str(tmp_path / "none"), "RLCTL_REGION": "us-central1"}
        s = build_infra_spec(None, {"cluster": "rl"}, env=env, adc_project=lambda: "adc")
        assert s.project == "adc"
        with pytest.raises(ConfigError, match="no project"):
            build_infra_spec(None, {"cluster": "rl"}, env=env, adc_project=lambda: None)

    def test_slices_mtu_and_capacity(self):
        s = build_infra_spec(
            None,
            {
                "project": "p",
                "region": "r1",
                "cluster": "rl",
                "accelerators": ["v6e-16 x2", {"type": "a3-highgpu-8g", "count": 3}],
                "dcn": {"count": 2},
            },
            env={},
        )
        assert [(a.type, a.count) for a in s.accelerators] == [("v6e-16", 2), ("a3-highgpu-8g", 3)]
        assert s.dcn.mtu == 8896 and s.dcn.ranges() == ["10.50.0.0/16", "10.60.0.0/16"]
        with pytest.raises(ConfigError, match="reservation"):
            build_infra_spec(
                None,
                {
                    "project": "p",
                    "region": "r",
                    "cluster": "c",
                    "capacity": {"kind": "reservation"},
                },
                env={},
            )
        with pytest.raises(ConfigError, match="unknown field"):
            build_infra_spec(
                None, {"project": "p", "region": "r", "cluster": "c", "typo": 1}, env={}
            )


class TestPlan:
    def test_topo_order_puts_dependencies_first(self):
        cs = [
            Change(kind="nodepool", name="a", action="create", depends_on=["cluster/c"]),
            Change(kind="cluster", name="c", action="create", depends_on=["subnet/s"]),
            Change(kind="subnet", name="s", action="create", depends_on=["network/n"]),
            Change(kind="network", name="n", action="create"),
            Change(kind="bucket", name="b", action="create"),
        ]
        order = [c.key for c in topo_order(cs)]
        assert order.index("network/n") < order.index("subnet/s") < order.index("cluster/c")
        assert order.index("cluster/c") < order.index("nodepool/a")
