"""Rows of a local data file: JSONL, JSON, Parquet or CSV, each row a mapping of columns.

The format comes from the file's extension, else from its first bytes. Every row
keeps where it came from (``path:line`` for line-based files, ``path: row N`` for
the others), so a bad row is reported as an editor or a dataframe would number it.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from pathlib import Path
from typing import Any

from rlctl.core.errors import ConfigError

# (where, row): the row as parsed, not yet known to be a mapping
Rows = list[tuple[str, Any]]

FORMATS = "JSONL, JSON, Parquet or CSV"
_BY_SUFFIX = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet",
              ".pq": "parquet", ".csv": "csv", ".tsv": "tsv"}


def read_rows(path: str) -> Rows:
    """Every row of the file at ``path``; a ConfigError when it cannot be read."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"data path {path!r} is a directory, not a file",
                          hint=f"pass a {FORMATS} file")
    if p.exists() and not p.is_file():
        raise ConfigError(f"data path {path!r} is not a regular file",
                          hint=f"pass a {FORMATS} file")
    if not p.is_file():
        raise ConfigError(f"data file {path!r} does not exist")
    kind = _BY_SUFFIX.get(p.suffix.lower()) or _sniff(p, path)
    if kind == "parquet":
        return _parquet_rows(p, path)
    data = _read_bytes(p, path)
    if kind == "json":
        return _json_rows(data, path)
    if kind in ("csv", "tsv"):
        return _csv_rows(data, path, "\t" if kind == "tsv" else ",")
    return _jsonl_rows(data, path)


def _read_bytes(p: Path, path: str) -> bytes:
    try:
        return p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read data file {path!r} ({e.strerror or e})") from e


def _sniff(p: Path, path: str) -> str:
    """The format of a file whose extension says nothing: Parquet's magic bytes, a
    JSON array, JSON lines; anything else is refused rather than guessed at."""
    try:
        with p.open("rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise ConfigError(f"cannot read data file {path!r} ({e.strerror or e})") from e
    if head.startswith(b"PAR1"):
        return "parquet"
    start = head.removeprefix(codecs.BOM_UTF8).lstrip()[:1]
    if start == b"[":
        return "json"
    if start == b"{":
        return "jsonl"
    raise ConfigError(f"data file {path!r}: cannot tell its format from its name or content",
                      hint=f"rlctl reads {FORMATS}: name it .jsonl, .json, .parquet or .csv")


def _text(data: bytes, path: str) -> str:
    try:
        return data.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x})",
                          hint="save the file as UTF-8") from e


def _jsonl_rows(data: bytes, path: str) -> Rows:
    """(``path:line``, parsed value) per non-blank line.

    Split as bytes, so a line is numbered as an editor numbers it and a stray byte
    that is not UTF-8 is reported on its own line (str.splitlines would also split
    inside JSON strings at U+2028 and friends)."""
    rows: Rows = []
    for n, raw in enumerate(data.removeprefix(codecs.BOM_UTF8).splitlines(), 1):
        where = f"{path}:{n}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})",
                hint="save the file as UTF-8 JSONL",
            ) from e
        if not line.strip():
            continue
        try:
            rows.append((where, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not valid JSON ({e.msg})") from e
    return rows


def _json_rows(data: bytes, path: str) -> Rows:
    """A JSON document: an array of row objects, an object with one array of them
    (``{"data": [...]}``), or an object of equal-length columns; a .json file that
    holds JSON lines is read as such (the ``datasets`` json loader does the same)."""
    text = _text(data, path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if text.lstrip().startswith("{") and e.msg == "Extra data":
            return _jsonl_rows(data, path)
        line = text[:e.pos].count("\n") + 1
        raise ConfigError(f"{path}:{line}: not valid JSON ({e.msg})") from e
    if isinstance(doc, dict):
        lists = {k: v for k, v in doc.items() if isinstance(v, list)}
        if len(lists) == 1 and len(doc) == 1 and all(isinstance(r, dict)
                                                     for r in next(iter(lists.values()))):
            doc = next(iter(lists.values()))
        elif lists and len(lists) == len(doc) and len({len(v) for v in lists.values()}) == 1:
            doc = [dict(zip(lists, values)) for values in zip(*lists.values())]
    if not isinstance(doc, list):
        raise ConfigError(f"{path}: a JSON document that is not a list of rows",
                          hint='write [{"question": ..., "answer": ...}, ...] or JSON lines')
    return [(f"{path}: row {n}", row) for n, row in enumerate(doc, 1)]


def _csv_rows(data: bytes, path: str, delimiter: str) -> Rows:
    text = _text(data, path)
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    rows: Rows = []
    try:
        for row in reader:
            if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                continue  # a blank line
            rows.append((f"{path}:{reader.line_num}", row))
    except csv.Error as e:
        raise ConfigError(f"{path}:{reader.line_num}: not valid CSV ({e})") from e
    if reader.fieldnames is None:
        raise ConfigError(f"data file {path!r} is empty", hint="its first line names the columns")
    return rows


def _parquet_rows(p: Path, path: str) -> Rows:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ConfigError("reading parquet needs pyarrow", hint="pip install pyarrow") from e
    try:
        table = pq.read_table(p)
    except (OSError, ValueError) as e:  # ArrowInvalid is a ValueError, ArrowIOError an OSError
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{path}: not a readable parquet file ({first})") from e
    return [(f"{path}: row {n}", row) for n, row in enumerate(table.to_pylist(), 1)]
