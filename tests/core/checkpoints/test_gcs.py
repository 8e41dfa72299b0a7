"""Conversion from and to ``gs://`` on fake-gcs-server (the real server binary and the
real google-cloud-storage client): ranged reads, streamed resumable uploads, a crash
midway that leaves DST absent, and a re-run that skips finished shards and verifies."""

from __future__ import annotations

import pytest

pytest.importorskip("google.cloud.storage")
pytest.importorskip("tensorstore")
pytest.importorskip("tokenizers")

from rlctl.core.checkpoints.convert import convert
from rlctl.core.checkpoints.places import PARTIAL
from rlctl.core.errors import ConfigError
from tests.fakes.tiny_model import write_tiny_model


class Crash(Exception):
    pass


def _objects(client, bucket: str, prefix: str) -> list[str]:
    return sorted(b.name for b in client.list_blobs(bucket, prefix=prefix))


def test_gcs_to_gcs_crash_midway_then_resume_and_verify(gcs, tmp_path):
    client, bucket = gcs
    src = write_tiny_model(tmp_path / "hf", "qwen2", layers=3)
    up = convert(str(src), f"gs://{bucket}/models/src", client=client, shard_bytes=80_000)
    assert up.tensors and _objects(client, bucket, "models/src/")

    def crash_after(n):
        def cb(done, total, done_b, total_b):
            if done >= n:
                raise Crash()

        return cb

    dst = f"gs://{bucket}/models/out"
    with pytest.raises(Crash):
        convert(
            f"gs://{bucket}/models/src",
            dst,
            client=client,
            shard_bytes=60_000,
            dtype="bf16",
            on_progress=crash_after(20),
        )
    assert _objects(client, bucket, "models/out/") == []  # DST: nothing at all
    staged = _objects(client, bucket, f"models/out{PARTIAL}/")
    assert staged and all(s.endswith(".safetensors") for s in staged)

    r = convert(
        f"gs://{bucket}/models/src",
        dst,
        client=client,
        shard_bytes=60_000,
        dtype="bf16",
        verify=True,
    )
    assert r.resumed > 0 and r.verified and r.dtype == "bfloat16"
    assert _objects(client, bucket, f"models/out{PARTIAL}/") == []
    names = _objects(client, bucket, "models/out/")
    assert "models/out/model.safetensors.index.json" in names
    assert "models/out/tokenizer.json" in names

    # and back through the trainer's format, on gs:// as well, bit for bit
    convert(dst, f"gs://{bucket}/models/trainer", to="trainer", client=client, verify=True)
    back = convert(
        f"gs://{bucket}/models/trainer", str(tmp_path / "back"), client=client, verify=True
    )
    assert back.verified and back.dtype == "bfloat16"


def test_gcs_dst_exists_without_overwrite(gcs, tmp_path):
    client, bucket = gcs
    src = write_tiny_model(tmp_path / "hf", "llama")
    convert(str(src), f"gs://{bucket}/m", client=client)
    with pytest.raises(ConfigError, match="already exists"):
        convert(str(src), f"gs://{bucket}/m", client=client)
    assert _objects(client, bucket, f"m{PARTIAL}/") == []


def test_gcs_missing_shard(gcs, tmp_path):
    client, bucket = gcs
    src = write_tiny_model(tmp_path / "hf", "llama")
    convert(str(src), f"gs://{bucket}/m", client=client, shard_bytes=100_000)
    shard = [n for n in _objects(client, bucket, "m/") if n.endswith(".safetensors")][1]
    client.bucket(bucket).blob(shard).delete()
    with pytest.raises(ConfigError, match=f"{shard[2:]} named by .* is missing"):
        convert(f"gs://{bucket}/m", str(tmp_path / "out"), client=client)
    assert not (tmp_path / "out").exists() and not (tmp_path / f"out{PARTIAL}").exists()


def test_run_on_gcs_exports_its_latest_committed_checkpoint(gcs, tmp_path):
    """``gs://BUCKET/runs/NAME``: the run store's latest step with a COMMITTED marker
    (a later step still uploading is ignored), its source model's config and tokenizer."""
    import shutil

    import yaml

    from rlctl.core.store.base import CHECKPOINTS, SPEC
    from rlctl.core.store.gcs import GcsRunStore

    client, bucket = gcs
    src = write_tiny_model(tmp_path / "hf", "qwen3")
    convert(str(src), str(tmp_path / "tr"), to="trainer")
    run = GcsRunStore(f"gs://{bucket}/runs", client=client).run("pol")
    run.write_text(SPEC, yaml.safe_dump({"name": "pol", "model": {"source": str(src)}}))
    shutil.copytree(tmp_path / "tr" / "checkpoint", run.path_for(f"{CHECKPOINTS}/3"))
    run.publish_checkpoint(3)
    shutil.copytree(tmp_path / "tr" / "checkpoint", run.path_for(f"{CHECKPOINTS}/5"))
    run.push(f"{CHECKPOINTS}/5")  # uploaded, but never committed

    r = convert(f"gs://{bucket}/runs/pol", str(tmp_path / "out"), client=client, verify=True)
    assert (r.src_kind, r.step, r.family, r.verified) == ("run", 3, "qwen3", True)
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (
        src / "tokenizer.json"
    ).read_bytes()
    with pytest.raises(ConfigError, match="no complete checkpoint 5"):
        convert(f"gs://{bucket}/runs/pol", str(tmp_path / "out5"), client=client, step=5)
