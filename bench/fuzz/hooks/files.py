"""Setups that shape the case's own folder from the data's arguments: paths relative
to the case folder (``{tmp}``), contents inline (``text``) or named (``content``, see
contents.py). A case may list several; they run in order."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

from bench.fuzz.case import Setup
from bench.fuzz.files import write
from bench.fuzz.fixtures import Ctx, need_mount, ro_dir
from bench.fuzz.registry import CONTENTS, hook

NOT_A_FOLDER = "not a folder\n"

hook("skip")(need_mount)


@hook("setup", factory=True)
def mkdir(path: str) -> Setup:
    """An empty folder."""
    return lambda c: c.p(path).mkdir()


@hook("setup", factory=True)
def mkfifo(path: str) -> Setup:
    """A named pipe nobody writes to (a read blocks)."""
    return lambda c: os.mkfifo(c.p(path))


@hook("setup", factory=True)
def symlink(path: str, to: str) -> Setup:
    """A symlink ``path`` to ``to`` (absolute; ``to: loop`` at ``loop``: a loop)."""
    return lambda c: os.symlink(c.p(to), c.p(path))


@hook("setup", factory=True)
def remove(path: str) -> Setup:
    """Delete a file (of a copied model, say)."""
    return lambda c: c.p(path).unlink()


@hook("setup", factory=True, name="write")
def write_file(path: str, text: str | None = None, content: str | None = None) -> Setup:
    """A file of ``text`` (UTF-8) or of the named ``content``."""
    if (text is None) == (content is None):
        raise ValueError("write takes one of text and content")
    if content is not None and content not in CONTENTS:
        raise ValueError(f"no content named {content!r} (bench/fuzz/hooks/contents.py)")

    def setup(c: Ctx) -> None:
        write(c.p(path), text if text is not None else CONTENTS[str(content)]())

    return setup


@hook("setup", factory=True)
def regular_file(path: str) -> Setup:
    """A regular file where rlctl wants a folder (post ``regular_file_unchanged``)."""
    return lambda c: write(c.p(path), NOT_A_FOLDER)


@hook("setup", factory=True)
def random_bytes(path: str, size: int, prefix: str = "") -> Setup:
    """``prefix`` then ``size`` random bytes."""
    return lambda c: write(c.p(path), prefix.encode() + os.urandom(size))


@hook("setup", factory=True)
def truncate(path: str, fraction: float) -> Setup:
    """Cut a file to ``fraction`` of its size."""

    def setup(c: Ctx) -> None:
        p = c.p(path)
        with p.open("r+b") as f:
            f.truncate(int(p.stat().st_size * fraction))

    return setup


@hook("setup", factory=True)
def edit_json(path: str, drop: Sequence[str] = (), update: dict[str, Any] | None = None) -> Setup:
    """Rewrite a JSON object without the keys ``drop``, with ``update`` set."""

    def setup(c: Ctx) -> None:
        doc = json.loads(c.p(path).read_text())
        for key in drop:
            doc.pop(key)
        doc.update(update or {})
        write(c.p(path), json.dumps(doc))

    return setup


@hook("setup", factory=True)
def drop_tensor(path: str, tensor: str) -> Setup:
    """A safetensors file without one of its tensors."""

    def setup(c: Ctx) -> None:
        from safetensors.numpy import load_file, save_file

        tensors = load_file(str(c.p(path)))
        tensors.pop(tensor)
        save_file(tensors, str(c.p(path)))

    return setup


@hook("setup", factory=True)
def parquet(path: str, columns: dict[str, list[Any]]) -> Setup:
    """A Parquet file of ``columns`` (name: values)."""

    def setup(c: Ctx) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table(columns), c.p(path))

    return setup


@hook("setup", factory=True)
def copy_model(to: str = "m") -> Setup:
    """The tiny model (fixture ``model``) copied, to damage."""
    return lambda c: shutil.copytree(c.fx.model, c.p(to))


@hook("setup", factory=True)
def tmpfs(path: str, size: str) -> Setup:
    """A tmpfs of ``size`` mounted there: a full disk (skip ``need_mount``)."""
    return lambda c: c.fx.mounts.tmpfs(c.p(path), size)


@hook("setup", factory=True)
def read_only_dir(path: str) -> Setup:
    """An empty read-only folder (a tmpfs remounted ro; skip ``need_mount``)."""
    return lambda c: ro_dir(c, path)


@hook("setup")
def reward_modules(c: Ctx) -> None:
    """Reward modules in ``{tmp}/mods`` (on PYTHONPATH): fuzzrewards.py's every kind
    of wrong reward, one that cannot import, one that does not parse."""
    write(c.p("mods") / "fuzzrewards.py", CONTENTS["reward_module"]())
    write(
        c.p("mods") / "import_fails.py",
        "raise RuntimeError('cannot import me')\ndef fn(c, g):\n    return 0.0\n",
    )
    write(c.p("mods") / "syntax_error.py", "def fn(c, g)\n    return 0.0\n")


@hook("setup")
def hub_home(c: Ctx) -> None:
    """``{tmp}/hf``: a Hugging Face cache holding openai/gsm8k (6 train, 4 test rows)."""
    from tests.fakes.hub_cache import write_gsm8k

    write_gsm8k(c.p("hf"), train=6, test=4)


@hook("setup")
def nan_model(c: Ctx) -> None:
    """``{tmp}/nan-model``: the tiny model with its last norm's first weight NaN: every
    loss is NaN."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(c.fx.model, c.p("nan-model"))
    f = c.p("nan-model") / "model.safetensors"
    tensors = load_file(str(f))
    name = next(n for n in tensors if n.endswith("norm.weight"))
    tensors[name] = tensors[name].copy()
    tensors[name][0] = float("nan")
    save_file(tensors, str(f), metadata={"format": "pt"})
