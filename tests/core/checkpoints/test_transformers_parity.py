"""What `--to hf` writes is what the trainer computed: for every family, a tiny
random model converted HF -> trainer -> HF loads in ``transformers`` and gives the
trainer's (Tunix's) next-token logits and greedy completion.

This is also the check that rlctl's Qwen3 and Gemma 3 are the models transformers
runs: a wrong norm offset, embedding scale, rope base or attention scale shows up
as different logits here. torch (CPU) comes with the ``test`` extra only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

# builds a model, compiles or trains: out of the fast loop (tests/test_marks.py)
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tunix")

from rlctl.core.checkpoints.convert import convert  # noqa: E402
from tests.fakes.tiny_model import FAMILIES, write_tiny_model  # noqa: E402

PROMPT = "Tom has 5 apples and gets 2 more. How many"


def jax_logits(model, ids: list[int]) -> np.ndarray:
    import jax.numpy as jnp

    n = len(ids)
    tokens = jnp.asarray([ids], jnp.int32)
    positions = jnp.arange(n)[None]
    mask = jnp.tril(jnp.ones((1, n, n), jnp.bool_))
    logits, _ = model(tokens, positions, None, mask)
    return np.asarray(logits[0], np.float32)


def hf_model(folder: Path):
    m = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return m.eval()


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def prompt_ids(folder: Path) -> list[int]:
    from rlctl.core.trainer.model.tokenizer import ChatTokenizer

    return ChatTokenizer(folder).encode(PROMPT)


def trainer_greedy(model, info, folder: Path, n: int) -> list[int]:
    """Greedy tokens from rlctl's rollout path (its sampler, as the trainer runs it)."""
    from rlctl.core.trainer.model.tokenizer import ChatTokenizer
    from rlctl.core.trainer.rollout.sampler import Sampler, left_pad

    tok = ChatTokenizer(folder)
    sampler = Sampler(model, info, pad_id=tok.pad_id(), eos_ids=[], max_new_tokens=n)
    out = sampler(
        left_pad([tok.encode(PROMPT)], 32, tok.pad_id()), group=1, seed=0, temperature=0.0
    )
    return [int(t) for t in out.tokens[0]]


def hf_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt_ids) :]]


def assert_same_model(jax_model, info, hf_folder: Path, trainer_folder: Path) -> None:
    m = hf_model(hf_folder)
    ids = prompt_ids(hf_folder)
    ours, theirs = jax_logits(jax_model, ids), hf_logits(m, ids)
    np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-3)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    want = hf_greedy(m, ids, 8)
    assert trainer_greedy(jax_model, info, trainer_folder, 8) == want


@pytest.mark.trainer
@pytest.mark.parametrize("family", FAMILIES)
def test_exported_model_matches_the_trainers(tmp_path, family):
    from rlctl.core.trainer import tunix_adapter as ta

    src = write_tiny_model(tmp_path / "src", family, layers=2)
    convert(str(src), str(tmp_path / "trainer"), to="trainer")
    model, info = ta.load_model(tmp_path / "trainer")
    convert(str(tmp_path / "trainer"), str(tmp_path / "hf"), to="hf", verify=True)
    assert_same_model(model, info, tmp_path / "hf", tmp_path / "trainer")
