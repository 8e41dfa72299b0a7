"""A batch that fits: chunked log-softmax and micro-batches give the whole batch's
numbers, and a batch that cannot fit is one line, not an allocator dump."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tunix")
pytestmark = pytest.mark.trainer

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


class TestChunkedLogSoftmax:
    @pytest.fixture(scope="class")
    def inputs(self):
        rng = np.random.default_rng(0)
        hidden = jnp.asarray(rng.normal(size=(3, 7, 16)), jnp.float32)
        w = jnp.asarray(rng.normal(size=(16, 50)) * 0.3, jnp.float32)
        targets = jnp.asarray(rng.integers(0, 50, (3, 7)), jnp.int32)
        coef = jnp.asarray(rng.normal(size=(3, 7)), jnp.float32)
        return hidden, w, targets, coef

    @pytest.mark.parametrize("chunk", [1, 5, 16])  # 21 tokens: uneven, padded chunks
    def test_chunks_give_the_whole_batch_log_probs_entropy_and_gradients(self, inputs, chunk):
        from rlctl.core.trainer.tunix_adapter import token_logps

        hidden, w, targets, coef = inputs

        def loss(h, w, chunk):
            return (token_logps(h, targets, w, 0.7, chunk)[0] * coef).sum()

        whole_lp, whole_ent = token_logps(hidden, targets, w, 0.7, chunk=10_000)
        lp, ent = token_logps(hidden, targets, w, 0.7, chunk=chunk)
        np.testing.assert_allclose(lp, whole_lp, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ent, whole_ent, rtol=1e-5, atol=1e-5)
        want = jax.grad(loss, argnums=(0, 1))(hidden, w, 10_000)
        got = jax.grad(loss, argnums=(0, 1))(hidden, w, chunk)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

    def test_the_plain_log_softmax_is_what_it_computes(self, inputs):
        from rlctl.core.trainer.tunix_adapter import token_logps

        hidden, w, targets, _ = inputs
        logp_all = jax.nn.log_softmax((hidden @ w) / 0.7, axis=-1)
        want = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
        entropy = -(jnp.exp(logp_all) * logp_all).sum(-1)
        lp, ent = token_logps(hidden, targets, w, 0.7, chunk=4)
        np.testing.assert_allclose(lp, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ent, entropy, rtol=1e-5, atol=1e-5)

    def test_chunks_hold_less_memory_in_the_backward_pass(self):
        """XLA's own memory analysis: the gradient of 4096 tokens x 32k vocabulary
        needs the whole [4096, 32768] logits unchunked, a chunk of them chunked."""
        from rlctl.core.trainer.tunix_adapter import token_logps

        hidden = jax.ShapeDtypeStruct((8, 512, 64), jnp.float32)
        w = jax.ShapeDtypeStruct((64, 32768), jnp.float32)
        targets = jax.ShapeDtypeStruct((8, 512), jnp.int32)

        def temp_bytes(chunk: int) -> int:
            grad = jax.grad(
                lambda h, w, t: token_logps(h, t, w, 1.0, chunk)[0].sum(), argnums=(0, 1)
            )
            return (
                jax.jit(grad)
                .lower(hidden, w, targets)
                .compile()
                .memory_analysis()
                .temp_size_in_bytes
            )

        whole, chunked = temp_bytes(4096), temp_bytes(256)
        logits = 4096 * 32768 * 4
        assert whole >= logits
        assert chunked < logits / 4, (whole, chunked)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from rlctl.core.trainer import tunix_adapter as ta

    model, info = ta.load_model(tiny_model_dir)
    return model, info


def make_batch(
    info,
    prompts: int = 2,
    group: int = 4,
    seed: int = 0,
    logps: bool = False,
    lengths: tuple[int, int] = (6, 5),
):
    from rlctl.core.trainer.rollout.rollout import Batch

    rng = np.random.default_rng(seed)
    p = rng.integers(3, info.vocab_size, (prompts, lengths[0])).astype(np.int32)
    p[0, :2] = 0  # left padding
    c = rng.integers(3, info.vocab_size, (prompts * group, lengths[1])).astype(np.int32)
    c[1, 3:] = 0  # a short completion
    c[-1, 1:] = 0
    mask = (c != 0).astype(np.int32)
    extra = {}
    if logps:
        extra = {
            "ref_logps": rng.normal(-3, 0.3, c.shape).astype(np.float32),
            "old_logps": rng.normal(-3, 0.3, c.shape).astype(np.float32),
        }
    return Batch(
        prompt_ids=p,
        completion_ids=c,
        mask=mask,
        advantages=rng.normal(size=len(c)).astype(np.float32),
        **extra,
    )


def spec(**training):
    from rlctl.core.config.models import RunSpec

    return RunSpec(
        algorithm=training.pop("algorithm", "grpo"),
        rollout={"num_generations": 4, "temperature": 0.9},
        training={"prompts_per_step": 2, **training},
    )


class TestMicroBatches:
    # each size (whole groups, halves, single sequences) and each loss form once, and the
    # plain GRPO on single sequences too: every pair of the 3 x 3 grid compiles the same
    # two programs, about 30 s each here (the whole grid was 4.5 minutes of CI)
    @pytest.mark.parametrize(
        ("size", "algorithm", "extra"),
        [
            (4, "grpo", {}),
            (2, "grpo", {"beta": 0.04, "loss_aggregation": "token-mean"}),
            (1, "gspo", {"loss_aggregation": "sequence-mean-token-sum"}),
            (1, "grpo", {}),
        ],
    )
    def test_micro_batches_give_the_whole_batch_loss_and_gradients(
        self, tiny, algorithm, extra, size
    ):
        from rlctl.core.trainer.update.step import Update

        model, info = tiny
        batch = make_batch(info, logps=bool(extra))
        update = Update(spec(algorithm=algorithm, **extra), pad_id=0, info=info)
        (loss, aux), grads = update.loss_and_grads(model, batch, size=8)
        (mloss, maux), mgrads = update.loss_and_grads(model, batch, size=size)
        assert float(mloss) == pytest.approx(float(loss), rel=1e-5, abs=1e-6)
        for key in aux:
            assert float(maux[key]) == pytest.approx(float(aux[key]), rel=1e-5, abs=1e-6), key
        for a, b in zip(jax.tree.leaves(mgrads), jax.tree.leaves(grads), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))

    def test_a_size_that_splits_groups_unevenly_is_refused_with_the_valid_ones(self):
        from pydantic import ValidationError

        with pytest.raises(ValidationError, match=r"micro_batch_size=3 .* \(8, 4, 2, 1"):
            spec(micro_batch_size=3)
        assert spec(micro_batch_size=64).training.micro_batch_size == 64  # whole batch

    def test_the_default_splits_only_when_the_whole_batch_does_not_fit(self, tiny, monkeypatch):
        from rlctl.core.trainer.runtime import memory
        from rlctl.core.trainer.update.step import Update, make_optimizer

        model, info = tiny
        s = spec()
        batch = make_batch(info, lengths=(32, 256))  # activations outweigh the gradients
        opt = make_optimizer(model, s.training)
        sizes = {}
        for size in (8, 4):
            u = Update(
                s.model_copy(
                    update={"training": s.training.model_copy(update={"micro_batch_size": size})}
                ),
                pad_id=0,
                info=info,
            )
            sizes[size] = memory.compiled_need(u.program(model, opt, batch)[0])
        assert sizes[4] < sizes[8], sizes
        monkeypatch.setenv(memory.LIMIT_ENV, str((sizes[4] + sizes[8]) // 2))
        said: list[str] = []
        update = Update(s, pad_id=0, info=info, warn=said.append)
        _, size = update.program(model, opt, batch)
        assert size == 4
        # why the first program was set aside, then what the run uses
        assert said[0].startswith("the update with ") and "compiling a lighter one" in said[0]
        assert "micro-batches of 4" in said[-1]
        monkeypatch.setenv(memory.LIMIT_ENV, "1GB")
        assert Update(s, pad_id=0, info=info).program(model, opt, batch)[1] == 8


class TestRemat:
    """training.remat: each layer's activations recomputed in the backward pass."""

    def test_same_loss_and_gradients_with_and_without(self, tiny):
        from rlctl.core.trainer.update.step import Update

        model, info = tiny
        batch = make_batch(info, logps=True)
        (loss, aux), grads = Update(
            spec(remat=False, beta=0.04), pad_id=0, info=info
        ).loss_and_grads(model, batch, size=8)
        (rloss, raux), rgrads = Update(
            spec(remat=True, beta=0.04), pad_id=0, info=info
        ).loss_and_grads(model, batch, size=4)
        assert float(rloss) == pytest.approx(float(loss), rel=1e-5, abs=1e-6)
        assert float(raux["kl"]) == pytest.approx(float(aux["kl"]), rel=1e-5, abs=1e-6)
        for a, b in zip(jax.tree.leaves(rgrads), jax.tree.leaves(grads), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

    def test_the_update_keeps_a_fraction_of_the_activations(self, tmp_path):
        """XLA's memory analysis of the compiled update, 8 layers x 256 tokens: with
        remat its temporaries are a fraction of those without (the recomputation
        waits for the backward pass instead of being scheduled in the forward)."""
        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.update.step import Update, make_optimizer
        from tests.fakes.tiny_model import write_tiny_llama

        model, info = ta.load_model(write_tiny_llama(tmp_path / "deep", layers=8))
        batch = make_batch(info, lengths=(32, 256))
        need = {}
        for remat in (False, True):
            s = spec(remat=remat, micro_batch_size=8)
            u = Update(s, pad_id=0, info=info)
            need[remat] = memory_need(u.program(model, make_optimizer(model, s.training), batch)[0])
        assert need[True] < 0.5 * need[False], need


class TestSomeLayersRecomputed:
    """The CPU's default: the first layers recomputed, the rest keeping their
    activations (``logprobs.recomputed``, ``Update._remat_levels``)."""

    def test_same_loss_and_gradients_as_none_recomputed(self, tiny):
        from rlctl.core.trainer.update.step import Update

        model, info = tiny
        assert info.num_layers >= 2
        batch = make_batch(info, logps=True)
        (loss, _), grads = Update(spec(remat=False, beta=0.04), pad_id=0, info=info).loss_and_grads(
            model, batch, size=8
        )
        some = Update(spec(beta=0.04), pad_id=0, info=info)
        some.remat = 1  # the first layer recomputed, the others kept
        (sloss, _), sgrads = some.loss_and_grads(model, batch, size=8)
        assert float(sloss) == pytest.approx(float(loss), rel=1e-5, abs=1e-6)
        for a, b in zip(jax.tree.leaves(sgrads), jax.tree.leaves(grads), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

    def test_the_count_is_clamped_and_true_is_every_layer(self):
        from rlctl.core.trainer.tunix_adapter.logprobs import recomputed

        assert [recomputed(r, 8) for r in (True, False, 0, 3, 8, 12, -1)] == [8, 0, 0, 3, 8, 8, 0]

    def test_the_cpu_default_tries_a_quarter_kept_then_all_recomputed(self, tiny):
        from rlctl.core.trainer.update.step import Update

        _, info = tiny
        assert jax.default_backend() == "cpu"
        u = Update(spec(), pad_id=0, info=info)
        n = info.num_layers
        assert u._remat_levels() == ([n - n // 4, True] if n >= 4 else [True])
        assert Update(spec(remat=False), pad_id=0, info=info)._remat_levels() == [False]
        assert Update(spec(remat=True), pad_id=0, info=info)._remat_levels() == [True]

    def test_kept_layers_cost_memory_and_what_does_not_fit_recomputes_all(
        self, tmp_path, monkeypatch
    ):
        """XLA's temporaries, 8 layers x 256 tokens: fewer layers recomputed, more
        memory; and a budget under the default's first try (6 of 8 recomputed) gets
        the update with every layer recomputed, still the whole batch."""
        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.runtime import memory
        from rlctl.core.trainer.update.step import Update, make_optimizer
        from tests.fakes.tiny_model import write_tiny_llama

        model, info = ta.load_model(write_tiny_llama(tmp_path / "deep", layers=8))
        batch = make_batch(info, lengths=(32, 256))
        need = {}
        for level in (True, 6, 2):
            u = Update(spec(micro_batch_size=8), pad_id=0, info=info)
            u.remat = level
            need[level] = memory_need(
                u.program(model, make_optimizer(model, spec().training), batch)[0]
            )
        assert need[True] < need[6] < need[2], need
        monkeypatch.setenv(memory.LIMIT_ENV, str((need[True] + need[6]) // 2))
        said: list[str] = []
        u = Update(spec(), pad_id=0, info=info, warn=said.append)
        compiled, size = u.program(model, make_optimizer(model, spec().training), batch)
        assert size == 8 and memory_need(compiled) == need[True]
        # the second compile is said, with why (#53: a LoRA run compiled twice silently)
        (line,) = said
        assert line.startswith("the update with 6 of 8 layers recomputed needs ")
        assert "allowed by RLCTL_MEMORY_LIMIT: compiling a lighter one" in line
        monkeypatch.setenv(memory.LIMIT_ENV, str(need[6] + 1))
        u = Update(spec(), pad_id=0, info=info)
        compiled, size = u.program(model, make_optimizer(model, spec().training), batch)
        assert size == 8 and memory_need(compiled) == need[6]


class TestLoraBudget:
    def test_a_lora_update_may_use_what_the_full_fine_tune_may(self, tiny_model_dir):
        """On a CPU the update's budget is the state it updates (at least 1 GiB). A LoRA
        state is the base and a few adapters, a third of a full fine-tune's (no
        moments for the base), yet its update reads the same base and keeps the same
        activations: measured against it, a LoRA default run's first program did not
        fit and a second one compiled (#53). The base's moments count."""
        from flax import nnx

        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.tunix_adapter.lora import apply_lora
        from rlctl.core.trainer.update.step import Update, make_optimizer, tree_bytes

        full_spec, lora_spec = spec(), spec(lora_rank=4)
        model, info = ta.load_model(tiny_model_dir)
        full = Update(full_spec, pad_id=0, info=info)
        full_opt = make_optimizer(model, full_spec.training)
        full_budget = full._budget_bytes(model, nnx.state((model, full_opt)))

        lora_model, _ = ta.load_model(tiny_model_dir)
        lora_model = apply_lora(lora_model, "llama", lora_spec.training)
        lora = Update(lora_spec, pad_id=0, info=info)
        lora_opt = make_optimizer(lora_model, lora_spec.training)
        state = nnx.state((lora_model, lora_opt))
        assert tree_bytes(state) < 0.5 * full_budget  # what it was measured against
        assert full_budget <= lora._budget_bytes(lora_model, state) < 1.2 * full_budget


def memory_need(compiled) -> int:
    from rlctl.core.trainer.runtime import memory

    return memory.compiled_need(compiled)


class TestOutOfMemory:
    def test_a_step_that_cannot_fit_exits_with_one_line(
        self, tiny_model_dir, tmp_path, monkeypatch
    ):
        from typer.testing import CliRunner

        from rlctl.cli.app import app
        from tests.core.trainer.test_train import tiny_args

        monkeypatch.setenv("RLCTL_MEMORY_LIMIT", "64KB")
        r = CliRunner().invoke(
            app,
            tiny_args(tiny_model_dir, tmp_path, "oom", "grpo", "--steps", "2", "--eval-size", "0"),
        )
        assert r.exit_code == 1, r.output
        err = [line for line in r.output.splitlines() if "Error" in line or "needs" in line]
        assert "Traceback" not in r.output
        assert any(
            "the update of 8 sequences" in line
            and "RLCTL_MEMORY_LIMIT" in line
            and "micro-batches of 1" in line
            for line in err
        ), r.output
        status = json.loads((tmp_path / "oom" / "status.json").read_text())
        assert status["phase"] == "failed"

    def test_an_allocator_failure_is_one_line_with_what_to_lower(self, tiny, monkeypatch):
        from rlctl.core.errors import OutOfMemoryError
        from rlctl.core.trainer.runtime import memory
        from rlctl.core.trainer.update.step import Update, make_optimizer

        model, info = tiny
        s = spec()
        update = Update(s, pad_id=0, info=info)

        def exhausted(*a, **k):
            raise jax.errors.JaxRuntimeError(
                "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 55.70GiB.\n"
                "BufferAssignment OOM Debugging.\n" + "allocation 0: size 1.2GiB\n" * 50
            )

        monkeypatch.setattr(update, "train_step", exhausted)
        monkeypatch.setenv(memory.LIMIT_ENV, "80GB")
        with pytest.raises(OutOfMemoryError) as e:
            update.apply(model, make_optimizer(model, s.training), None, make_batch(info), 1)
        text = str(e.value)
        assert "\n" not in text
        assert "asked for 55.70 GiB" in text and "80.00 GiB" in text
        assert "training.micro_batch_size" in text


class TestBudget:
    """What the update may allocate: on the CPU, no more than the state it updates."""

    @staticmethod
    def machine(monkeypatch, free: int, host: bool) -> None:
        from rlctl.core.trainer.runtime import memory

        monkeypatch.delenv(memory.LIMIT_ENV, raising=False)
        monkeypatch.setattr(
            memory,
            "device_memory",
            lambda: memory.DeviceMemory(
                free, 2 * free, "this machine" if host else "the GPU", False, host=host
            ),
        )

    def test_on_the_cpu_the_update_may_use_as_much_as_its_state(self, monkeypatch):
        from rlctl.core.trainer.runtime import memory

        self.machine(monkeypatch, free=20 * 2**30, host=True)
        have, where = memory.update_budget(state_bytes=3 * 2**30)
        assert have == 3 * 2**30
        assert "weights and optimizer state" in where

    def test_and_a_small_model_at_least_the_floor(self, monkeypatch):
        from rlctl.core.trainer.runtime import memory

        self.machine(monkeypatch, free=20 * 2**30, host=True)
        assert memory.update_budget(state_bytes=2**20)[0] == memory.HOST_FLOOR

    def test_what_is_free_when_that_is_less_than_the_state(self, monkeypatch):
        from rlctl.core.trainer.runtime import memory

        self.machine(monkeypatch, free=2 * 2**30, host=True)
        assert memory.update_budget(state_bytes=3 * 2**30) == (
            2 * 2**30,
            "the update may use (what is free on this machine)",
        )

    def test_an_accelerator_gives_the_update_half_its_free_memory(self, monkeypatch):
        from rlctl.core.trainer.runtime import memory

        self.machine(monkeypatch, free=20 * 2**30, host=False)
        assert memory.update_budget(state_bytes=3 * 2**30)[0] == 10 * 2**30

    def test_the_limit_wins(self, monkeypatch):
        from rlctl.core.trainer.runtime import memory

        monkeypatch.setenv(memory.LIMIT_ENV, "8GB")
        assert memory.update_budget(state_bytes=2**30) == (
            8 * 2**30,
            f"allowed by {memory.LIMIT_ENV}",
        )  # binary units

    def test_freed_memory_can_be_returned_at_any_time(self):
        from rlctl.core.trainer.runtime import memory

        assert memory.return_freed_memory() is None  # a no-op where glibc is absent


def test_the_trainer_imports_none_of_tunix_learners_nor_torch():
    """Tunix's package __init__ imports its learners (and through them torch and pandas,
    320 MB and 3.5 s), and tensorboardX imports torch: rlctl's imports skip both."""
    import subprocess
    import sys

    code = (
        "import sys; from rlctl.core.trainer import tunix_adapter; "
        "from rlctl.core.trainer.run import loop, metrics; "
        "import tunix.generate.sampler, tunix.models.llama3.model, tunix.models.qwen3.model;"
        "metrics.summary_writer();"
        "print(sorted(m for m in ('torch', 'pandas', 'tunix.rl', "
        "'tunix.sft', 'tunix.distillation') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_need_of_smaller_micro_batches_is_predicted_from_one_compile():
    """Measured on SmolLM2-135M (2 x 8 x (112 + 48)): the whole batch needed 2.32 GiB,
    micro-batches of 8 and 4 needed 1.68 and 1.29 GiB (0.5 GiB of gradients)."""
    from rlctl.core.trainer.runtime.memory import predicted_need

    gib = 2**30
    whole, grads = int(2.32 * gib), gib // 2
    assert 1.6 * gib < predicted_need(16, whole, 8, grads) < 2.0 * gib
    assert 1.2 * gib < predicted_need(16, whole, 4, grads) < 1.5 * gib


def test_the_device_peak_is_none_on_a_cpu_and_never_falls_elsewhere(monkeypatch):
    """On the CPU (this machine) JAX keeps no allocator statistics: no figure. On a
    GPU, ``Device.memory_stats()`` (jaxlib's PJRT client: ``bytes_in_use``,
    ``peak_bytes_in_use``, ``bytes_limit``) is read after each step; a peak of 0 (as
    the H200 bench's probe read at exit) falls back to what is in use, and the figure
    is the largest seen."""
    import jax

    from rlctl.core.trainer.runtime.memory import DevicePeak

    assert DevicePeak().read() is None

    class Gpu:  # the statistics a CUDA device's client reports, in turn
        platform = "gpu"
        reads = iter(
            [
                {"bytes_in_use": 5, "peak_bytes_in_use": 0},
                {"bytes_in_use": 6, "peak_bytes_in_use": 9},
                {"bytes_in_use": 2, "peak_bytes_in_use": 4},
            ]
        )

        def memory_stats(self):
            return next(self.reads)

    monkeypatch.setattr(jax, "local_devices", lambda: [Gpu()])
    peak = DevicePeak()
    assert [peak.read(), peak.read(), peak.read()] == [5, 9, 9]
