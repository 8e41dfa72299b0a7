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
_BY_SUFFIX = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
}


def read_rows(path: str) -> Rows:
    """Every row of the file at ``path``; a ConfigError when it cannot be read."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(
            f"data path {path!r} is a directory, not a file", hint=f"pass a {FORMATS} file"
        )
    if p.exists() and not p.is_file():
        raise ConfigError(
            f"data path {path!r} is not a regular file", hint=f"pass a {FORMATS} file"
        )
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
    raise ConfigError(
        f"data file {path!r}: cannot tell its format from its name or content",
        hint=f"rlctl reads {FORMATS}: name it .jsonl, .json, .parquet or .csv",
    )


def _text(data: bytes, path: str) -> str:
    try:
        return data.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x})",
            hint="save the file as UTF-8",
        ) from e


# How deep a row's values may nest: a row holds text, numbers, lists of them and chat
# messages (a list of mappings: depth 3). A line of 100,000 brackets ended in
# "unexpected error: RecursionError" (#47), and a row just under Python's limit
# would fail later, wherever it is printed or copied.
MAX_DEPTH = 64


def _depth_over(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests lists and mappings more than ``limit`` deep (counted
    without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, tuple, dict)):
            if depth > limit:
                return True
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def _nested(where: str) -> ConfigError:
    return ConfigError(
        f"{where}: nested more than {MAX_DEPTH} levels deep",
        hint='a data row holds text, numbers and chat messages ([{"role": ..., "content": ...}])',
    )


def _parse(text: str, where: str) -> Any:
    """One JSON value, bounded in depth (``MAX_DEPTH``)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _nested(where) from None
    if _depth_over(value):
        raise _nested(where)
    return value


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
            rows.append((where, _parse(line, where)))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not valid JSON ({e.msg})") from e
    return rows


def _json_rows(data: bytes, path: str) -> Rows:
    """A JSON document: an array of row objects, an object with one array of them
    (``{"data": [...]}``), or an object of equal-length columns; a .json file that
    holds JSON lines is read as such (the ``datasets`` json loader does the same)."""
    text = _text(data, path)
    try:
        doc = _parse(text, path)
    except json.JSONDecodeError as e:
        if text.lstrip().startswith("{") and e.msg == "Extra data":
            return _jsonl_rows(data, path)
        line = text[: e.pos].count("\n") + 1
        raise ConfigError(f"{path}:{line}: not valid JSON ({e.msg})") from e
    if isinstance(doc, dict):
        lists = {k: v for k, v in doc.items() if isinstance(v, list)}
        if (
            len(lists) == 1
            and len(doc) == 1
            and all(isinstance(r, dict) for r in next(iter(lists.values())))
        ):
            doc = next(iter(lists.values()))
        elif lists and len(lists) == len(doc) and len({len(v) for v in lists.values()}) == 1:
            doc = [dict(zip(lists, values)) for values in zip(*lists.values())]
        elif lists and len(lists) == len(doc):  # columns, of unequal lengths
            sizes = ", ".join(f"{k}: {len(v)}" for k, v in lists.items())
            raise ConfigError(
                f"{path}: its columns have unequal lengths ({sizes})",
                hint="give every column one value per row, or write the rows "
                'as [{"question": ..., "answer": ...}, ...]',
            )
    if not isinstance(doc, list):
        raise ConfigError(
            f"{path}: a JSON document that is not a list of rows",
            hint='write [{"question": ..., "answer": ...}, ...] or JSON lines',
        )
    return [(f"{path}: row {n}", row) for n, row in enumerate(doc, 1)]


_QUOTING = (
    "a field that holds the delimiter, a quote or a line break is quoted "
    '("...") and each quote inside it doubled ("")'
)


def _csv_rows(data: bytes, path: str, delimiter: str) -> Rows:
    """Every row of a CSV (or TSV) file, each with exactly the header's fields.

    Read strictly: Python's lenient reader took ``"a "b" c"`` as ``a b" c"`` and ran
    an unclosed quote to the end of the file, whose rows then came out "empty"; a
    row with more or fewer fields than the header had its extra fields dropped or
    its last columns read as empty (#47). A long field is read whole (the prompt
    length check names it), not cut at the csv module's 131,072 characters."""
    text = _text(data, path)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    rows: Rows = []
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, len(text) + 1))
    start = 1  # the line a record starts on (a quoted field may span lines)
    try:
        header = next(reader, None)
        if header is None:
            raise ConfigError(
                f"data file {path!r} is empty", hint="its first line names the columns"
            )
        start = reader.line_num + 1
        for fields in reader:
            where = f"{path}:{start}"
            start = reader.line_num + 1
            if not any(f.strip() for f in fields):
                continue  # a blank line
            if len(fields) != len(header):
                raise ConfigError(
                    f"{where}: {len(fields)} field{'s' * (len(fields) != 1)}, but the "
                    f"header names {len(header)} ({', '.join(header)[:120]})",
                    hint=f"one field per column on every line; {_QUOTING}",
                )
            rows.append((where, dict(zip(header, fields))))
    except csv.Error as e:
        why = (
            f"a quoted field opened on line {start} is never closed"
            if "unexpected end of data" in str(e)
            else f"not valid CSV ({e})"
        )
        line = start if "unexpected end of data" in str(e) else reader.line_num
        raise ConfigError(f"{path}:{line}: {why}", hint=_QUOTING) from e
    finally:
        csv.field_size_limit(limit)
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
