"""gc: remove uncommitted units (debris of crashed writers) without ever touching committed data.

A unit is kept if any commit record names it or is named after it (hsstore.storage.commits), if its
writer holds its lease (hsstore.storage.leases: on a local disk a running writer's unit is kept even
with ``--force``), if its writer may still run, or if it cannot be removed safely: on a local disk gc never follows a symlink
and never leaves the store's root (hsstore.storage.local); such entries are reported, not removed.
``dry_run`` reports what would be removed and removes nothing.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import socket
from dataclasses import dataclass, field

from hsstore.core.errors import BadInput, CorruptData
from hsstore.core.schema.reports import GcReport, Skipped
from hsstore.core.schema.store_records import UnitInfo
from hsstore.storage import commits, layout
from hsstore.storage.backend import Backend
from hsstore.storage.store import Store, group_attributes

TEMP_GRACE_SECONDS = 600.0  # an atomic put renames its temp file within moments; older ones are debris


@dataclass
class _Tally:
    """What gc removed, kept and skipped so far (the GcReport it returns, while it counts)."""

    removed_units: list[str] = field(default_factory=list)
    removed_files: int = 0
    kept_in_progress: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def _writer_alive(info: UnitInfo | None) -> bool | None:
    """True/False for a writer on this host, None if it ran elsewhere or is unknown."""
    if info is None or info.host != socket.gethostname():
        return None
    try:
        os.kill(info.pid, 0)
    except (ProcessLookupError, ValueError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def _unit_info(io: Backend, vid: str, uid: str) -> UnitInfo | None:
    """The unit's writer record (None if absent or unreadable: then only age and --force decide)."""
    try:
        raw = io.get(layout.unit_key(vid, uid, layout.META))
        attrs = group_attributes(raw, f"unit {uid}") if raw is not None else {}
        return UnitInfo.from_dict(attrs[layout.UNIT_ATTR], f"unit {uid}") if layout.UNIT_ATTR in attrs else None
    except CorruptData:
        return None


def _is_debris(info: UnitInfo | None, grace_seconds: float, force: bool) -> bool:
    """Whether an uncommitted unit is a crashed writer's: its writer is dead, or it is older than the grace."""
    alive = _writer_alive(info)
    if force or alive is False:
        return True
    try:
        started = _dt.datetime.fromisoformat(info.started_at) if info is not None else None
        age = (_dt.datetime.now(_dt.UTC) - started).total_seconds() if started else float("inf")
    except (ValueError, TypeError):
        age = float("inf")
    return alive is None and age > grace_seconds


def collect_garbage(
    store: Store, grace_seconds: float = layout.UNIT_GRACE_SECONDS, force: bool = False, dry_run: bool = False
) -> GcReport:
    """Delete uncommitted units whose writer is dead (this host) or older than ``grace_seconds``, and old
    temporary files. ``force`` deletes every uncommitted unit whose lease is free (on a local disk a running
    writer's unit is kept even so); on an object store, use it only when no writer runs anywhere."""
    if not (isinstance(grace_seconds, (int, float)) and math.isfinite(grace_seconds) and grace_seconds >= 0):
        raise BadInput(
            f"--grace {grace_seconds}: must be a number of seconds >= 0 (a shorter grace can remove a "
            "running writer's unit; use --force when no writer runs)"
        )
    io = store.io
    out = _Tally()
    for vid in io.list_dir(layout.variants_dir()):
        if vid == layout.META or not layout.is_name(vid):
            continue  # not a variant hsstore wrote: verify reports it, gc leaves it alone
        try:
            _collect_variant(io, vid, grace_seconds, force, dry_run, out)
        except (CorruptData, OSError) as e:
            out.skipped.append(Skipped(what=f"variant {vid}", why=str(e)))
    for key, age in io.temp_files():
        if force or age > min(grace_seconds, TEMP_GRACE_SECONDS):
            lease = io.lease_if_free(key)  # held while its writer writes it
            if lease is None:
                continue
            try:
                if not dry_run:
                    io.remove(key)
            finally:
                lease.release()
            out.removed_files += 1
    return GcReport(
        removed_units=out.removed_units,
        removed_files=out.removed_files,
        kept_in_progress=out.kept_in_progress,
        skipped=out.skipped,
        dry_run=dry_run,
    )


def _collect_variant(io: Backend, vid: str, grace_seconds: float, force: bool, dry_run: bool, out: _Tally) -> None:
    keep = commits.scan(io, vid).protected
    for uid in io.list_dir(layout.units_dir(vid)):
        if uid == layout.META or not layout.is_name(uid) or uid in keep:
            continue
        lease = io.lease_if_free(layout.unit_key(vid, uid, layout.META))
        if lease is None or not _is_debris(_unit_info(io, vid, uid), grace_seconds, force):
            if lease is not None:
                lease.release()
            out.kept_in_progress.append(f"{vid}/{uid}")  # its writer holds the lease, or may still run
            continue
        try:  # (holding the lease: no writer can claim the unit while it goes)
            if io.exists(layout.commit_key(vid, uid)):
                continue  # its writer committed since we looked
            prefix = layout.unit_prefix(vid, uid)
            files = io.list(prefix + "/")
            foreign = [k for k in files if layout.parse_key(k).kind not in ("unit-file", "temp")]
            if foreign:  # gc removes only what a writer of this store writes (not, say, a store put here)
                out.skipped.append(
                    Skipped(
                        what=f"unit {vid}/{uid}",
                        why=f"it holds {len(foreign)} file(s) hsstore "
                        f"does not write there, first {foreign[0]}; move them out, then re-run gc",
                    )
                )
                continue
            out.removed_files += len(files) if dry_run else io.remove_tree(prefix)
        except (CorruptData, OSError) as e:
            out.skipped.append(Skipped(what=f"unit {vid}/{uid}", why=str(e)))
            continue
        finally:
            lease.release()
        out.removed_units.append(f"{vid}/{uid}")
