"""Data lineage: every build leaves records in the store saying what it read, what it did and how it ended.

Under ``builds/<build_id>/`` (hsstore.storage.layout) each rank writes a BuildRecord when it starts
(``r<rank>-start.json``: the manifest as resolved, every data file's size and content hash, the recipe,
the input counts and its share) and another when it ends (``r<rank>-end.json``: the outcome, what each
worker built, what is committed, the error of a failed or interrupted build). Nothing is replaced or
removed: a build killed outright leaves its start record alone, which says so. Rank 0 also writes
``rows.jsonl``, one RowIssue per input row the build did not take as it was (rejected, duplicate,
truncated: file, 1-based row, reason; past 10,000 of one reason, one naming the first of the rest and how
many: capture.inputs.row_report). The build id starts with the UTC start time, so records sort by
time; under torchrun rank 0 draws it and every rank uses it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

from hsstore.core.errors import BadInput, BuildFailed
from hsstore.core.keys import fingerprint, hash_file, hash_files, tree_files
from hsstore.core.schema.build import BuildRecord, DataFile, InputCounts, VariantResult
from hsstore.core.schema.manifest import Manifest
from hsstore.storage import layout

_ID_BYTES = 32  # a build id, padded, as broadcast between ranks


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


def new_build_id() -> str:
    """``20261201T031500Z-3fa2b1c0``: when (UTC) and a random part."""
    return f"{_dt.datetime.now(_dt.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def agree_build_id(group: Any, rank: int, alone: str | None = None) -> str:
    """Rank 0's new build id, on every rank (``group``: torch.distributed or None for one process, which
    takes ``alone`` when given)."""
    if group is None:
        return alone or new_build_id()
    import torch

    buf = torch.zeros(_ID_BYTES, dtype=torch.uint8)
    if rank == 0:
        raw = new_build_id().encode("ascii")
        buf[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    work = group.broadcast(buf, src=0, async_op=True)
    while not work.is_completed():  # polled, so a stop signal is not held until it ends
        time.sleep(0.05)
    work.wait()
    return bytes(buf.tolist()).rstrip(b"\0").decode("ascii")


def data_files(paths: Sequence[str]) -> list[DataFile]:
    """Each data file's size and content hash (a save_to_disk folder: of the list of its files)."""
    out = []
    for p in paths:
        if Path(p).is_dir():
            files = tree_files(p)
            hashed = hash_files(files)
            listing = [[f.relative_to(p).as_posix(), hashed[str(f)].size, hashed[str(f)].xxh3_128] for f in files]
            out.append(
                DataFile(
                    path=p, size=sum(h.size for h in hashed.values()), xxh3_128=fingerprint(listing), files=len(files)
                )
            )
        elif Path(p).is_file():
            h = hash_file(p)
            out.append(DataFile(path=p, size=h.size, xxh3_128=h.xxh3_128))
        else:
            raise BadInput(f"data file {p!r} does not exist; check [data] files (relative to the manifest)")
    return out


class Lineage:
    """One rank's records of one build, in ``store`` (an hsstore.storage.store.Store)."""

    def __init__(self, store: Any, location: str, start: BuildRecord, issues: Sequence[Any]) -> None:
        self.store, self.location, self.start = store, location.rstrip("/"), start
        self.issues = issues  # hsstore.core.schema.build.RowIssue records (rank 0 writes them)

    @classmethod
    def begin(
        cls,
        store: Any,
        location: str,
        m: Manifest,
        *,
        build_id: str,
        rank: int,
        world: int,
        recipe: Any,
        report: Any,
        samples: int,
        share_samples: int,
        share_tokens: int,
        started_at: str,
    ) -> Lineage:
        """Hash the data files and write the start record (and, on rank 0, the rows report)."""
        issues = list(getattr(report, "issues", []))
        rows = layout.lineage_rows_key(build_id) if issues else None
        start = BuildRecord(
            build_id=build_id,
            rank=rank,
            world_size=world,
            outcome="running",
            started_at=started_at,
            host=socket.gethostname(),
            pid=os.getpid(),
            hsstore_version=_version(),
            command=list(sys.argv),
            manifest=m,
            data_files=data_files(m.data_files),
            recipe=recipe,
            inputs=InputCounts.from_dict(report.to_dict(), "input report"),
            samples=samples,
            share_samples=share_samples,
            share_tokens=share_tokens,
            rows_report=rows,
        )
        lineage = cls(store, location, start, issues)
        if rank == 0 and rows is not None:
            store.io.put_if_absent(rows, "".join(json.dumps(i.to_dict()) + "\n" for i in issues).encode())
        lineage._put("start", start)
        return lineage

    def end(
        self,
        outcome: str,
        *,
        variants: Sequence[VariantResult] = (),
        committed: dict[str, int] | None = None,
        complete: dict[str, bool] | None = None,
        error: str | None = None,
    ) -> None:
        """Write the end record: how the build ended, what each worker built, what is committed."""
        self._put(
            "end",
            self.start.replace(
                outcome=outcome,
                finished_at=now(),
                error=error,
                variants=list(variants),
                committed=dict(committed or {}),
                complete=complete,
            ),
        )

    @overload
    def where(self, key: str) -> str: ...
    @overload
    def where(self, key: None) -> None: ...
    @overload
    def where(self, key: str | None) -> str | None: ...

    def where(self, key: str | None) -> str | None:
        """Where a key of this store is, for people and scripts."""
        return None if key is None else f"{self.location}/{key}"

    @property
    def record_key(self) -> str:
        return layout.lineage_record_key(self.start.build_id, self.start.rank, "end")

    def _put(self, phase: str, record: BuildRecord) -> None:
        key = layout.lineage_record_key(record.build_id, record.rank, phase)
        if not self.store.io.put_if_absent(key, json.dumps(record.to_dict(), indent=1).encode()):
            raise BuildFailed(
                f"build record {key} exists already; build ids are unique, so the store holds "
                "another build's record under this one's id"
            )


def _version() -> str:
    from hsstore import __version__

    return __version__
