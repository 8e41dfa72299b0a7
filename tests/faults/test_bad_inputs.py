"""Unreadable inputs are one line and exit 2, found before a run folder exists."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.faults.conftest import one_error

pytestmark = pytest.mark.trainer


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(tiny_model_dir, dst)
    return dst


@pytest.mark.parametrize(
    "damage, words",
    [
        ("truncated", ("model.safetensors: truncated",)),
        ("random", ("not a safetensors file",)),
        ("config", ("config.json: not valid JSON",)),
    ],
)
def test_a_damaged_model_folder_is_named_before_anything_is_written(
    cli, tiny_args, tmp_path, model_copy, damage, words
):
    st = model_copy / "model.safetensors"
    if damage == "truncated":
        st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    elif damage == "random":
        st.write_bytes(bytes(range(256)) * 400)  # a "header length" of terabytes
    else:
        (model_copy / "config.json").write_text('{"model_type": ')
    r = cli(*tiny_args(tmp_path / "runs", "m", model=model_copy))
    one_error(r, 2, *words)
    assert not (tmp_path / "runs").exists()


def test_a_reward_with_the_wrong_signature_is_refused_before_the_model_loads(
    cli, tiny_args, tmp_path
):
    (tmp_path / "myrewards.py").write_text("def one_arg(completion):\n    return 1.0\n")
    args = tiny_args(tmp_path / "runs", "r", "--set", 'rewards=["myrewards.one_arg"]')
    r = cli(*args, env={"PYTHONPATH": str(tmp_path)})
    one_error(r, 2, "reward 'myrewards.one_arg'", "(completion, gold)")
    assert "loading model" not in r.stderr and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("where", ["file", "proc", "empty"])
def test_a_runs_dir_that_cannot_hold_runs(cli, tiny_args, tmp_path, where):
    root = {"file": tmp_path / "a-file", "proc": "/proc/self/runs", "empty": ""}[where]
    if where == "file":
        root.write_text("x")
    r = cli(*tiny_args(root, "r"))
    if where == "empty":  # an unset shell variable, not "the default ./runs"
        assert r.returncode == 2 and "--runs-dir" in r.stderr and "is empty" in r.stderr
        assert not (tmp_path / "runs").exists()
        return
    one_error(r, 2, "run store", "a file, not a folder" if where == "file" else "/proc")


def test_rlctl_cache_that_is_a_file(cli, tmp_path, data_file):
    (tmp_path / "cache").write_text("x")
    r = cli(
        "train",
        "grpo",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--dataset",
        "jsonl",
        "--data-path",
        str(data_file),
        env={"RLCTL_CACHE": str(tmp_path / "cache")},
    )
    one_error(r, 2, "RLCTL_CACHE", "is a file")


def test_setting_below_a_value_names_the_value(cli):
    r = cli("train", "grpo", "--set", "training.steps.x=3", "--dry-run")
    one_error(r, 2, "training.steps is a value, not a section")


@pytest.mark.parametrize(
    "damage, words",
    [
        ("no-tokenizer", ("has no tokenizer.json",)),
        ("bad-tokenizer", ("tokenizer.json: not a tokenizer file",)),
        ("config-key", ("cannot build a llama model", "num_hidden_layers")),
    ],
)
def test_model_files_the_loader_would_trip_on(cli, tiny_args, tmp_path, model_copy, damage, words):
    if damage == "no-tokenizer":
        (model_copy / "tokenizer.json").unlink()
    elif damage == "bad-tokenizer":
        (model_copy / "tokenizer.json").write_text("[1, 2]")
    else:
        cfg = json.loads((model_copy / "config.json").read_text())
        del cfg["num_hidden_layers"]
        (model_copy / "config.json").write_text(json.dumps(cfg))
    one_error(cli(*tiny_args(tmp_path / "runs", "m", model=model_copy)), 2, *words)
    assert not (tmp_path / "runs").exists()  # exit 2: nothing was changed


@pytest.mark.parametrize(
    "source, words",
    [
        (
            "def fn(completion, gold)\n    return 1.0\n",
            ("importing 'badmod' failed", "SyntaxError"),
        ),
        ("raise RuntimeError('cannot import me')\n", ("importing 'badmod' failed",)),
    ],
)
def test_a_reward_module_that_fails_to_import(cli, tiny_args, tmp_path, source, words):
    (tmp_path / "badmod.py").write_text(source)
    r = cli(
        *tiny_args(tmp_path / "runs", "r", "--set", 'rewards=["badmod.fn"]'),
        env={"PYTHONPATH": f"{tmp_path}:{cli.env['PYTHONPATH']}"},
    )
    one_error(r, 2, *words)
    assert not (tmp_path / "runs").exists()


FLOAT_RAISES = "class F:\n    def __float__(self): raise RuntimeError('no')\n"
STR_RAISES = "class E(Exception):\n    def __str__(self): raise RuntimeError('no')\n"


@pytest.mark.parametrize(
    "pre, body, code, words",
    [
        ("", "return 'one'", 2, ("returned 'one' (str) for completion 1 of 1", "not a finite")),
        ("", "return float('nan')", 2, ("returned nan (float)",)),
        ("", "raise ValueError('boom')", 2, ("reward 'myreward.fn' raised ValueError: boom",)),
        # #53: these ended 'unexpected error: ...', "report it", the reward unnamed
        ("", "return 10**400", 2, ("myreward.fn' returned an int of 401 digits", "outside")),
        ("", "return 1000001", 2, ("returned 1000001 (int)", "outside the range ±1e+06")),
        (FLOAT_RAISES, "return F()", 2, ("fn' returned a myreward.F", "raised RuntimeError")),
        (STR_RAISES, "raise E()", 2, ("myreward.fn' raised E: ", "for completion 1 of 1")),
        ("", "raise KeyboardInterrupt", 130, ("myreward.fn' raised KeyboardInterrupt",)),
    ],
)
def test_a_reward_that_misbehaves_is_named_before_the_run_exists(
    cli, tiny_args, tmp_path, pre, body, code, words
):
    (tmp_path / "myreward.py").write_text(f"{pre}def fn(completion, gold):\n    {body}\n")
    r = cli(
        *tiny_args(tmp_path / "runs", "r", "--set", 'rewards=["myreward.fn"]'),
        env={"PYTHONPATH": f"{tmp_path}:{cli.env['PYTHONPATH']}"},
    )
    one_error(r, code, *words)  # found by one trial call before the run exists
    assert "report it" not in r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flag", ["--config", "--data-path"])
def test_a_device_file_is_not_said_to_be_missing(cli, tmp_path, flag):
    extra = (
        ["--dataset", "jsonl", "--runs-dir", str(tmp_path / "runs")]
        if flag == "--data-path"
        else ["--dry-run"]
    )
    r = cli("train", "grpo", *extra, flag, "/dev/null")
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "damage, words",
    [
        ("missing", ("model.layers.1.mlp.up_proj.weight' is missing",)),
        ("hidden", ("model.embed_tokens.weight is", "config.json says")),
    ],
)
def test_weights_that_do_not_fit_the_config(cli, tiny_args, tmp_path, model_copy, damage, words):
    from safetensors.numpy import load_file, save_file

    st = model_copy / "model.safetensors"
    tensors = load_file(st)
    if damage == "missing":
        del tensors["model.layers.1.mlp.up_proj.weight"]
    else:
        cfg = json.loads((model_copy / "config.json").read_text())
        cfg["hidden_size"] *= 2
        (model_copy / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, st)
    one_error(cli(*tiny_args(tmp_path / "runs", "m", model=model_copy)), 2, *words)
    assert not (tmp_path / "runs").exists()
