"""checkpoint-convert's core on real files: tiny random models of every family,
real safetensors and real Orbax/TensorStore checkpoints, no mocks.

Round trips must move no bit; an interrupted conversion must leave DST absent and
resume; bad input must be one ConfigError with nothing left behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorstore")
pytest.importorskip("tokenizers")
from safetensors.numpy import load_file, save_file

from rlctl.core import families
from rlctl.core.checkpoints import layout
from rlctl.core.checkpoints.convert import convert
from rlctl.core.checkpoints.hf import INDEX, np_dtype
from rlctl.core.checkpoints.places import PARTIAL
from rlctl.core.checkpoints.sources import (
    TRAINER_MARKER,
    open_source,
)
from rlctl.core.checkpoints.verify import VerifyError, verify_against
from rlctl.core.errors import ConfigError
from tests.fakes.tiny_model import FAMILIES, write_tiny_model

# a family whose tiny model transformers writes (torch) is slow: out of the fast loop
FAMILY_CASES = [
    pytest.param(f, marks=pytest.mark.slow) if families.family(f).layout.by_layer else f
    for f in FAMILIES
]


def _weights(folder: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


class Stop(Exception):
    """Raised from the progress callback: a crash midway through a conversion."""


def _stop_after(n: int):
    def cb(done: int, total: int, done_b: int, total_b: int) -> None:
        if done >= n:
            raise Stop()

    return cb


class TestLayout:
    @pytest.mark.parametrize("family", FAMILY_CASES)
    def test_every_rule_inverts(self, tmp_path, family):
        src = write_tiny_model(tmp_path / "m", family, heads=4, kv_heads=2)
        config = json.loads((src / "config.json").read_text())
        w = _weights(src)
        for rule in layout.rules(config):
            parts = [w[n] for n in rule.hf]
            back = rule.to_hf(rule.to_trainer(parts))
            assert len(back) == len(parts)
            for a, b in zip(parts, back):
                np.testing.assert_array_equal(a, b)

    def test_gemma_without_gqa_stacks_q_k_v(self, tmp_path):
        src = write_tiny_model(tmp_path / "m", "gemma3_text", heads=2, kv_heads=2)
        config = json.loads((src / "config.json").read_text())
        keys = [r.key for r in layout.rules(config)]
        assert "layers.0.attn.qkv_einsum.w" in keys and "layers.0.attn.kv_einsum.w" not in keys

    def test_unsupported_type_lists_the_supported_ones(self):
        with pytest.raises(ConfigError) as e:
            layout.family_of({"model_type": "phi3"})
        assert "'phi3'" in e.value.message
        for family in layout.SUPPORTED:
            assert family in str(e.value)


class TestBandedTranspose:
    """Sources transpose a tensor band by band as they read it: odd sizes and many
    small bands must give exactly ``x.T``."""

    @pytest.mark.parametrize("shape", [(37, 11), (16, 16), (1, 5), (130, 3)])
    def test_transpose_and_transpose_into(self, shape):
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        np.testing.assert_array_equal(layout.transpose(x), x.T)
        out = np.zeros(shape[::-1], np.float32)
        for r0 in range(0, shape[0], 7):
            layout.transpose_into(out, x[r0 : r0 + 7], r0)
        np.testing.assert_array_equal(out, x.T)

    @pytest.mark.parametrize("family", FAMILY_CASES)
    def test_odd_sizes_in_tiny_bands_round_trip(self, tmp_path, monkeypatch, family):
        from rlctl.core.checkpoints import hf

        monkeypatch.setattr(hf, "BAND_BYTES", 1000)  # dozens of bands per tensor
        src = write_tiny_model(tmp_path / "hf", family, hidden=40, heads=5, kv_heads=1, ffn=70)
        convert(str(src), str(tmp_path / "tr"), to="trainer", verify=True)
        convert(str(tmp_path / "tr"), str(tmp_path / "hf2"), verify=True)
        a, b = _weights(src), _weights(tmp_path / "hf2")
        assert all(a[n].tobytes() == b[n].tobytes() for n in a)


class TestRoundTrip:
    @pytest.mark.parametrize("family", FAMILY_CASES)
    def test_hf_trainer_hf_is_bit_identical(self, tmp_path, family):
        src = write_tiny_model(tmp_path / "hf", family)
        r1 = convert(str(src), str(tmp_path / "tr"), to="trainer", verify=True)
        assert r1.verified and r1.family == family
        assert (tmp_path / "tr" / TRAINER_MARKER).is_file()
        r2 = convert(str(tmp_path / "tr"), str(tmp_path / "hf2"), to="hf", verify=True)
        assert r2.src_kind == "trainer"
        a, b = _weights(src), _weights(tmp_path / "hf2")
        assert sorted(a) == sorted(b)
        for name in a:
            assert a[name].dtype == b[name].dtype
            assert a[name].tobytes() == b[name].tobytes(), name
        for f in (
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ):
            assert (tmp_path / "hf2" / f).read_bytes() == (src / f).read_bytes()
        assert not list(tmp_path.glob(f"*{PARTIAL}"))

    def test_bf16_is_round_to_nearest_and_stays_bf16_through_trainer(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "llama")
        convert(str(src), str(tmp_path / "tr"), to="trainer", dtype="bf16", verify=True)
        r = convert(str(tmp_path / "tr"), str(tmp_path / "hf2"), verify=True)
        assert r.dtype == "bfloat16"
        a, b = _weights(src), _weights(tmp_path / "hf2")
        bf16 = np_dtype("bfloat16")
        for name in a:
            assert b[name].dtype == bf16
            np.testing.assert_array_equal(a[name].astype(bf16), b[name])

    def test_sharded_input_and_output_with_index(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "qwen2")
        r = convert(str(src), str(tmp_path / "sharded"), shard_bytes=100_000)
        index = json.loads((tmp_path / "sharded" / INDEX).read_text())
        shards = sorted(set(index["weight_map"].values()))
        assert len(shards) > 2 and not (tmp_path / "sharded" / "model.safetensors").exists()
        assert index["metadata"]["total_size"] == r.bytes
        r2 = convert(str(tmp_path / "sharded"), str(tmp_path / "tr"), to="trainer", verify=True)
        assert r2.verified

    def test_single_file_source(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "llama")
        r = convert(str(src / "model.safetensors"), str(tmp_path / "out"), verify=True)
        assert r.verified and (tmp_path / "out" / "tokenizer.json").is_file()

    def test_verify_catches_a_changed_tensor(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "llama")
        convert(str(src), str(tmp_path / "out"))
        w = _weights(tmp_path / "out")
        w["model.layers.1.mlp.up_proj.weight"][0, 0] += 1e-3
        save_file(w, str(tmp_path / "out" / "model.safetensors"))
        with pytest.raises(VerifyError, match="up_proj"):
            verify_against(open_source(str(src)), open_source(str(tmp_path / "out")))


class TestVerifyInConvert:
    def test_a_wrong_write_fails_verify_and_leaves_nothing(self, tmp_path, monkeypatch):
        from rlctl.core.checkpoints import convert as conv

        real = conv._cast

        def corrupt(arr, dtype):  # what a bug in a writer would do to one tensor
            out = real(arr, dtype)
            return out + 1 if out.shape == (64,) else out

        src = write_tiny_model(tmp_path / "hf", "llama")
        monkeypatch.setattr(conv, "_cast", corrupt)
        with pytest.raises(VerifyError, match="bytes differ"):
            convert(str(src), str(tmp_path / "out"), to="trainer", verify=True)
        assert not (tmp_path / "out").exists()
        assert not (tmp_path / f"out{PARTIAL}").exists()


class TestResume:
    @pytest.mark.parametrize("to", ["hf", "trainer"])
    def test_interrupted_conversion_leaves_no_dst_and_resumes(self, tmp_path, to):
        src = write_tiny_model(tmp_path / "hf", "llama", layers=3)
        dst = tmp_path / "out"
        with pytest.raises(Stop):
            convert(str(src), str(dst), to=to, on_progress=_stop_after(12), shard_bytes=60_000)
        assert not dst.exists()
        assert (tmp_path / f"out{PARTIAL}").is_dir()
        r = convert(str(src), str(dst), to=to, shard_bytes=60_000, verify=True)
        assert r.resumed > 0 and r.verified
        assert not (tmp_path / f"out{PARTIAL}").exists()


class TestBadInput:
    def _assert_nothing_left(self, tmp_path: Path) -> None:
        assert not (tmp_path / "out").exists()
        assert not (tmp_path / f"out{PARTIAL}").exists()

    def test_folder_that_is_no_checkpoint(self, tmp_path):
        (tmp_path / "junk").mkdir()
        (tmp_path / "junk" / "notes.txt").write_text("hi")
        with pytest.raises(ConfigError, match="is not a checkpoint"):
            convert(str(tmp_path / "junk"), str(tmp_path / "out"))
        self._assert_nothing_left(tmp_path)

    def test_unsupported_architecture(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "llama")
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "model_type": "phi3"}))
        with pytest.raises(ConfigError) as e:
            convert(str(src), str(tmp_path / "out"))
        assert "phi3" in str(e.value) and "gemma3_text" in str(e.value)
        self._assert_nothing_left(tmp_path)

    def test_missing_shard(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "llama")
        convert(str(src), str(tmp_path / "sharded"), shard_bytes=100_000)
        second = sorted((tmp_path / "sharded").glob("model-*.safetensors"))[1]
        second.unlink()
        with pytest.raises(ConfigError, match=f"{second.name}.*missing"):
            convert(str(tmp_path / "sharded"), str(tmp_path / "out"))
        self._assert_nothing_left(tmp_path)

    def test_missing_tensor(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "qwen3")
        w = _weights(src)
        del w["model.layers.1.self_attn.k_norm.weight"]
        save_file(w, str(src / "model.safetensors"))
        with pytest.raises(ConfigError, match="k_norm.weight' is missing"):
            convert(str(src), str(tmp_path / "out"))
        self._assert_nothing_left(tmp_path)

    def test_dst_exists_without_overwrite(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "llama")
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "mine.txt").write_text("keep me")
        with pytest.raises(ConfigError, match="already exists"):
            convert(str(src), str(tmp_path / "out"))
        assert (tmp_path / "out" / "mine.txt").read_text() == "keep me"
        assert not (tmp_path / f"out{PARTIAL}").exists()
        r = convert(str(src), str(tmp_path / "out"), overwrite=True)
        assert r.tensors and not (tmp_path / "out" / "mine.txt").exists()

    def test_truncated_shard_found_before_writing(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "llama")
        f = src / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-1000])
        with pytest.raises(ConfigError, match="truncated"):
            convert(str(src), str(tmp_path / "out"))
        self._assert_nothing_left(tmp_path)


class TestOtherInputs:
    def test_gguf_goes_through_the_gguf_converter(self, tmp_path):
        pytest.importorskip("gguf")
        from tests.core.checkpoints.test_gguf import _hf_weights, _vocab_size, write_tiny_gguf

        weights = _hf_weights(_vocab_size())
        src = write_tiny_gguf(tmp_path / "tiny.gguf", weights)
        r = convert(str(src), str(tmp_path / "tr"), to="trainer", verify=True)
        assert (r.src_kind, r.family, r.verified) == ("gguf", "llama", True)
        back = convert(str(tmp_path / "tr"), str(tmp_path / "hf"))
        assert back.tensors == len(weights)
        out = _weights(tmp_path / "hf")
        for name, w in weights.items():
            np.testing.assert_array_equal(out[name], w.astype(np.float32))
        assert (tmp_path / "hf" / "tokenizer.json").is_file()

    def test_orbax_folder_with_its_config(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "qwen2")
        convert(str(src), str(tmp_path / "tr"), to="trainer")
        step = tmp_path / "tr" / "checkpoint"
        (step / "config.json").write_text((src / "config.json").read_text())
        r = convert(str(step), str(tmp_path / "out"), verify=True)
        assert r.src_kind == "orbax" and r.verified

    def test_orbax_folder_without_config_says_what_to_do(self, tmp_path):
        src = write_tiny_model(tmp_path / "hf", "qwen2")
        convert(str(src), str(tmp_path / "tr"), to="trainer")
        with pytest.raises(ConfigError, match="has no config.json"):
            convert(str(tmp_path / "tr" / "checkpoint"), str(tmp_path / "out"))
