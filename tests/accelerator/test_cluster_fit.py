"""``rlctl train --cluster`` against the fake GKE (clusters seeded as ``rlctl cluster
create`` makes them, tests/fakes/seed.py) with the model's config.json in a bucket of
fake-gcs-server: the dry run prints each program's device memory per chip beside the
chip's, for a TPU and a GPU cluster; a run that cannot fit is refused with the setting
that makes it fit, and a real submit of it writes and applies nothing."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cluster_fit import WHERE
from tests.fakes.seed import seed_cluster

SHAPES = {"v6e-16 x2": 2, "a3-highgpu-8g x2": 0}  # -> the DCN networks cluster create adds
# GPT-3 175B's shape: its weights and Adam's moments are 2.1 TB, 65 GB on each of 32 chips
HUGE = {
    "model_type": "llama",
    "hidden_size": 12288,
    "intermediate_size": 49152,
    "num_hidden_layers": 96,
    "num_attention_heads": 96,
    "num_key_value_heads": 96,
    "head_dim": 128,
    "vocab_size": 50304,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


@pytest.fixture
def inputs(clients):
    """A bucket of inputs (the model's config.json), emptied after the test."""
    bucket = clients.storage.create_bucket(clients.storage.bucket("inputs"), location="US-CENTRAL1")
    yield bucket
    for blob in clients.storage.list_blobs("inputs"):
        blob.delete()


def _model_in_bucket(bucket, name: str, config: dict) -> str:
    bucket.blob(f"{name}/config.json").upload_from_string(json.dumps(config))
    return f"gs://{bucket.name}/{name}"


def _train(cli, *extra: str):
    return cli("train", "grpo", *WHERE, "--steps", "2", *extra)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_dry_run_prints_device_memory_per_chip(cli, fake, inputs, tiny_config, shape):
    seed_cluster(fake, "rl", [shape], dcn_networks=SHAPES[shape])
    model = _model_in_bucket(inputs, "tiny", tiny_config)
    r = _train(cli, "--model", model, "-G", "4", "--max-new-tokens", "16", "--dry-run")
    assert r.exit_code == 0, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if "device memory: fits" in ln]
    unit = "chip" if shape.startswith("v6e") else "GPU"
    assert "device memory: fits: " in line and f"GiB per {unit}, {shape}, compiled in" in line
    for program in ("update", "rollout", "eval"):
        assert f"    {program}: " in r.stderr
    if unit == "GPU":
        assert "compiled without the GPU: no autotuning" in r.stderr


def test_a_run_that_cannot_fit_is_refused_and_nothing_is_applied(
    cli, fake, kube, clients, inputs, cluster_bucket
):
    seed_cluster(fake, "rl", ["v6e-16 x2"], dcn_networks=2)
    model = _model_in_bucket(inputs, "huge", HUGE)
    r = _train(cli, "--model", model, "--dry-run")
    assert r.exit_code == 1, r.stderr
    (error,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert "the run does not fit v6e-16 x2: " in error
    assert "GiB per chip in its weights and optimizer state alone" in error
    (hint,) = [ln for ln in r.stderr.splitlines() if ln.startswith("hint:")]
    assert "the weights and optimizer state alone take" in hint
    assert "--lora-rank 16" in hint and "-a 'v6e-32 x2'" in hint
    r = _train(cli, "--model", model)  # a real submit: nothing written, nothing applied
    assert r.exit_code == 1 and kube.mutations() == []
    assert list(clients.storage.list_blobs(cluster_bucket)) == []
