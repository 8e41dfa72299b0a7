"""Partial saves do not survive: a killed or interrupted Orbax save leaves a
``<step>.orbax-checkpoint-tmp...`` folder that is removed on close and on the next start."""

from __future__ import annotations

import logging

import pytest

from rlctl.core.store.base import MANIFEST
from rlctl.core.store.manifest import verify
from rlctl.core.trainer.checkpoint.checkpointing import remove_partial

# builds a model, compiles or trains: out of the fast loop (tests/test_marks.py)
pytestmark = pytest.mark.slow


def test_only_the_temporary_folders_of_unfinished_saves_are_removed(tmp_path):
    (tmp_path / "2" / "default").mkdir(parents=True)
    (tmp_path / "4.orbax-checkpoint-tmp-1700000000" / "default").mkdir(parents=True)
    (tmp_path / "4.orbax-checkpoint-tmp-1700000000" / "default" / "x").write_bytes(b"0" * 99)
    (tmp_path / "6.orbax-checkpoint-tmp").write_text("")
    assert remove_partial(tmp_path) == [
        "4.orbax-checkpoint-tmp-1700000000",
        "6.orbax-checkpoint-tmp",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["2"]
    assert remove_partial(tmp_path / "missing") == []


class TestManifest:
    """Each complete checkpoint records its files' sizes and SHA-256, written last."""

    def folder(self, tmp_path):
        from rlctl.core.store.manifest import write_manifest

        step = tmp_path / "4"
        (step / "default").mkdir(parents=True)
        (step / "default" / "params").write_bytes(bytes(range(256)) * 40)
        (step / "_CHECKPOINT_METADATA").write_text('{"step": 4}')
        assert write_manifest(step) == 256 * 40 + len('{"step": 4}')
        return step

    def test_an_intact_checkpoint_verifies(self, tmp_path):
        from rlctl.core.store.manifest import verify

        assert verify(self.folder(tmp_path)) is None
        older = tmp_path / "older"  # an older rlctl's, without a manifest: trusted
        (older / "default").mkdir(parents=True)
        (older / "_CHECKPOINT_METADATA").write_text('{"step": 2}')
        assert verify(older) is None

    def test_an_empty_or_foreign_folder_without_a_manifest_is_damaged(self, tmp_path):
        """An empty ``checkpoints/2`` used to be trusted; restoring it failed and took
        the intact checkpoint 1 down with it."""
        (tmp_path / "2").mkdir()
        assert verify(tmp_path / "2") == "its folder is empty"
        (tmp_path / "3").mkdir()
        (tmp_path / "3" / "notes.txt").write_text("x")
        assert verify(tmp_path / "3") == "it has no _CHECKPOINT_METADATA"

    @pytest.mark.parametrize(
        ("damage", "why"),
        [
            (lambda s: (s / "default" / "params").write_bytes(b"cut"), "has 3 bytes, not 10240"),
            (
                lambda s: (s / "_CHECKPOINT_METADATA").write_text('{"step": 5}'),
                "does not match its recorded SHA-256",
            ),
            (lambda s: (s / "_CHECKPOINT_METADATA").write_text(""), "has 0 bytes"),
            (lambda s: (s / "default" / "params").unlink(), "default/params is missing"),
            (
                lambda s: (s / "rlctl-manifest.json").write_bytes(b"\xff"),
                "manifest.json is damaged",
            ),
        ],
        ids=["truncated", "changed", "emptied", "missing", "manifest"],
    )
    def test_each_kind_of_damage_is_named(self, tmp_path, damage, why):
        from rlctl.core.store.manifest import verify

        step = self.folder(tmp_path)
        damage(step)
        assert why in verify(step)


@pytest.mark.trainer
@pytest.mark.parametrize("manifest", ["kept", "removed"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(
    tiny_model_dir, tmp_path, monkeypatch, manifest
):
    """Checkpoint 4 truncated: resume warns, restores 2, and ends exactly as a run that
    was never interrupted. Without a manifest (an older rlctl's checkpoint) the damage
    shows only when Orbax reads it: the same fallback, one warning line instead of
    TensorStore's dozens. Either way step 4 is saved afresh, the damaged copy set aside."""
    from typer.testing import CliRunner

    from rlctl.cli.app import app
    from rlctl.core.trainer.run import loop
    from tests.core.trainer.test_train import ctrl_c_at, in_process, metrics, tiny_args

    common = ("--steps", "6", "--set", "checkpoint.interval=2", "--eval-size", "0")
    whole = in_process(tiny_model_dir, tmp_path, "whole", "grpo", *common)
    real_step = loop.Trainer.step
    ctrl_c_at(monkeypatch, 4)  # checkpoints 2 and 4 exist
    r = CliRunner().invoke(app, tiny_args(tiny_model_dir, tmp_path, "cut", "grpo", *common))
    assert r.exit_code == 130, r.output
    ckpt = tmp_path / "cut" / "checkpoints" / "4"
    biggest = max((p for p in ckpt.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
    if manifest == "removed":
        (ckpt / MANIFEST).unlink()
    monkeypatch.setattr(loop.Trainer, "step", real_step)
    r = CliRunner().invoke(app, ["resume", "cut", "--runs-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    if manifest == "kept":
        assert "checkpoint 4 is damaged" in r.stderr and "trying checkpoint 2" in r.stderr
    else:
        assert "checkpoint 4 could not be read" in r.stderr
        assert "trying the one before it" in r.stderr
    assert "Traceback" not in r.output and len(r.stderr) < 4000
    assert metrics(tmp_path / "cut") == whole
    folders = sorted(p.name for p in ckpt.parent.iterdir())
    assert "4.damaged" in folders and "4" in folders, folders
    assert verify(ckpt) is None  # saved again by the resumed run, not the damaged copy


def test_a_save_copies_a_bounded_part_of_the_state_at_once(tiny_model_dir, tmp_path):
    """Orbax holds at most ``in_flight`` bytes of host copies while saving; an array
    larger than that raises the limit to its size instead of stalling the save, and
    the checkpoint restores exactly."""
    import jax
    import numpy as np
    from flax import nnx

    from rlctl.core.config.models import TrainingSpec
    from rlctl.core.store.local import LocalRunDir
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.checkpoint import checkpointing
    from rlctl.core.trainer.runtime.distributed import current
    from rlctl.core.trainer.update.step import make_optimizer

    model, _ = ta.load_model(tiny_model_dir)
    optimizer = make_optimizer(model, TrainingSpec())
    run = LocalRunDir(tmp_path, "bounded")
    # an in-flight limit below the largest array, passed in as a run would
    ckpt = checkpointing.Checkpoints(run, current(), keep=2, in_flight=4096)
    saved = [np.asarray(x) for x in jax.tree.leaves(checkpointing._state(model, optimizer))]
    largest = max(x.nbytes for x in saved)
    assert largest > 4096
    ckpt.save(1, model, optimizer)
    assert ckpt._in_flight == largest + 2**20
    ckpt.close()
    fresh, _ = ta.load_model(tiny_model_dir)
    nnx.update(fresh, jax.tree.map(lambda x: x + 1, nnx.state(fresh, nnx.Param)))
    fresh_opt = make_optimizer(fresh, TrainingSpec())
    again = checkpointing.Checkpoints(run, current(), keep=2, in_flight=4096)
    assert again.restore_latest(fresh, fresh_opt) == 1
    again.close()
    for a, b in zip(saved, jax.tree.leaves(checkpointing._state(fresh, fresh_opt)), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))


class TestFailedReadNoise:
    """What a failed restore leaves behind is dropped, whatever form it arrives in
    (issue #25: thousands of lines; a CI run in four printed one more form); any
    other late error is still shown."""

    READ = ValueError(
        'DATA_LOSS: Error opening "cast" driver: Error opening "zarr" '
        'driver: Error reading "optimizer.step/.zarray" in OCDBT database'
    )

    @staticmethod
    def record(exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord(
            "asyncio",
            logging.ERROR,
            __file__,
            1,
            "Future exception was never retrieved\nfuture: %s",
            (f"<Future finished exception={exc!r}>",),
            (type(exc), exc, None),
        )

    # a chunk read past the end of a cut data file names only the OCDBT store (what
    # tests/faults' "no manifest, data cut" printed after its hint in a CI run)
    CUT = ValueError(
        'OUT_OF_RANGE: Error reading "model.lm_head.w/0.0" in OCDBT database '
        'at local file "/runs/ok/checkpoints/1/default/": Requested byte range '
        "[593085, 684056) is not valid for value of size 419417"
    )

    def test_an_unretrieved_read_without_a_traceback_is_dropped(self):
        from rlctl.core.trainer.checkpoint.checkpoint_noise import _UNRETRIEVED

        assert _UNRETRIEVED.filter(self.record(self.READ)) is False
        assert _UNRETRIEVED.filter(self.record(self.CUT)) is False
        assert _UNRETRIEVED.filter(self.record(ValueError("a user's own bug"))) is True

    def test_unraisables_of_reads_are_dropped_and_others_kept(self):
        from types import SimpleNamespace

        from rlctl.core.trainer.checkpoint.checkpoint_noise import restore_noise

        def info(exc, obj="<coroutine object _read_array_index_and_device_put>"):
            return SimpleNamespace(exc_value=exc, exc_traceback=None, object=obj)

        assert restore_noise(info(RuntimeError("Event loop is closed")))
        assert restore_noise(info(self.READ, obj=None))
        assert restore_noise(info(self.CUT, obj=None))
        assert not restore_noise(info(ValueError("a user's own bug"), obj="<function f>"))

    def test_orbax_reads_left_unawaited_are_not_warned_of_and_others_are(self):
        import warnings

        from rlctl.core.trainer.checkpoint.checkpoint_noise import QuietRestore

        quiet = QuietRestore()
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            quiet.install()
            quiet.remove()  # the warnings filter stays: these come at exit
            for name in (
                "_read_array_index_and_device_put",
                "_read_shard",
                "_read_and_create_array",
                "my_reward",
            ):
                warnings.warn(f"coroutine '{name}' was never awaited", RuntimeWarning, stacklevel=1)
        assert [str(w.message) for w in shown] == ["coroutine 'my_reward' was never awaited"]


class TestSpaceNeeded:
    """The free space asked for before a save: the real size plus a small margin."""

    def test_the_last_checkpoint_on_disk_decides_when_there_is_one(self):
        from rlctl.core.trainer.checkpoint.checkpoint_size import SLACK, space_needed

        # the figures: a 334 MB checkpoint of a state of 1.5 GB in memory
        assert space_needed(334 * 10**6, 1_500 * 10**6) == int(334e6 * 1.1) + SLACK
        assert space_needed(334 * 10**6, 1_500 * 10**6) < 400 * 10**6  # a 500 MB disk

    def test_the_first_save_is_judged_by_the_state(self):
        from rlctl.core.trainer.checkpoint.checkpoint_size import SLACK, space_needed

        assert space_needed(0, 10**9) == int(1.1e9) + SLACK
        assert space_needed(0, 0) == 0  # nothing to save, nothing to ask


def test_keep_counts_only_complete_checkpoints_and_never_touches_set_aside_ones(
    tmp_path, tiny_model_dir
):
    """keep=1 leaves the newest checkpoint alone; a ``<step>.damaged`` folder is not
    one of the kept, and is never deleted (it may be all a run has)."""
    from rlctl.core.config.models import TrainingSpec
    from rlctl.core.store.local import LocalRunDir
    from rlctl.core.trainer import tunix_adapter as ta
    from rlctl.core.trainer.checkpoint import checkpoint_size, checkpointing
    from rlctl.core.trainer.runtime.distributed import current
    from rlctl.core.trainer.update.step import make_optimizer

    model, _ = ta.load_model(tiny_model_dir)
    optimizer = make_optimizer(model, TrainingSpec())
    run = LocalRunDir(tmp_path, "kept")
    ckpt = checkpointing.Checkpoints(run, current(), keep=1)
    aside = tmp_path / "kept" / "checkpoints" / "3.damaged"  # set aside by an earlier start
    (aside / "default").mkdir(parents=True)
    (aside / "default" / "x").write_bytes(b"data")
    for step in (4, 5, 6):
        ckpt.save(step, model, optimizer)
        assert sorted(p.name for p in aside.parent.iterdir()) == ["3.damaged", str(step)]
    assert ckpt.latest == 6 and ckpt.latest_size == checkpoint_size.checkpoint_bytes(
        aside.parent / "6"
    )
    ckpt.close()
    assert (aside / "default" / "x").read_bytes() == b"data"


class TestFirstCheckpointEstimate:
    """#47: the first save's size is estimated from the state as Orbax writes it
    (zstd-compressed arrays), checked against a real Orbax save."""

    def _saved_bytes(self, tmp_path, state) -> int:
        import orbax.checkpoint as ocp

        with ocp.CheckpointManager(tmp_path / "c") as manager:
            manager.save(1, args=ocp.args.StandardSave(state))
            manager.wait_until_finished()
        return sum(p.stat().st_size for p in (tmp_path / "c" / "1").rglob("*") if p.is_file())

    def test_it_is_near_what_orbax_writes_for_every_kind_of_content(self, tmp_path):
        import jax.numpy as jnp
        import numpy as np

        from rlctl.core.trainer.checkpoint.checkpoint_size import estimate_bytes

        rng = np.random.default_rng(0)
        state = {
            "params": jnp.asarray(rng.normal(size=(512, 768)).astype(np.float32)),
            "moments": {
                "mu": jnp.zeros((512, 768), jnp.float32),  # before a gradient
                "nu": jnp.asarray(rng.normal(size=(300_000,)).astype(np.float32)),
            },
            "half": jnp.asarray(rng.normal(size=(256, 1024)), jnp.bfloat16),
            "steps": jnp.asarray(3, jnp.int32),
            "levels": jnp.asarray(rng.integers(0, 16, size=(1024, 512)) / 8.0, jnp.float32),
        }
        in_memory = sum(int(x.nbytes) for x in jax_leaves(state))
        saved = self._saved_bytes(tmp_path, state)
        estimate = estimate_bytes(state)
        assert saved < 0.8 * in_memory  # the zeros and the few levels compress
        assert 0.9 * saved < estimate < 1.1 * saved, (estimate, saved, in_memory)

    def test_a_state_of_zeros_asks_for_little(self):
        import jax.numpy as jnp

        from rlctl.core.trainer.checkpoint.checkpoint_size import estimate_bytes, space_needed

        zeros = {"w": jnp.zeros((1024, 1024), jnp.float32)}  # 4 MiB in memory
        assert space_needed(0, estimate_bytes(zeros)) < 2**20


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


class TestBackgroundSaves:
    """A save written by a thread from a device copy of the state (an accelerator's
    row of the numerics table): the run goes on at once, the checkpoint is complete
    and committed only when the thread is done, and it holds the state as it was."""

    @pytest.fixture
    def parts(self, tiny_model_dir, tmp_path):
        from rlctl.core.config.models import TrainingSpec
        from rlctl.core.store.local import LocalRunDir
        from rlctl.core.trainer import tunix_adapter as ta
        from rlctl.core.trainer.update.step import make_optimizer

        model, _ = ta.load_model(tiny_model_dir)
        return model, make_optimizer(model, TrainingSpec()), LocalRunDir(tmp_path, "bg")

    def test_the_saved_state_is_the_one_at_the_save_though_the_update_donates_it(
        self, parts, tiny_model_dir
    ):
        """The next update donates the model's buffers (deleted, then reused) while the
        thread writes: the thread writes its own copy, and the restored checkpoint is
        the state at the save, not after."""
        import jax
        import jax.numpy as jnp
        import numpy as np
        from flax import nnx

        from rlctl.core.trainer.checkpoint import checkpointing
        from rlctl.core.trainer.runtime.distributed import current

        model, optimizer, run = parts
        ckpt = checkpointing.Checkpoints(run, current(), keep=2, background=True)
        # device copies: a numpy view (which JAX keeps on the array) would be an
        # external reference, and a buffer with one is copied, not donated
        before = [
            jnp.array(x, copy=True) for x in jax.tree.leaves(checkpointing._state(model, optimizer))
        ]
        ckpt.save(3, model, optimizer)
        # what a step does next: a jitted update whose input state is donated
        state = nnx.state((model, optimizer))
        bump = jax.jit(
            lambda s: jax.tree.map(lambda x: x + 1 if x.dtype.kind == "f" else x, s),
            donate_argnums=0,
        )
        bumped = bump(state)
        # donated indeed: the floats' buffers are gone (the counts pass through)
        assert all(x.is_deleted() for x in jax.tree.leaves(state) if x.dtype.kind == "f")
        nnx.update((model, optimizer), bumped)
        ckpt.wait()
        assert ckpt.latest == 3 and verify(run.path / "checkpoints" / "3") is None
        (saved,) = ckpt.finished()
        assert (saved.step, saved.background) == (3, True) and saved.write_s > 0
        ckpt.close()
        again = checkpointing.Checkpoints(run, current(), keep=2)
        assert again.restore_latest(model, optimizer) == 3
        again.close()
        after = jax.tree.leaves(checkpointing._state(model, optimizer))
        for a, b in zip(before, after, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def test_one_save_in_flight_and_a_failed_write_is_raised_on_the_run_thread(
        self, parts, monkeypatch
    ):
        """The next save waits for the one in flight; a write that fails in the thread
        is raised by the next wait, and no checkpoint of it is left or counted."""
        import os

        from rlctl.core.trainer.checkpoint import checkpointing
        from rlctl.core.trainer.runtime.distributed import current

        model, optimizer, run = parts
        ckpt = checkpointing.Checkpoints(run, current(), keep=3, background=True)
        ckpt.save(1, model, optimizer)
        ckpt.save(2, model, optimizer)  # waited for 1 first
        assert [s.step for s in ckpt.finished()] in ([1], [1, 2])
        ckpt.wait()
        assert ckpt.latest == 2

        def full(step, args):  # the disk is full when the thread writes
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(ckpt.manager, "save", full)
        ckpt.save(3, model, optimizer)
        with pytest.raises(checkpointing.DiskFullError, match="saving checkpoint 3"):
            ckpt.wait()
        assert ckpt.latest == 2
        assert sorted(os.listdir(run.path / "checkpoints")) == ["1", "2"]
        ckpt.close()
