"""rlctl's sampler (prefill once per group, decode the group from the shared cache,
stop when every row has stopped) against the plain computation: one full forward
over prompt + completion, no cache. Greedy tokens are its argmax, log-probs its
log-softmax; Tunix's sampler decodes the same greedy tokens."""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("tunix")
pytestmark = pytest.mark.trainer

from tests.fakes.tiny_model import write_tiny_model  # noqa: E402

N = 10  # new tokens per completion
WIDTH = 16  # padded prompt width


class Setup:
    def __init__(self, folder):
        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.model.tokenizer import ChatTokenizer

        self.tok = ChatTokenizer(folder)
        self.model, self.info = ta.load_model(folder)
        self.pad = self.tok.pad_id()
        rng = np.random.default_rng(0)
        # two prompts of different lengths, left-padded into one batch
        self.rows = [list(rng.integers(3, self.info.vocab_size, n)) for n in (11, 6)]

    def sampler(self, max_new_tokens: int = N, eos_ids: tuple[int, ...] = ()):
        from rlctl.core.trainer.rollout.sampler import Sampler

        return Sampler(
            self.model,
            self.info,
            pad_id=self.pad,
            eos_ids=list(eos_ids),
            max_new_tokens=max_new_tokens,
        )

    def prompts(self, rows=None, width: int = WIDTH) -> np.ndarray:
        from rlctl.core.trainer.rollout.sampler import left_pad

        return left_pad(rows or self.rows, width, self.pad)

    def full_logits(self, prompt: list[int], completion: list[int]) -> np.ndarray:
        """Logits after each token of prompt + completion: one forward, no cache."""
        import jax.numpy as jnp

        from rlctl.core.trainer import tunix_adapter as ta

        seq = jnp.asarray([prompt + completion], jnp.int32)
        n = seq.shape[1]
        hidden, _ = ta.trunk(
            self.model, seq, jnp.arange(n)[None], None, jnp.tril(jnp.ones((n, n), jnp.bool_))[None]
        )
        logits = ta.softcapped(hidden[0] @ ta.head_weight(self.model), self.info.logit_softcap)
        return np.asarray(logits, np.float32)

    def completion_logits(self, row: int, tokens: np.ndarray) -> np.ndarray:
        """[N, V]: the logits that predicted each completion token of prompt ``row``."""
        prompt = self.rows[row]
        logits = self.full_logits(prompt, [int(t) for t in tokens[:-1]])
        return logits[len(prompt) - 1 :]


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3_text", "gemma4_text"])
def setup(request, tmp_path_factory) -> Setup:
    return Setup(write_tiny_model(tmp_path_factory.mktemp("m") / request.param, request.param))


@pytest.fixture(scope="module")
def llama(tiny_model_dir) -> Setup:
    return Setup(tiny_model_dir)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


class TestAgainstThePlainComputation:
    def test_greedy_tokens_are_the_argmax_of_a_full_forward(self, setup):
        out = setup.sampler()(setup.prompts(), group=1, seed=0, temperature=0.0)
        for row in range(2):
            want = setup.completion_logits(row, out.tokens[row]).argmax(-1)
            np.testing.assert_array_equal(out.tokens[row], want)

    def test_log_probs_equal_a_full_forward_and_the_update(self, setup):
        """Sampled at temperature 0.7, three per prompt: each token's log-prob is the
        full forward's, and the update's prefix-shared one (``shared_prefix_logps``)."""
        from rlctl.core.trainer import tunix_adapter as ta

        G, T = 3, 0.7
        out = setup.sampler()(setup.prompts(), group=G, seed=5, temperature=T)
        for i in range(2 * G):
            logits = setup.completion_logits(i // G, out.tokens[i])
            want = np.take_along_axis(log_softmax(logits / T), out.tokens[i][:, None], -1)
            np.testing.assert_allclose(out.logps[i], want[:, 0], atol=2e-5)
        update, _ = ta.shared_prefix_logps(
            setup.model,
            setup.prompts(),
            out.tokens,
            group=G,
            pad_id=setup.pad,
            temperature=T,
            info=setup.info,
        )
        np.testing.assert_allclose(out.logps, np.asarray(update), atol=2e-5)

    def test_prompts_of_different_lengths_decode_as_each_alone(self, setup):
        """Left padding changes nothing: positions count real tokens, pads are masked."""
        sampler = setup.sampler()
        both = sampler(setup.prompts(), group=1, seed=0, temperature=0.0)
        for row, prompt in enumerate(setup.rows):
            alone = sampler(
                setup.prompts([prompt], width=len(prompt)), group=1, seed=0, temperature=0.0
            )
            np.testing.assert_array_equal(both.tokens[row], alone.tokens[0])

    def test_greedy_tokens_equal_tunix_sampler(self, llama):
        from tests.core.trainer.yardsticks import tunix_generate, tunix_sampler

        texts = [
            llama.tok.apply_chat_template([{"role": "user", "content": q}])
            for q in ("What is 4 + 3?", "Tom has 5 apples and gets 2 more?")
        ]
        rows = [llama.tok.encode(t) for t in texts]
        width = max(map(len, rows))
        theirs = tunix_generate(
            tunix_sampler(llama.model, llama.tok, llama.info, cache_size=width + N),
            texts,
            max_new_tokens=N,
            max_prompt_tokens=width,
            eos_ids=[llama.pad],
            temperature=None,
            top_p=None,
            top_k=None,
            seed=0,
        )
        ours = llama.sampler()(llama.prompts(rows, width), group=1, seed=0, temperature=0.0)
        for row in range(2):
            assert list(ours.tokens[row]) == [int(t) for t in theirs.tokens[row]]


class TestEarlyStop:
    def test_decoding_stops_when_every_row_has_stopped(self, llama):
        free = llama.sampler()(llama.prompts(), group=2, seed=0, temperature=0.0)
        assert free.steps == N - 1  # the first token comes from the prefill
        assert (free.lengths == N).all()

        # stop on the 4th token of each prompt's greedy completion
        stops = tuple(sorted({int(t) for t in free.tokens[:, 3]}))
        out = llama.sampler(eos_ids=stops)(llama.prompts(), group=2, seed=0, temperature=0.0)
        assert (out.lengths <= 3).all()
        assert out.steps == out.lengths.max() < N - 1
        for row, n in enumerate(out.lengths):
            np.testing.assert_array_equal(out.tokens[row, : n + 1], free.tokens[row, : n + 1])
            assert (out.tokens[row, n + 1 :] == llama.pad).all()
            assert (out.logps[row, n + 1 :] == 0).all()


class TestSeeds:
    def test_the_same_seed_draws_the_same_samples_and_another_seed_others(self, llama):
        sampler = llama.sampler()

        def draw(seed: int) -> np.ndarray:
            return sampler(llama.prompts(), group=4, seed=seed, temperature=1.0).tokens

        first = draw(7)
        np.testing.assert_array_equal(first, draw(7))
        assert (first != draw(8)).any()
        assert len({tuple(r) for r in first[:4]}) > 1, "a group's completions were all equal"


class TestSamplingParameters:
    def test_top_k_1_and_a_tiny_top_p_are_greedy(self, llama):
        sampler = llama.sampler()
        greedy = sampler(llama.prompts(), group=2, seed=0, temperature=0.0).tokens
        for top_k, top_p in ((1, 1.0), (None, 1e-6)):
            out = sampler(
                llama.prompts(), group=2, seed=3, temperature=1.0, top_k=top_k, top_p=top_p
            )
            np.testing.assert_array_equal(out.tokens, greedy)

    def test_top_k_and_top_p_keep_to_their_candidates(self, llama):
        sampler = llama.sampler()
        k = 3
        out = sampler(llama.prompts(), group=4, seed=1, temperature=1.0, top_k=k)
        p = 0.05  # the top token alone or a few: those that reach 5% of the mass
        nucleus = sampler(llama.prompts(), group=4, seed=1, temperature=1.0, top_p=p)
        for i in range(8):
            logits = llama.completion_logits(i // 4, out.tokens[i])
            ranks = (logits > np.take_along_axis(logits, out.tokens[i][:, None], -1)).sum(-1)
            assert (ranks < k).all()
            logits = llama.completion_logits(i // 4, nucleus.tokens[i])
            probs = np.exp(log_softmax(logits))
            chosen = np.take_along_axis(probs, nucleus.tokens[i][:, None], -1)
            before = np.where(probs > chosen, probs, 0).sum(-1)  # mass ranked above it
            assert (before <= p + 1e-6).all()

    def test_first_tokens_follow_the_tempered_softmax(self, llama):
        """4000 draws of one token: each frequency within 4.5 sigma of its probability."""
        T, n = 0.02, 4000  # a random tiny model is nearly flat: sharpen it
        out = llama.sampler(max_new_tokens=1)(
            llama.prompts(llama.rows[:1]), group=n, seed=4, temperature=T
        )
        probs = np.exp(log_softmax(llama.full_logits(llama.rows[0], [])[-1] / T))
        counts = np.bincount(out.tokens[:, 0], minlength=probs.size) / n
        sigma = np.sqrt(probs * (1 - probs) / n)
        assert (np.abs(counts - probs) <= 4.5 * sigma + 1e-3).all()
        assert probs.max() < 0.9 and (counts > 0).sum() > 3  # not a greedy test in disguise

    def test_a_high_temperature_flattens_the_samples(self, llama):
        sampler = llama.sampler()

        def distinct(temperature: float) -> int:
            out = sampler(llama.prompts(), group=8, seed=2, temperature=temperature)
            return len(set(out.tokens.ravel().tolist()))

        assert distinct(0.05) < distinct(5.0)

    def test_sampling_settings_share_one_compiled_program(self, llama):
        """Greedy, plain, top-k and top-p are traced values: no program per setting."""
        from rlctl.core.trainer.rollout.sampler import sample_groups

        sampler = llama.sampler()
        sampler(llama.prompts(), group=2, seed=0, temperature=0.0)
        before = sample_groups._cache_size()
        for temperature, top_p, top_k in ((1.0, 1.0, None), (0.7, 0.9, None), (1.3, 1.0, 5)):
            sampler(
                llama.prompts(), group=2, seed=1, temperature=temperature, top_p=top_p, top_k=top_k
            )
        assert sample_groups._cache_size() == before

    @pytest.mark.parametrize("row", ["cpu", "gpu"])
    def test_a_precompiled_program_is_the_one_the_calls_run(self, llama, row):
        """What an accelerator's trainer compiles before the first step (its memory read
        then) is what the rollout and the eval run: the same tokens, no other compile,
        the rows laid out as the call lays them (the GPU row prefills every row)."""
        from rlctl.core.trainer.rollout.sampler import Sampler, sample_groups
        from rlctl.core.trainer.runtime.numerics import TABLE

        prompts = llama.prompts()

        def make() -> Sampler:
            return Sampler(
                llama.model,
                llama.info,
                pad_id=llama.pad,
                eos_ids=[],
                max_new_tokens=N + 1,  # a program no other test compiled
                numerics=TABLE[row],
            )

        sampler = make()
        compiled = sampler.precompile(len(prompts), prompts.shape[1], 2)
        assert compiled.memory_analysis().temp_size_in_bytes > 0
        before = sample_groups._cache_size()
        out = sampler(prompts, group=2, seed=3, temperature=1.0)
        assert sample_groups._cache_size() == before  # the precompiled one ran
        plain = make()(prompts, group=2, seed=3, temperature=1.0)
        assert sample_groups._cache_size() == before + 1  # jit's own, compiled now
        np.testing.assert_array_equal(out.tokens, plain.tokens)
        assert sampler.precompile(len(prompts), prompts.shape[1], 2) is compiled

    def test_a_run_that_never_filters_compiles_no_sort(self, llama):
        """rollout.top_p 1 and no top_k (the default): the sampler's program holds no
        top-p/top-k branch (a sort over the vocabulary, the costliest part of its
        compile for a GPU), and refuses a call that asks for one."""
        from rlctl.core.config.models import RolloutSpec
        from rlctl.core.trainer.rollout.sampler import Sampler, filters

        assert not filters(RolloutSpec()) and filters(RolloutSpec(top_p=0.9))
        assert filters(RolloutSpec(top_k=5))

        def text(filtering: bool) -> str:
            s = Sampler(
                llama.model,
                llama.info,
                pad_id=llama.pad,
                eos_ids=[],
                max_new_tokens=N,
                filtering=filtering,
            )
            return s.precompile(2, WIDTH, 2).as_text()

        sort = re.compile(r" sort\(")  # the operation (the test's own name is in metadata)
        assert sort.search(text(True)) and not sort.search(text(False))
        plain = Sampler(
            llama.model,
            llama.info,
            pad_id=llama.pad,
            eos_ids=[],
            max_new_tokens=N,
            filtering=False,
        )
        with pytest.raises(ValueError, match="without top-p/top-k"):
            plain(llama.prompts(), group=2, seed=0, temperature=1.0, top_p=0.5)


class TestWeightsFirstDecode:
    """Llama's decode step with its weights laid out for a few rows
    (``tunix_adapter.llama.decode``) against Tunix's own layers, in the same program."""

    def _both(self, llama, group: int, temperature: float):
        import jax

        from rlctl.core.trainer.rollout.sampler import sample_groups

        s = llama.sampler()
        kw = dict(info=s.info, group=group, max_new_tokens=N, pad_id=s.pad_id, eos_ids=s.eos_ids)
        args = (
            s.graphdef,
            s.state,
            llama.prompts(),
            np.uint32(7),
            np.float32(temperature),
            np.float32(1.0),
            np.int32(0),
        )
        return (
            jax.device_get(sample_groups(*args, **kw, weights_first=True)),
            jax.device_get(sample_groups(*args, **kw, weights_first=False)),
        )

    @pytest.mark.parametrize("temperature", [0.0, 1.0])
    def test_it_draws_the_tokens_and_log_probs_of_tunix_layers(self, llama, temperature):
        fast, layers = self._both(llama, group=4, temperature=temperature)
        np.testing.assert_array_equal(fast[0], layers[0])
        np.testing.assert_allclose(fast[1], layers[1], atol=2e-5)
        assert int(fast[2]) == int(layers[2])

    def test_it_is_used_for_plain_llama_alone(self, llama, tmp_path):
        """LoRA adds to each projection's output, which fused weights would skip, and
        the other families' layers differ: they decode through Tunix's layers."""
        from types import SimpleNamespace

        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.tunix_adapter.llama import decode
        from rlctl.core.trainer.tunix_adapter.lora import apply_lora

        assert decode.fits(llama.model, llama.info)
        qwen, info = ta.load_model(write_tiny_model(tmp_path / "q", "qwen3"))
        assert not decode.fits(qwen, info)
        _, plain = ta.load_model(write_tiny_model(tmp_path / "l", "llama"))
        lora = apply_lora(
            ta.load_model(tmp_path / "l")[0],
            "llama",
            SimpleNamespace(lora_rank=4, lora_alpha=8.0, lora_target_modules=["q_proj", "v_proj"]),
        )
        assert not decode.fits(lora, plain)


class TestDraw:
    """``sampler._draw``: the CDF inverted in two levels (blocks, then one block)."""

    V = 1000  # four blocks of 256, the last one short

    def draws(self, logits: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
        from rlctl.core.trainer.rollout.sampler import _draw

        rows = jax.numpy.asarray(np.repeat(logits[None].astype(np.float32), n, 0))
        keys = jax.random.split(jax.random.PRNGKey(seed), 4)
        return np.concatenate([np.asarray(_draw(k, rows)) for k in keys])

    def test_tokens_follow_the_softmax_across_blocks(self):
        rng = np.random.default_rng(0)
        logits = np.full(self.V, -1e9, np.float32)
        picked = [0, 255, 256, 511, 700, 999]  # both ends of blocks, the short last one
        logits[picked] = rng.normal(size=len(picked))
        out = self.draws(logits, 2000)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        counts = np.bincount(out, minlength=self.V) / out.size
        sigma = np.sqrt(probs * (1 - probs) / out.size)
        assert (np.abs(counts - probs) <= 4.5 * sigma + 1e-3).all()
        assert set(np.unique(out)) == set(picked)

    @pytest.mark.parametrize("kept", [[3], [255], [256], [999], [0, 999], [510, 511]])
    def test_a_masked_token_is_never_drawn(self, kept):
        """Whole blocks at -inf, before and after the kept tokens, and a kept token
        at a block's last entry: rounding between the two sums never lands past it."""
        logits = np.full(self.V, -np.inf, np.float32)
        logits[kept] = 0.0
        out = self.draws(logits, 500, seed=len(kept) + kept[0])
        assert set(np.unique(out)) <= set(kept)

    def test_one_token_of_all_the_mass_is_drawn_always(self):
        logits = np.full(self.V, -30.0, np.float32)
        logits[767] = 30.0  # the last entry of the third block
        assert (self.draws(logits, 200) == 767).all()
