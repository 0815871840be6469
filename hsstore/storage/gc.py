"""gc: remove uncommitted units (debris of crashed writers) without ever touching committed data."""

from __future__ import annotations

import datetime as _dt
import os
import socket
from typing import Any

from hsstore.storage import layout
from hsstore.storage.blobs import TMP_PREFIX
from hsstore.storage.records import parse_json
from hsstore.storage.store import Store


def _writer_alive(info: dict[str, Any]) -> bool | None:
    """True/False for a writer on this host, None if it ran elsewhere (unknown)."""
    if info.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(info["pid"]), 0)
    except (ProcessLookupError, KeyError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def collect_garbage(store: Store, grace_seconds: float = 3600.0, force: bool = False) -> dict[str, Any]:
    """Delete uncommitted units whose writer is dead (this host) or older than ``grace_seconds``.

    ``force`` deletes every uncommitted unit: only when no writer is running anywhere.
    """
    now = _dt.datetime.now(_dt.timezone.utc)
    removed, kept, nfiles = [], [], 0
    for vid in store.blobs.list_dir("variants"):
        if vid == "zarr.json":
            continue
        committed = {k.rsplit("/", 1)[-1][: -len(".json")] for k in store.blobs.list(layout.commits_prefix(vid))}
        for uid in store.blobs.list_dir(f"{layout.variant_prefix(vid)}/units"):
            if uid == "zarr.json" or uid in committed:
                continue
            prefix = f"{layout.variant_prefix(vid)}/units/{uid}"
            raw = store.blobs.get(f"{prefix}/zarr.json")
            info: dict[str, Any] = {}
            if raw is not None:
                try:
                    info = parse_json(raw, prefix).get("attributes", {}).get("hsstore_unit", {})
                except Exception:
                    info = {}
            alive = _writer_alive(info)
            try:
                started = _dt.datetime.fromisoformat(info["started_at"])
                age = (now - started).total_seconds()
            except (KeyError, ValueError, TypeError):
                age = float("inf")
            if force or alive is False or (alive is None and age > grace_seconds):
                # re-check: the writer may have committed since we listed
                if store.blobs.get(layout.commit_key(vid, uid)) is not None:
                    continue
                nfiles += store.blobs.delete_prefix(prefix)
                removed.append(f"{vid}/{uid}")
            else:
                kept.append(f"{vid}/{uid}")
    root = store.blobs.root
    if root is not None:  # temporary files of atomic puts a killed writer never renamed
        for tmp in root.rglob(f"{TMP_PREFIX}*"):
            if force or now.timestamp() - tmp.stat().st_mtime > min(grace_seconds, 600):
                tmp.unlink(missing_ok=True)
                nfiles += 1
    return {"removed_units": removed, "removed_files": nfiles, "kept_in_progress": kept}
