"""gs:// model and data paths are read in the pods through GCS FUSE mounts; a path on
this machine is refused for a cluster run (the pods could never read it)."""

from __future__ import annotations

import pytest

from rlctl.core.errors import ConfigError
from rlctl.core.runs.spec import resolve_run_spec
from rlctl.core.runs.submit import mounted_buckets, pod_inputs


def spec(**flags):
    return resolve_run_spec("grpo", flags={"name": "r1", **flags})


class TestPodInputs:
    def test_gs_paths_become_mount_paths_and_their_buckets_are_mounted(self):
        s = pod_inputs(
            spec(
                **{
                    "model.source": "gs://models-b/qwen3-0.6b",
                    "data.name": "gsm8k",
                    "data.path": "gs://data-b/gsm8k/train.jsonl",
                    "data.eval_path": "gs://data-b/gsm8k/test.jsonl",
                }
            )
        )
        assert s.model.source == "/gcs/models-b/qwen3-0.6b"
        assert (s.data.path, s.data.eval_path) == (
            "/gcs/data-b/gsm8k/train.jsonl",
            "/gcs/data-b/gsm8k/test.jsonl",
        )
        assert mounted_buckets(s) == ["models-b", "data-b"]
        # the stored spec (resume renders from it) keeps its mounts
        assert pod_inputs(s) == s and mounted_buckets(pod_inputs(s)) == ["models-b", "data-b"]

    def test_embedded_model_and_hub_ids_are_left_alone(self):
        s = spec(**{"model.source": "Qwen/Qwen3-0.6B"})
        assert pod_inputs(s) == s and mounted_buckets(s) == []
        s = spec()
        assert pod_inputs(s) == s

    @pytest.mark.parametrize(
        "key,flag", [("data.path", "--data-path"), ("data.eval_path", "--set data.eval_path=")]
    )
    def test_a_local_data_file_is_refused_with_the_copy_command(self, tmp_path, key, flag):
        f = tmp_path / "train.jsonl"
        f.write_text('{"question": "1+1", "answer": "#### 2"}\n')
        with pytest.raises(ConfigError) as e:
            pod_inputs(spec(**{"data.name": "gsm8k", key: str(f)}))
        assert e.value.message == (
            f"{key}={str(f)!r} is a path on this machine; the cluster's pods cannot read it"
        )
        assert f"gcloud storage cp -r {f} gs://BUCKET/inputs/" in (e.value.hint or "")
        assert flag in (e.value.hint or "")

    def test_a_local_model_folder_is_refused(self, tmp_path):
        with pytest.raises(ConfigError, match="model.source=.* is a path on this machine"):
            pod_inputs(spec(**{"model.source": str(tmp_path)}))

    def test_a_bucketless_uri_is_refused(self):
        with pytest.raises(ConfigError, match="names no bucket"):
            pod_inputs(spec(**{"data.name": "jsonl", "data.path": "gs:///x.jsonl"}))
