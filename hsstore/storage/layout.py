"""Where everything lives inside a store: key names only, no I/O.

    zarr.json                                   root group; attributes.hsstore = {format_version, ...}
    variants/<vid>/zarr.json                    variant group; attributes.hsstore_variant = {provenance, ...}
    variants/<vid>/units/<uid>/zarr.json        one unit of work (one writer), attributes = writer info
    variants/<vid>/units/<uid>/input_ids        int32  [N]      tokens of all samples, concatenated
    variants/<vid>/units/<uid>/loss_mask        uint8  [N]
    variants/<vid>/units/<uid>/layer_<i>        [N, H] states of decoder layer i (one array per layer)
    variants/<vid>/commits/<uid>.json           commit record, written last and atomically
    variants/<vid>/builds/<build>.json          "build complete" records
    builds/<build_id>/r<rank>-start.json        lineage: a build record written when a rank starts ...
    builds/<build_id>/r<rank>-end.json          ... and one written when it ends (never replaced)
    builds/<build_id>/rows.jsonl                lineage: every rejected, duplicate, truncated input row
"""

from __future__ import annotations

import re

FORMAT_VERSION = "1.0"
ROOT_ATTR = "hsstore"
VARIANT_ATTR = "hsstore_variant"
_SAFE = re.compile(r"^[0-9a-zA-Z_.-]{1,128}$")


def check_name(name: str, what: str) -> str:
    """Refuse names that could escape the store (``..``, ``/``) or be odd on object stores."""
    if not _SAFE.match(name) or name in (".", "..") or name.startswith("."):
        raise ValueError(f"{what} {name!r} is not a safe name (letters, digits, '_', '-', '.'; not '..')")
    return name


def variant_prefix(vid: str) -> str:
    return f"variants/{check_name(vid, 'variant id')}"


def unit_prefix(vid: str, uid: str) -> str:
    return f"{variant_prefix(vid)}/units/{check_name(uid, 'unit id')}"


def commit_key(vid: str, uid: str) -> str:
    return f"{variant_prefix(vid)}/commits/{check_name(uid, 'unit id')}.json"


def commits_prefix(vid: str) -> str:
    return f"{variant_prefix(vid)}/commits/"


def builds_prefix(vid: str) -> str:
    return f"{variant_prefix(vid)}/builds/"


def lineage_prefix(build_id: str) -> str:
    return f"builds/{check_name(build_id, 'build id')}/"


def lineage_record_key(build_id: str, rank: int, phase: str) -> str:
    """A rank's build record, ``phase`` "start" or "end"."""
    if phase not in ("start", "end"):
        raise ValueError(f"build record phase {phase!r} is not start or end")
    return f"{lineage_prefix(build_id)}r{int(rank)}-{phase}.json"


def lineage_rows_key(build_id: str) -> str:
    return f"{lineage_prefix(build_id)}rows.jsonl"


def layer_array(layer: int) -> str:
    return f"layer_{int(layer)}"
