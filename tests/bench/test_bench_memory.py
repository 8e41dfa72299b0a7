"""bench/bench_memory.py without a training run: the generated model folders, the
least-squares fit and the plot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import bench_memory as bm
from rlctl.core.trainer.model.models import check_model_folder

TINY = dict(
    num_hidden_layers=2,
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


@pytest.fixture()
def tokenizer_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in bm.TOKENIZER_FILES:
        (folder / name).write_text(json.dumps({"file": name}))
    return folder


def _read(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """The header and every tensor (as float32) of the folder's model.safetensors."""
    import ml_dtypes

    raw = (folder / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    kinds = {"F32": np.float32, "BF16": ml_dtypes.bfloat16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        out[name] = (
            np.frombuffer(data[lo:hi], kinds[t["dtype"]]).astype(np.float32).reshape(t["shape"])
        )
    return header, out


class TestGeneratedModel:
    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    def test_folder_loads_and_holds_small_random_weights(self, tmp_path, tokenizer_dir, dtype):
        folder = bm.write_model(tmp_path / "m", TINY, dtype, tokenizer_dir)
        assert check_model_folder(folder) == folder  # rlctl's own header and layer check
        config = json.loads((folder / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLM"]
        assert config["head_dim"] == 8 and config["torch_dtype"] == dtype
        assert all((folder / f).is_file() for f in bm.TOKENIZER_FILES)
        header, tensors = _read(folder)
        assert {t["dtype"] for k, t in header.items() if k != "__metadata__"} == {
            "float32": {"F32"},
            "bfloat16": {"BF16"},
        }[dtype]
        assert sum(x.size for x in tensors.values()) == bm.param_count(config)
        assert "lm_head.weight" not in tensors  # tied
        assert np.all(tensors["model.norm.weight"] == 1)
        embed = tensors["model.embed_tokens.weight"]
        assert embed.shape == (96, 32) and 0.015 < embed.std() < 0.025
        assert not (folder.parent / "m.partial").exists()

    def test_streamed_chunks_are_the_same_weights(self, tmp_path, tokenizer_dir, monkeypatch):
        whole = _read(bm.write_model(tmp_path / "a", TINY, "float32", tokenizer_dir))[1]
        monkeypatch.setattr(bm, "_CHUNK", 40)  # a row or so at a time
        chunked = _read(bm.write_model(tmp_path / "b", TINY, "float32", tokenizer_dir))[1]
        assert all(np.array_equal(whole[k], chunked[k]) for k in whole)

    def test_real_shapes_have_the_released_models_parameter_counts(self):
        counts = {
            name: bm.param_count(bm.hf_config(shape, "float32"))
            for name, shape in bm.SHAPES.items()
        }
        assert counts == {
            "smollm2-135m": 134_515_008,
            "smollm2-360m": 361_821_120,
            "llama-3.2-1b": 1_235_814_400,
        }

    def test_ensure_model_reuses_a_complete_folder(self, tmp_path, tokenizer_dir, monkeypatch):
        monkeypatch.setitem(bm.SHAPES, "tiny", TINY)
        monkeypatch.setattr(bm, "smollm2_tokenizer_dir", lambda: tokenizer_dir)
        folder, params = bm.ensure_model(tmp_path, "tiny", "float32")
        assert folder == tmp_path / "tiny-float32" and params == bm.param_count(
            bm.hf_config(TINY, "float32")
        )

        def fail(*a, **k):
            raise AssertionError("generated again")

        monkeypatch.setattr(bm, "write_model", fail)
        assert bm.ensure_model(tmp_path, "tiny", "float32") == (folder, params)


def _m(params: int, peak: int, **kw) -> bm.Measurement:
    return bm.Measurement(
        model=kw.pop("model", "x"),
        params=params,
        dtype=kw.pop("dtype", "float32"),
        group=kw.pop("group", 4),
        new_tokens=kw.pop("L", 32),
        prompts=2,
        peak_rss=peak,
        step_s=kw.pop("steps", [9.0, 2.0]),
        **kw,
    )


class TestFigures:
    def test_fit_recovers_slope_and_overhead(self):
        ms = [_m(p, 18 * p + 2**30) for p in (135_000_000, 360_000_000, 1_240_000_000)]
        f = bm.fits(ms)["all sizes"]
        assert f["bytes_per_param"] == pytest.approx(18)
        assert f["overhead_bytes"] == pytest.approx(2**30, rel=1e-6)
        assert bm.fit_line([1.0], [2.0]) is None

    def test_mixed_dtypes_also_fit_per_dtype_and_failed_runs_are_left_out(self):
        ms = [
            _m(100, 1100),
            _m(200, 2100),
            _m(1000, 5000, dtype="bfloat16"),
            _m(300, 0, error="exit 1"),
        ]
        f = bm.fits(ms)
        assert f["float32"]["bytes_per_param"] == pytest.approx(10)
        assert f["float32"]["overhead_bytes"] == pytest.approx(100)
        assert f["all sizes"]["points"] == 3 and "bfloat16" not in f

    def test_plot_writes_a_png_with_an_empty_panel(self, tmp_path):
        sizes = [_m(135_000_000, 2**31), _m(360_000_000, 3 * 2**30)]
        lengths = [_m(135_000_000, 2**31, L=n, steps=[5.0, n / 10]) for n in (16, 32)]
        out = tmp_path / "docs" / "mem.png"
        bm.plot(out, sizes, lengths, [], bm.fits(sizes)["all sizes"])
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_table_prints_ratios_against_the_first_run(self, capsys):
        rows = [_m(100, 1000, steps=[3.0, 1.0]), _m(100, 1500, steps=[3.0, 2.5])]
        bm.print_table("t", rows, rows[0], swap_on=False)
        last = capsys.readouterr().out.splitlines()[-1]
        assert last.split()[-2:] == ["1.50", "2.50"] and " n/a " in last

    def test_json_results_report_again_without_running(self, tmp_path, capsys):
        from dataclasses import asdict

        sizes = [_m(100_000_000, 2 * 10**9), _m(300_000_000, 5 * 10**9)]
        results = {
            "sizes": [asdict(m) | {"bytes_per_param": m.bytes_per_param} for m in sizes],
            "lengths": [],
            "groups": [],
            "swap_configured": True,
        }
        bm.report(json.loads(json.dumps(results)), tmp_path / "p.png")
        out = capsys.readouterr().out
        assert "fit over all sizes (2 points, float32): peak RSS = 15.00 B/param" in out
        assert (tmp_path / "p.png").is_file()
