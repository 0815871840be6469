"""Where everything lives inside a store: key names only (and gc's grace for a writer's leftovers), no I/O.
Every key hsstore reads or writes is built here, and ``parse_key`` names what a key is (verify checks a
tree against it).

    zarr.json                                   root group; attributes.hsstore = {format_version, ...}
    variants/zarr.json                          group of variants
    variants/<vid>/zarr.json                    variant group; attributes.hsstore_variant = {provenance, ...}
    variants/<vid>/units/zarr.json              group of units
    variants/<vid>/units/<uid>/zarr.json        one unit of work (one writer), attributes = writer info
    variants/<vid>/units/<uid>/input_ids        int32  [N]      tokens of all samples, concatenated
    variants/<vid>/units/<uid>/loss_mask        uint8  [N]
    variants/<vid>/units/<uid>/layer_<i>        [N, H] states of decoder layer i (one array per layer);
                                                uint8 e4m3 codes in variants stored as fp8-e4m3
    variants/<vid>/units/<uid>/scale_<i>        float32 [N, 1] per-token scales of layer i (fp8-e4m3 only)
    variants/<vid>/commits/<uid>.json           commit record, written last and atomically
    variants/<vid>/quarantine/<uid>.json        a commit record taken back by verify --quarantine (the unit failed
                                                its checks; its files are debris for gc, its samples unbuilt)
    variants/<vid>/builds/<build>.json          "build complete" records
    builds/<build_id>/r<rank>-start.json        lineage: a build record written when a rank starts ...
    builds/<build_id>/r<rank>-end.json          ... and one written when it ends (never replaced)
    builds/<build_id>/rows.jsonl                lineage: every rejected, duplicate, truncated input row
    labels/<n>.json                             a variant's label given or changed, n = 0, 1, ... (never replaced)
    models/<name>.json                          a model let into a store of another model (--another-model)
    builds/<build_id>/gen-<config>-<n>.jsonl    lineage: the replies one batch of a regenerating build made
    builds/<build_id>/ledger.jsonl              lineage: one record per regenerated reply the build used

An array ``a`` of ``ndim`` dimensions is two files: ``a/zarr.json`` and its one shard ``a/c/0[/0...]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FORMAT_VERSION = "1.0"
ROOT_ATTR = "hsstore"
VARIANT_ATTR = "hsstore_variant"
UNIT_ATTR = "hsstore_unit"
META = "zarr.json"
TOKEN_ARRAYS = ("input_ids", "loss_mask")
TMP_PREFIX = ".tmp-"  # temporary files of atomic puts and unit folders being claimed (gc sweeps old ones)
UNIT_GRACE_SECONDS = 3600.0  # gc's default: another host's uncommitted unit older than this is debris
_SAFE = re.compile(r"^[0-9a-zA-Z_.-]{1,128}$")
_LAYER = re.compile(r"^layer_(0|[1-9][0-9]{0,5})$")
_SCALE = re.compile(r"^scale_(0|[1-9][0-9]{0,5})$")  # per-token scales of a quantized layer
_LABEL = re.compile(r"^[0-9]{8}\.json$")  # label_key's names
_GENERATIONS = re.compile(r"^gen-[0-9a-f]{16}-(0|[1-9][0-9]{0,8})\.jsonl$")  # generations_key's names
_LINEAGE = re.compile(r"^r(0|[1-9][0-9]{0,6})-(start|end)\.json$")  # lineage_record_key's names


def check_name(name: str, what: str) -> str:
    """Refuse names that could escape the store (``..``, ``/``) or be odd on object stores."""
    if not _SAFE.match(name) or name in (".", "..") or name.startswith("."):
        raise ValueError(f"{what} {name!r} is not a safe name (letters, digits, '_', '-', '.'; not '..')")
    return name


def is_name(name: str) -> bool:
    try:
        check_name(name, "name")
    except ValueError:
        return False
    return True


def root_meta() -> str:
    return META


def variants_meta() -> str:
    return f"variants/{META}"


def variants_dir() -> str:
    return "variants"


def variant_prefix(vid: str) -> str:
    return f"variants/{check_name(vid, 'variant id')}"


def variant_meta(vid: str) -> str:
    return f"{variant_prefix(vid)}/{META}"


def units_dir(vid: str) -> str:
    return f"{variant_prefix(vid)}/units"


def units_meta(vid: str) -> str:
    return f"{units_dir(vid)}/{META}"


def unit_prefix(vid: str, uid: str) -> str:
    return f"{units_dir(vid)}/{check_name(uid, 'unit id')}"


def unit_key(vid: str, uid: str, rel: str) -> str:
    """A file of a unit, ``rel`` relative to the unit (as commit records list them)."""
    return f"{unit_prefix(vid, uid)}/{rel}"


def commits_prefix(vid: str) -> str:
    return f"{variant_prefix(vid)}/commits/"


def commit_key(vid: str, uid: str) -> str:
    return f"{commits_prefix(vid)}{check_name(uid, 'unit id')}.json"


def builds_prefix(vid: str) -> str:
    return f"{variant_prefix(vid)}/builds/"


def quarantine_key(vid: str, uid: str) -> str:
    return f"{variant_prefix(vid)}/quarantine/{check_name(uid, 'unit id')}.json"


def build_key(vid: str, name: str) -> str:
    return f"{builds_prefix(vid)}{check_name(name, 'build record name')}.json"


def lineage_prefix(build_id: str) -> str:
    return f"builds/{check_name(build_id, 'build id')}/"


def lineage_record_key(build_id: str, rank: int, phase: str) -> str:
    """A rank's build record, ``phase`` "start" or "end"."""
    if phase not in ("start", "end"):
        raise ValueError(f"build record phase {phase!r} is not start or end")
    return f"{lineage_prefix(build_id)}r{int(rank)}-{phase}.json"


def lineage_rows_key(build_id: str) -> str:
    return f"{lineage_prefix(build_id)}rows.jsonl"


def labels_prefix() -> str:
    return "labels/"


def label_key(n: int) -> str:
    """The ``n``-th label record (the store's labels are its label records replayed in order)."""
    return f"{labels_prefix()}{int(n):08d}.json"


def label_number(key: str) -> int:
    return int(key.rsplit("/", 1)[-1][:-5])


def models_prefix() -> str:
    return "models/"


def model_key(name: str) -> str:
    return f"{models_prefix()}{check_name(name, 'model record name')}.json"


def generations_key(build_id: str, config: str, n: int) -> str:
    """The ``n``-th batch of replies a regenerating build generated under configuration ``config``."""
    return f"{lineage_prefix(build_id)}gen-{config[:16]}-{int(n)}.jsonl"


def ledger_key(build_id: str) -> str:
    return f"{lineage_prefix(build_id)}ledger.jsonl"


def layer_array(layer: int) -> str:
    return f"layer_{int(layer)}"


def scale_array(layer: int) -> str:
    """The per-token scales of a quantized layer (hsstore.core.quant)."""
    return f"scale_{int(layer)}"


def array_files(name: str, ndim: int) -> tuple[str, str]:
    """(metadata, shard) keys of array ``name`` relative to its unit."""
    return f"{name}/{META}", f"{name}/c/" + "/".join(["0"] * ndim)


def unit_files(layers: list[int], quantized: bool = False) -> set[str]:
    """Every file of a unit that stores ``layers`` (``quantized``: with their per-token scale arrays),
    relative to the unit."""
    out = {META}
    arrays = [(a, 1) for a in TOKEN_ARRAYS] + [(layer_array(i), 2) for i in layers]
    arrays += [(scale_array(i), 2) for i in layers] if quantized else []
    for name, ndim in arrays:
        out.update(array_files(name, ndim))
    return out


@dataclass(frozen=True)
class Key:
    """What a key is: ``kind`` and the names in it (``rel`` is a unit file relative to its unit)."""

    kind: str  # root-meta variants-meta variant-meta units-meta unit-file commit quarantine build lineage
    # lineage-rows lineage-generations lineage-ledger label model temp unknown
    vid: str | None = None
    uid: str | None = None
    rel: str | None = None


def parse_key(key: str) -> Key:
    """The inverse of the builders above; ``Key("unknown")`` for anything hsstore does not write."""
    parts = key.split("/")
    if any(p.startswith(TMP_PREFIX) for p in parts):  # a temporary file, or a unit folder being claimed
        return Key("temp")
    fixed = {root_meta(): "root-meta", variants_meta(): "variants-meta"}
    if key in fixed:
        return Key(fixed[key])
    if len(parts) == 3 and parts[0] == "builds" and is_name(parts[1]):
        if parts[2] == lineage_rows_key(parts[1]).rsplit("/", 1)[-1]:
            return Key("lineage-rows")
        if _LINEAGE.match(parts[2]):
            return Key("lineage")
        if _GENERATIONS.match(parts[2]):
            return Key("lineage-generations")
        if parts[2] == ledger_key(parts[1]).rsplit("/", 1)[-1]:
            return Key("lineage-ledger")
    if len(parts) == 2 and parts[0] == "labels" and _LABEL.match(parts[1]):
        return Key("label")
    if len(parts) == 2 and parts[0] == "models" and parts[1].endswith(".json") and is_name(parts[1][:-5]):
        return Key("model")
    if len(parts) < 3 or parts[0] != variants_dir() or not is_name(parts[1]):
        return Key("unknown")
    vid, rest = parts[1], parts[2:]
    if rest == [META]:
        return Key("variant-meta", vid)
    if rest == ["units", META]:
        return Key("units-meta", vid)
    if (
        len(rest) == 2
        and rest[0] in ("commits", "builds", "quarantine")
        and rest[1].endswith(".json")
        and is_name(rest[1][:-5])
    ):
        kind = {"commits": "commit", "builds": "build", "quarantine": "quarantine"}[rest[0]]
        return Key(kind, vid, rest[1][:-5] if kind != "build" else None)
    if len(rest) >= 3 and rest[0] == "units" and is_name(rest[1]) and _is_unit_file(rest[2:]):
        return Key("unit-file", vid, rest[1], "/".join(rest[2:]))
    return Key("unknown", vid)


def _examples() -> list[str]:
    """One key of every kind the format has (placeholder names)."""
    return [
        root_meta(),
        variants_meta(),
        variant_meta("v"),
        units_meta("v"),
        commit_key("v", "u"),
        quarantine_key("v", "u"),
        build_key("v", "b"),
        lineage_record_key("b", 0, "start"),
        lineage_rows_key("b"),
        label_key(0),
        model_key("m"),
        generations_key("b", "0" * 16, 0),
        ledger_key("b"),
        *(unit_key("v", "u", rel) for rel in unit_files([0], quantized=True)),
    ]


def is_dir_key(key: str) -> bool:
    """Whether the format has a directory at ``key``: completed by the tail of some key of the format, it
    is a key ``parse_key`` knows."""
    parts = key.split("/")
    for example in _examples():
        tail = example.split("/")[len(parts) :]
        if tail and parse_key("/".join(parts + tail)).kind not in ("unknown", "temp"):
            return True
    return False


def _is_unit_file(rel: list[str]) -> bool:
    if rel == [META]:
        return True
    name, ndim = rel[0], 1 if rel[0] in TOKEN_ARRAYS else 2 if (_LAYER.match(rel[0]) or _SCALE.match(rel[0])) else 0
    return ndim > 0 and "/".join(rel) in array_files(name, ndim)
