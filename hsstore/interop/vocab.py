"""EAGLE-3 draft vocabularies: the ``size`` most frequent loss-masked tokens of a variant, as the d2t/t2d
mappings speculators, SpecForge and EAGLE-3 load.

``d2t[i]`` is the offset from draft id *i* to its target id (``target = i + d2t[i]``, int64 [size]);
``t2d`` marks the target ids in the draft vocabulary (bool [target vocab]). Tokens are ranked by count,
ties by token id (speculators' rule; SpecForge and EAGLE break ties by first appearance, so sets can
differ only among equally frequent tokens); fewer distinct tokens than ``size`` are padded with the
lowest unused ids, as all three do.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xxhash

from hsstore.core.batching import check_fits
from hsstore.core.errors import WRITE_FIXES, BadInput, WriteFailed, write_cause
from hsstore.core.nesting import loads_bounded
from hsstore.core.schema.record import or_none
from hsstore.core.schema.reports import VocabMapReport
from hsstore.interop.formats.interface import PLACE_ERRORS, TMP_SUFFIX, atomic_write, torch_bytes, write_failed
from hsstore.storage.fileio import write_file
from hsstore.storage.leases import Lease, lock_folder_alone
from hsstore.storage.store import check_outside_stores

if TYPE_CHECKING:
    from hsstore.storage.reader import VariantReader

# --- The folder ``hsstore vocab-map`` writes into: new, empty, or holding vocab-maps of the same variant only.

RECORD_GLOB = "vocab-map-*.json"


def record_name(size: int) -> str:
    return f"vocab-map-{size}.json"


def _records(root: Path) -> dict[str, dict[str, Any]]:
    """The vocab-map records in ``root`` by file name; BadInput for one that is not a vocab-map record."""
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(root.glob(RECORD_GLOB)):
        try:
            rec = json.loads(p.read_bytes()[: 1 << 20]) if p.is_file() and not p.is_symlink() else None
        except (ValueError, OSError):
            rec = None
        if not (isinstance(rec, dict) and isinstance(rec.get("files"), dict) and "variant" in rec):
            raise BadInput(f"{p} is not a vocab-map record hsstore wrote; choose another --out folder or move it")
        out[p.name] = rec
    return out


def hold_vocab_folder(root: Path, store: str, vid: str, names: list[str], size: int) -> Lease:
    """Create and lock ``root`` for a vocab-map of variant ``vid`` writing ``names``, after checking that no
    file it replaces is someone else's. The lease is held until the record is written (release it then)."""
    try:  # (write_vocab_map has checked that root is outside every store)
        root.mkdir(parents=True, exist_ok=True)
        lease = lock_folder_alone(str(root))
    except OSError as e:
        raise write_failed(root, e) from None
    if lease is None:
        raise BadInput(
            f"vocab-map folder {str(root)!r} is in use by another command right now (a vocab-map or an "
            "export writing it, an import reading it); wait for it to finish, or choose another --out"
        )
    try:
        records = _records(root)
        for name, rec in records.items():
            if rec.get("variant") != vid:
                raise BadInput(
                    f"{root} holds a vocab-map of {rec.get('store')}#{rec.get('variant')} ({name}), not of "
                    f"{store}#{vid}; choose another --out folder"
                )
        ours = {f for rec in records.values() for f in rec["files"]} | set(records)
        foreign = [n for n in names if os.path.lexists(root / n) and n not in ours]
        if foreign:
            raise BadInput(
                f"{root / foreign[0]} exists and no vocab-map record in {root} names it; hsstore does not "
                "overwrite files it did not write — choose another --out folder or move it"
            )
    except BaseException:
        lease.release()
        raise
    return lease


def write_together(
    root: Path, outputs: list[tuple[str, bytes]], record: str, make_record: Callable[[dict[str, str]], bytes]
) -> None:
    """Give the held folder ``root`` the files ``outputs`` and then their record ``record`` (from
    ``make_record(xxh3 of each file)``): all files are written whole under temporary names first, so a write
    that fails leaves every earlier file and record as they were; only then is the record removed, the files
    renamed into place and the new record written. Temporary files a killed run left are removed first."""
    for stale in root.glob(f".*{TMP_SUFFIX}"):  # (the folder is held: no live writer owns one)
        if stale.is_file() and not stale.is_symlink():
            stale.unlink(missing_ok=True)
    staged: list[tuple[str, str]] = []
    try:
        try:
            for name, data in outputs:
                staged.append((f".{name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}", name))
                write_file(str(root / staged[-1][0]), [data], exclusive=True)
        except OSError as e:
            path = root / staged[-1][1] if staged else root
            if e.errno in PLACE_ERRORS:
                raise write_failed(path, e) from None
            raise WriteFailed(
                f"writing {path} failed: {e.strerror or e}; the vocab-map folder is as it was (no file "
                f"of it was replaced). {WRITE_FIXES[write_cause(e)]} and re-run the same command"
            ) from None
        _rename_in(root, staged, record)
    finally:
        for tmp, _ in staged:
            (root / tmp).unlink(missing_ok=True)
    atomic_write(root, record, make_record({name: xxhash.xxh3_128_hexdigest(data) for name, data in outputs}))


def _rename_in(root: Path, staged: list[tuple[str, str]], record: str) -> None:
    """The staged files renamed over their names, the record that vouched for the earlier ones removed first."""
    (root / record).unlink(missing_ok=True)  # the files are about to change: no record vouches for them
    for tmp, name in staged:
        try:
            os.replace(root / tmp, root / name)
        except OSError as e:
            raise WriteFailed(
                f"putting {root / name} in place failed: {e.strerror or e}; the vocab-map folder now "
                "holds part of the new files and no record (hsstore takes it for unfinished): fix that "
                "and re-run the same command"
            ) from None


COUNT_BATCH = 1 << 20  # loss tokens gathered before one bincount (one per sample costs O(vocab) each)


def token_counts(reader: VariantReader, vocab: int) -> tuple[np.ndarray, int]:
    """Counts ``[vocab]`` of every loss-masked token of the variant, and the number of samples read."""
    counts = np.zeros(vocab, dtype=np.int64)
    pending: list[np.ndarray] = []
    held = 0
    for key in reader.keys:
        ids, mask = reader.read_tokens(reader.ref(key))
        sel = ids[mask.astype(bool)]
        if sel.size and int(sel.max()) >= vocab:
            raise BadInput(
                f"sample {key} has token id {int(sel.max())} >= the target vocabulary {vocab}; "
                "pass the model's vocabulary with --target-vocab-size"
            )
        pending.append(sel)
        held += sel.size
        if held >= COUNT_BATCH:
            counts += np.bincount(np.concatenate(pending).astype(np.int64), minlength=vocab)
            pending, held = [], 0
    if pending:
        counts += np.bincount(np.concatenate(pending).astype(np.int64), minlength=vocab)
    return counts, len(reader.keys)


def vocab_mapping(counts: np.ndarray, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t int64 [size], t2d bool [vocab]) from token counts."""
    vocab = int(counts.shape[0])
    if not 0 < size <= vocab:
        raise BadInput(f"--size {size} must be between 1 and the target vocabulary ({vocab})")
    order = np.lexsort((np.arange(vocab), -counts))  # by count descending, then token id
    chosen = np.sort(order[:size])
    d2t = torch.from_numpy(chosen - np.arange(size, dtype=np.int64))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.from_numpy(chosen)] = True
    return d2t, t2d


MAX_VOCAB = 2**31  # token ids are stored as int32
BYTES_PER_ID = 48  # counts, a bincount, the sort's keys and order (int64 each), t2d: what mapping costs per id


def checked_vocab(vocab: int, source: str) -> int:
    """``vocab`` if token ids can reach it and mapping it fits the memory budget; one line otherwise."""
    if not 0 < vocab <= MAX_VOCAB:
        raise BadInput(
            f"target vocabulary {vocab} (from {source}) must be between 1 and {MAX_VOCAB} (token ids "
            "are int32); pass the model's vocabulary with --target-vocab-size"
        )
    check_fits(
        vocab * BYTES_PER_ID,
        f"counting a target vocabulary of {vocab:,} (from {source})",
        "pass the model's real vocabulary size with --target-vocab-size",
    )
    return vocab


def target_vocab(reader: VariantReader, override: int | None) -> tuple[int, str]:
    """The target model's vocabulary size and where it was read (t2d must have exactly this length)."""
    vocab, source = _target_vocab(reader, override)
    return checked_vocab(vocab, source), source


def _target_vocab(reader: VariantReader, override: int | None) -> tuple[int, str]:
    if override is not None:
        return int(override), "--target-vocab-size"
    recipe = reader.record.prov.recipe
    path = or_none(recipe.model.path)
    cfg = Path(str(path)) / "config.json" if path else None
    if cfg is not None and cfg.is_file():
        try:
            data = loads_bounded(cfg.read_bytes())
        except (ValueError, UnicodeDecodeError) as e:  # not JSON, nested too deeply, not UTF-8
            raise BadInput(f"{cfg}: not a readable model config ({str(e)[:120]}); pass --target-vocab-size N") from None
        text = data.get("text_config") if isinstance(data, dict) else None
        v = data.get("vocab_size") if isinstance(data, dict) else None
        v = v or (text.get("vocab_size") if isinstance(text, dict) else None)
        if isinstance(v, int):
            return v, str(cfg)
    v = or_none(recipe.tokenizer.vocab_size)
    if not isinstance(v, int):
        raise BadInput(f"variant {reader.id} records no vocabulary size; pass --target-vocab-size N")
    return v, "recipe.tokenizer.vocab_size"


def write_vocab_map(target: str, size: int, out: str, target_vocab_size: int | None = None) -> VocabMapReport:
    """Count, map and write ``d2t-N.npy``/``t2d-N.npy`` (speculators), ``vocab_mapping-N.pt`` (SpecForge,
    EAGLE-3), ``token_freq.pt`` and the record ``vocab-map-N.json``; returns the record."""
    from hsstore.storage.store import Store, split_target

    check_outside_stores(out, "vocab-map folder")  # (before Path(out): an empty --out is not the current folder)
    path, selector = split_target(target)
    store = Store.open(path)
    reader = store.reader(store.select(selector))
    vocab, vocab_from = target_vocab(reader, target_vocab_size)
    counts, n_samples = token_counts(reader, vocab)
    d2t, t2d = vocab_mapping(counts, size)
    root = Path(out)
    outputs = (
        (f"d2t-{size}.npy", _npy(d2t.numpy())),
        (f"t2d-{size}.npy", _npy(t2d.numpy())),
        (f"vocab_mapping-{size}.pt", torch_bytes({"d2t": d2t, "t2d": t2d})),
        ("token_freq.pt", torch_bytes({int(i): int(counts[i]) for i in np.flatnonzero(counts)})),
    )
    held = hold_vocab_folder(root, path, reader.id, [n for n, _ in outputs] + [record_name(size)], size)
    try:
        return _write_held(root, outputs, reader, path, size, vocab, vocab_from, counts, t2d, n_samples)
    finally:
        held.release()


def _write_held(
    root: Path,
    outputs: Sequence[tuple[str, bytes]],
    reader: VariantReader,
    path: str,
    size: int,
    vocab: int,
    vocab_from: str,
    counts: np.ndarray,
    t2d: torch.Tensor,
    n_samples: int,
) -> VocabMapReport:
    """Write the files, then the record that says they belong together (vocab_folder holds the folder)."""
    total = int(counts.sum())
    written: list[VocabMapReport] = []

    def with_files(files: dict[str, str]) -> bytes:
        written.append(
            VocabMapReport(
                store=path,
                variant=reader.id,
                tokenizer_fingerprint=reader.record.prov.recipe.tokenizer.fingerprint,
                draft_vocab_size=size,
                target_vocab_size=vocab,
                target_vocab_from=vocab_from,
                samples=n_samples,
                loss_tokens=total,
                distinct_tokens=int((counts > 0).sum()),
                coverage=float(counts[t2d.numpy()].sum() / total) if total else 0.0,
                files=files,
            )
        )
        return json.dumps(written[-1].to_dict(), indent=1, sort_keys=True).encode()

    write_together(root, list(outputs), record_name(size), with_files)
    return written[-1]


def _npy(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()
