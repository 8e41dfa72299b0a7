"""A Hugging Face hub dataset as it lies in the hub cache on disk, for offline loads.

The layout is huggingface_hub's cache (``docs/source/en/guides/manage-cache.md``,
"Understand caching"; written by ``file_download.py``, huggingface_hub 1.33):

    $HF_HOME/hub/datasets--OWNER--NAME/
        refs/main                      the commit the branch points at
        blobs/<sha256 of the file>     the files' content
        snapshots/<commit>/<path>      symlinks into blobs/, one per repo file

The repo files are openai/gsm8k's: ``main/{train,test}-00000-of-00001.parquet`` and
``socratic/...`` (the hub's parquet conversion), and a README whose front matter's
``configs`` (copied from huggingface.co/datasets/openai/gsm8k) maps config and split to
those files, which is how ``datasets.load_dataset(folder, "main", split=...)`` finds
them (datasets 5.2 ``load.py``, ``LocalDatasetModuleFactory``; ``MetadataConfigs``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "e53f048856ff4f594e959d75785d2c2d37b678ee"  # openai/gsm8k's main when copied

GSM8K_README = """---
pretty_name: Grade School Math 8K
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
  - split: test
    path: socratic/test-*
---
# Dataset Card for GSM8K (rows replaced by a test's own)
"""


def gsm8k_rows(split: str, n: int) -> list[dict[str, str]]:
    """GSM8K-shaped rows: a question, and worked text ending in '#### N'."""
    return [
        {
            "question": f"[{split} {i}] Ann has {i} pens and buys {i + 2}. How many now?",
            "answer": f"She has {i} + {i + 2} = <<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2} pens."
            f"\n#### {2 * i + 2}",
        }
        for i in range(n)
    ]


def write_hub_dataset(
    hf_home: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT
) -> Path:
    """``files`` (repo path -> content) as the hub cache holds them; the snapshot folder."""
    root = hf_home / "hub" / f"datasets--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    (root / "blobs").mkdir()
    for path, content in files.items():
        blob = root / "blobs" / hashlib.sha256(content).hexdigest()
        blob.write_bytes(content)
        link = snapshot / path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    return snapshot


def write_gsm8k(hf_home: Path, train: int = 12, test: int = 6) -> Path:
    """openai/gsm8k (configs main and socratic) in the hub cache under ``hf_home``."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    def parquet(rows: list[dict[str, str]]) -> bytes:
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buf)
        return buf.getvalue()

    files = {"README.md": GSM8K_README.encode()}
    for config in ("main", "socratic"):
        for split, n in (("train", train), ("test", test)):
            rows = gsm8k_rows(f"{config} {split}", n)
            files[f"{config}/{split}-00000-of-00001.parquet"] = parquet(rows)
    return write_hub_dataset(hf_home, "openai/gsm8k", files)
