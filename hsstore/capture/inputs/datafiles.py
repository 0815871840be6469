"""Rows of the data files, each with its file and 1-based row number, read exactly as written.

JSON and JSON Lines are read with the ``json`` module, not through Arrow: Arrow unifies a column's type
across rows, so a tool call's ``arguments`` object would gain every other row's keys as nulls and the
template would render them. Parquet files are streamed with pyarrow a batch of rows at a time;
``save_to_disk`` folders are memory-mapped through ``datasets``. A file that holds no rows — empty, not
UTF-8, one JSON object or scalar — is refused with one line naming it; a single bad line of a JSON Lines
file is a rejected row, named with its line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hsstore.core.batching import check_fits
from hsstore.core.errors import BadInput
from hsstore.core.keys import SampleTokens
from hsstore.core.nesting import TooDeep, check_depth, loads_bounded, lone_surrogate
from hsstore.core.outputs import byte_size

BOM = b"\xef\xbb\xbf"
ROW_KEYS = {"conversations", "messages", "text", "prompt", "completion"}  # keys that make an object a row


class BadRow:
    """Stands in for a row that could not be parsed; ``reason`` says why."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason, self.detail = reason, detail


def _decode(raw: bytes, f: str, line: int | None = None) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = f"line {line}" if line is not None else f"offset {e.start}"
        raise BadInput(
            f"data file {f!r} is not UTF-8 text (byte 0x{raw[e.start]:02x} at {where}); re-encode it as UTF-8"
        ) from None


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _first_byte(path: Path) -> bytes:
    """The first non-whitespace byte after an optional UTF-8 BOM (b"" for an empty file)."""
    with open(path, "rb") as fh:
        head = fh.read(3)
        if head != BOM:
            fh.seek(0)
        while chunk := fh.read(1 << 16):
            stripped = chunk.lstrip()
            if stripped:
                return stripped[:1]
    return b""


JSON_IN_MEMORY = 10  # bytes of Python objects per byte of JSON text (dicts, lists and str of chat rows: ~6-10x)


def _whole(path: Path, f: str) -> Any:
    """A .json file parsed whole (a JSON list of rows), priced first: parsed, it is ~10x its size in memory."""
    size = path.stat().st_size
    check_fits(
        size * JSON_IN_MEMORY,
        f"data file {f!r} ({byte_size(size)} of JSON, parsed whole)",
        "write it as JSON Lines (one row a line, read a line at a time) or parquet",
    )
    text = _decode(path.read_bytes().removeprefix(BOM), f)
    try:
        return loads_bounded(text, limit=None)  # each row's depth is checked by json_rows
    except TooDeep as e:
        raise BadInput(f"data file {f!r} is {e}; rows are JSON objects of chats or text, a few levels deep") from None
    except json.JSONDecodeError as e:
        raise BadInput(
            f"data file {f!r} is neither JSON nor JSON Lines ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from None


def _lines(path: Path, f: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of the non-blank lines, each checked to be UTF-8."""
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            text = _decode(raw.removeprefix(BOM) if n == 1 else raw, f, n)
            if text.strip():
                yield n, text


def _parsed(text: str) -> Any:
    try:
        value = loads_bounded(text, limit=None)
    except TooDeep as e:
        return BadRow("nested too deeply", str(e))
    except json.JSONDecodeError as e:
        return BadRow("invalid JSON line", f"{e.msg} at column {e.colno}")
    return _row(value)


def _row(value: Any) -> Any:
    """A parsed row, or a BadRow if it nests too deeply or holds a string that is not Unicode text (a lone
    surrogate escape such as ``"\\ud800"``: JSON allows it, a tokenizer cannot encode it)."""
    try:
        check_depth(value)
    except TooDeep as e:
        return BadRow("nested too deeply", str(e))
    bad = lone_surrogate(value)
    if bad is not None:
        return BadRow("not Unicode text", f"a lone surrogate {bad} in a string (a UTF-16 half, not a character)")
    return value


def _one_object(doc: Any, f: str) -> Any:
    """A file holding a single JSON object is one row only if it looks like one."""
    if isinstance(doc, dict) and ROW_KEYS & set(doc):
        return doc
    keys = sorted(doc)[:8] if isinstance(doc, dict) else []
    raise BadInput(
        f"data file {f!r} holds one JSON object (keys {keys}), not rows; write one JSON object per "
        "line (.jsonl) or a JSON list of objects"
    )


def json_rows(path: Path, f: str) -> Iterator[tuple[int, Any]]:
    """(row number, row) of a .json/.jsonl file: a JSON list of rows, or one JSON object per line."""
    first = _first_byte(path)
    if not first:
        raise BadInput(f"data file {f!r} is empty; it needs rows (one JSON object per line, or a JSON list)")
    if first != b"{":
        doc = _whole(path, f)
        if not isinstance(doc, list):
            raise BadInput(
                f"data file {f!r} holds a JSON {_kind(doc)}, not rows; write one JSON object per line "
                "(.jsonl) or a JSON list of objects"
            )
        yield from ((n, _row(row)) for n, row in enumerate(doc, 1))
        return
    lines = _lines(path, f)
    n1, text1 = next(lines)
    row1 = _parsed(text1)
    if isinstance(row1, BadRow):  # one object spread over lines, or a bad first line
        try:
            doc = _whole(path, f)
        except BadInput:  # not JSON, or nested too deeply: the first line's own rejection stands
            doc = None
        if doc is not None:
            yield 1, _row(_one_object(doc, f))
            return
    second = next(lines, None)
    if second is None:
        yield n1, row1 if isinstance(row1, BadRow) else _one_object(row1, f)
        return
    yield n1, row1
    yield second[0], _parsed(second[1])
    for n, text in lines:
        yield n, _parsed(text)


def arrow_rows(path: Path, f: str) -> Iterator[tuple[int, Any]]:
    """(row number, row) of a parquet file or an HF ``save_to_disk`` folder (memory-mapped, through
    ``datasets``)."""
    if not path.is_dir():
        yield from parquet_rows(path, f)
        return
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[next(iter(ds))]
    except Exception as e:
        raise BadInput(f"data file {f!r} cannot be read: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from None
    if len(ds) == 0:
        raise BadInput(f"data file {f!r} is empty; it needs rows")
    yield from enumerate(ds, 1)


PARQUET_BATCH_ROWS = 256  # rows decoded at once: a parquet file is streamed, never held or copied whole


def parquet_rows(path: Path, f: str) -> Iterator[tuple[int, Any]]:
    """(row number, row) of a parquet file, read a batch of rows at a time with pyarrow. Nothing is written
    (``datasets.load_dataset`` would decode the whole file into an Arrow copy under ~/.cache/huggingface:
    a 1 MB file of repeated rows became gigabytes there); a row group whose declared decoded size would not
    fit the memory budget is refused before it is read."""
    import pyarrow.parquet as pq

    def unreadable(e: Exception) -> BadInput:
        return BadInput(f"data file {f!r} cannot be read: {type(e).__name__}: {str(e).splitlines()[0][:300]}")

    try:
        pf = pq.ParquetFile(path)
        meta = pf.metadata
    except Exception as e:
        raise unreadable(e) from None
    if meta.num_rows == 0:
        raise BadInput(f"data file {f!r} is empty; it needs rows")
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        check_fits(
            rg.total_byte_size,
            f"data file {f!r}: row group {g} ({rg.num_rows:,} rows) decoded",
            "write the parquet file with smaller row groups, or raise the budget",
        )
    n = 0
    batches = pf.iter_batches(batch_size=PARQUET_BATCH_ROWS)
    while True:
        try:
            batch = next(batches, None)
        except Exception as e:  # a damaged page, a codec pyarrow lacks
            raise unreadable(e) from None
        if batch is None:
            return
        for row in batch.to_pylist():
            n += 1
            yield n, row


def load_rows(files: list[str]) -> Iterator[tuple[str, int, Any]]:
    """(file, row number, row) for every row of every file: .jsonl/.json/.parquet or save_to_disk folders."""
    for f in files:
        p = Path(f)
        if not p.exists():
            raise BadInput(f"data file {f!r} does not exist; check [data] files (relative to the manifest)")
        if p.suffix in (".parquet", ".jsonl", ".json") and not p.is_dir() and not p.is_file():
            raise BadInput(f"data file {f!r} is not a regular file (a FIFO or a device would be read forever)")
        if p.is_dir() or p.suffix == ".parquet":
            rows = arrow_rows(p, f)
        elif p.suffix in (".jsonl", ".json"):
            rows = json_rows(p, f)
        else:
            raise BadInput(
                f"data file {f!r}: unknown file type {p.suffix!r}; use .jsonl, .json, .parquet "
                "or an HF save_to_disk folder"
            )
        for n, row in rows:
            yield f, n, row


# --- Tokenized samples handed from the build driver to its workers: one .npz of plain arrays (no pickle).


def save_samples(path: str | Path, samples: Sequence[SampleTokens]) -> None:
    lengths = np.array([s.length for s in samples], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    np.savez(
        path,
        keys=np.array([s.key for s in samples], dtype="<U32"),
        offsets=offsets,
        input_ids=np.concatenate([s.input_ids for s in samples]).astype(np.int32) if samples else np.zeros(0, np.int32),
        loss_mask=np.concatenate([s.loss_mask for s in samples]).astype(np.uint8) if samples else np.zeros(0, np.uint8),
    )


def load_samples(path: str | Path) -> list[SampleTokens]:
    with np.load(path, allow_pickle=False) as z:
        keys, off, ids, mask = z["keys"], z["offsets"], z["input_ids"], z["loss_mask"]
    return [SampleTokens(str(k), ids[off[i] : off[i + 1]], mask[off[i] : off[i + 1]]) for i, k in enumerate(keys)]
