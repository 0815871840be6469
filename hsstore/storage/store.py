"""The Store: open/create a Zarr v3 hierarchy of variants over a back end, list, select and record them."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsstore.core.dtypes import STORED
from hsstore.core.errors import BadInput, CorruptData, HsstoreError, StoreNotFound, UnsupportedFormat
from hsstore.core.outputs import expand_user
from hsstore.core.provenance_match import variant_id
from hsstore.core.schema.provenance import Provenance, Storage
from hsstore.core.schema.store_records import CommitRecord, GroupMeta, VariantRecord
from hsstore.core.selectors import select
from hsstore.storage import commits, layout, leases, names
from hsstore.storage.backend import Backend
from hsstore.storage.codecs import REGISTRY
from hsstore.storage.fileio import convert_strict, group_json, parse_json
from hsstore.storage.leases import Lease
from hsstore.storage.local import LocalBackend
from hsstore.storage.reader import VariantReader


@dataclass(frozen=True)
class Variant:
    """A committed variant as listed by ``Store.variants``."""

    id: str
    provenance: dict[str, Any]
    n_samples: int
    n_tokens: int
    label: str | None = None


def is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def split_target(target: str) -> tuple[str, str | None]:
    """``"store.zarr#dtype=bf16"`` -> ``("store.zarr", "dtype=bf16")``. A path that exists as written is
    the store even if it holds a ``#``; otherwise the selector follows the last ``#`` (selectors never
    hold one), so ``runs#3/store.zarr#dtype=bf16`` works too."""
    target = os.fspath(target)
    if "#" not in target or (not is_url(target) and os.path.lexists(target)):
        return target, None
    path, _, selector = target.rpartition("#")
    return path, selector


def open_backend(location: str, read_only: bool) -> Backend:
    """The back end for ``location``, chosen once: a local directory (a path or ``file://``) or a
    zarr/fsspec URL (``s3://``, ``memory://``, ...). zarr is imported only for a URL: a local store is
    read without it."""
    if is_url(location):
        from hsstore.storage.remote import ZarrBackend

        return ZarrBackend.from_url(location, read_only)
    return LocalBackend(location[len("file://") :] if location.startswith("file://") else location)


def group_attributes(raw: bytes, what: str) -> dict[str, Any]:
    """The attributes of a zarr group document; CorruptData if it is not one."""
    meta = convert_strict(parse_json(raw, what), GroupMeta, what)
    if meta.node_type != "group":
        raise CorruptData(f"{what}: a zarr {meta.node_type!r} where the format has a group")
    return meta.attributes


class Store:
    """An hsstore store: one Zarr v3 group holding variants of hidden states of samples."""

    def __init__(self, io: Backend, location: str) -> None:
        self.io = io
        self.location = location
        self._readers: dict[str, VariantReader] = {}
        self.created = False  # this Store object wrote the store's root record (it made the store)
        self._held: Lease | None = None  # a local store written into: held until this object goes

    @property
    def is_local(self) -> bool:
        return self.io.is_local

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str] | Backend, mode: str = "r") -> Store:
        """Open an existing store (a path, a URL or a back end); ``mode="a"`` to write into it. (Readers
        count the bytes they read: ``VariantReader.bytes_read``.)"""
        if isinstance(path, Backend):
            store = cls(path, path.location)
            store._check_root()
            return store
        path = expand_user(os.fspath(path))
        if not is_url(path):
            p = Path(path)
            if not p.exists():
                raise StoreNotFound(f"no store at {path!r}; build one with `hsstore build MANIFEST --store {path}`")
            if not p.is_dir():
                raise BadInput(f"store path {path!r} is a file, not a store directory; pass the store's folder")
        store = cls(open_backend(path, read_only=(mode == "r")), path)
        store._check_root()
        if mode != "r" and not is_url(path):
            store._hold(path)
        return store

    @classmethod
    def create(cls, path: str | os.PathLike[str] | Backend) -> Store:
        """Create a store (or open the existing hsstore store at ``path``, a path, URL or back end) for writing."""
        if isinstance(path, Backend):
            store = cls(path, path.location)
        else:
            path = expand_user(os.fspath(path))
            store = cls(open_backend(path, read_only=False), path)
            if not is_url(path):
                _prepare_directory(Path(path))
                store._hold(path)
        if store.io.get(layout.root_meta()) is None:
            root = {layout.ROOT_ATTR: {"format_version": layout.FORMAT_VERSION, "kind": "hidden-state store"}}
            store.created = store.io.put_if_absent(layout.root_meta(), group_json(root))
            store.io.put_if_absent(layout.variants_meta(), group_json({}))
        store._check_root()
        return store

    def _hold(self, path: str) -> None:
        try:
            self._held = leases.hold_folder(path)
        except OSError as e:
            raise BadInput(f"cannot open store directory {path!r}: {e.strerror or e}; choose a writable path") from None

    def discard_if_unused(self) -> bool:
        """Remove the store if this object made it, it holds nothing but its empty root and variants group, and
        no other command has it open
        for writing (a failed command's cleanup: it never removes what another command wrote). Returns
        whether it was removed."""
        if not (self.created and self._held is not None and leases.take_folder_alone(self._held)):
            return False
        if [v for v in self.io.list_dir(layout.variants_dir()) if v != layout.META]:
            return False
        if set(os.listdir(self.location)) - {layout.META, layout.variants_dir()}:  # e.g. checkpointed replies
            return False
        shutil.rmtree(self.location, ignore_errors=True)
        return True

    def _check_root(self) -> None:
        raw = self.io.get(layout.root_meta())
        if raw is None:
            raise StoreNotFound(f"{self.location!r} is not an hsstore store (no zarr.json); check the path")
        info = group_attributes(raw, f"{self.location}/zarr.json").get(layout.ROOT_ATTR)
        if not isinstance(info, dict) or "format_version" not in info:
            raise StoreNotFound(
                f"{self.location!r} is a zarr group but not an hsstore store (no attributes.hsstore); check the path"
            )
        version = info["format_version"]
        if not isinstance(version, str) or not version.split(".")[0].isdigit():
            raise CorruptData(
                f"{self.location}/zarr.json: format_version = {version!r}: expected a string such as '1.0'"
            )
        if version.split(".")[0] != layout.FORMAT_VERSION.split(".")[0]:
            raise UnsupportedFormat(
                f"{self.location!r} has hsstore format version {version}, this hsstore reads "
                f"{layout.FORMAT_VERSION.split('.')[0]}.x; upgrade hsstore (pip install -U hsstore)"
            )
        self.format_version = version

    # ---- variants ------------------------------------------------------------------------------
    def variant_ids(self) -> list[str]:
        """Ids of variants with at least one commit record (names the format cannot hold are skipped:
        ``verify`` reports them)."""
        return [
            v
            for v in self.io.list_dir(layout.variants_dir())
            if layout.is_name(v) and v != layout.META and self.io.list(layout.commits_prefix(v))
        ]

    def variant_record(self, vid: str) -> VariantRecord:
        key = layout.variant_meta(vid)
        raw = self.io.get(key)
        if raw is None:
            raise StoreNotFound(f"variant {vid!r} is not in store {self.location!r}")
        what = f"variant {vid} record ({key})"
        attrs = group_attributes(raw, what)
        if layout.VARIANT_ATTR not in attrs:
            raise CorruptData(f"{what} lacks attributes.{layout.VARIANT_ATTR}; run `hsstore verify`")
        rec = VariantRecord.from_dict(attrs[layout.VARIANT_ATTR], what)
        if rec.id != vid:
            raise CorruptData(f"{what} names variant {rec.id!r}, not its directory {vid!r} (renamed or copied?)")
        _check_readable(rec, what, CorruptData)
        return rec

    @property
    def variants(self) -> list[Variant]:
        out = []
        for vid in self.variant_ids():
            r = self.reader(vid)
            out.append(Variant(vid, r.record.provenance, len(r.refs), r.n_tokens))
        return out

    def provenances(self, skip_unreadable: bool = False) -> dict[str, dict[str, Any]]:
        """Variant id -> its provenance; ``skip_unreadable``: leave out a variant whose record cannot be read
        (verify reports it) instead of raising."""
        out = {}
        for vid in self.variant_ids():
            try:
                out[vid] = self.variant_record(vid).provenance
            except HsstoreError:
                if not skip_unreadable:
                    raise
        return out

    def select(self, selector: str | None) -> str:
        """The id of the one committed variant ``selector`` names (id prefix, label or key=value pairs)."""
        return select(self.provenances(), selector, where=self.location, labels=self.labels())

    # ---- labels (hsstore.storage.names) ------------------------------------------------------
    def labels(self) -> dict[str, str]:
        """Variant id -> its label."""
        return names.labels(self)

    def set_label(self, vid: str, label: str, by: str) -> str | None:
        """Give variant ``vid`` the label ``label`` (atomic; BadInput if another variant holds it); returns
        its previous label."""
        return names.set_label(self, vid, label, by)

    def create_variant(
        self,
        provenance: dict[str, Any],
        layers: dict[str, list[int]],
        hidden_size: int,
        dtype: str,
        codec: str,
        chunk_tokens: int,
        precision: str | None = None,
    ) -> str:
        """Record a variant (idempotent: the same provenance gives the same id and keeps the first record).
        ``precision``: how states are stored when not as computed (e.g. "fp8-e4m3"); the provenance must
        say so too (``environment.storage``), so it is part of the id. ``provenance`` must decode as a
        ``Provenance`` record (BadInput naming the field if not): every reader reads it typed."""
        storage = Provenance.from_dict(provenance, "variant provenance", BadInput).environment.storage
        stored = storage.precision if isinstance(storage, Storage) else None
        if stored != precision:
            raise ValueError(
                f"precision {precision!r} but the provenance records environment.storage.precision {stored!r}"
            )
        vid = variant_id(provenance)
        if not self.io.exists(layout.variant_meta(vid)):  # one model per store unless asked
            names.check_model(self, provenance)
        plain = json.loads(json.dumps(provenance))  # plain JSON values (a version string may be a str subclass)
        fields = {
            "id": vid,
            "provenance": plain,
            "layers": layers,
            "hidden_size": hidden_size,
            "dtype": dtype,
            "codec": codec,
            "chunk_tokens": chunk_tokens,
            **({"precision": precision} if precision else {}),
        }
        rec = VariantRecord.from_dict(fields, f"variant {vid}", BadInput)
        _check_readable(rec, f"variant {vid}", BadInput)
        if not self.io.put_if_absent(layout.variant_meta(vid), group_json({layout.VARIANT_ATTR: rec.to_dict()})):
            have = self.variant_record(vid)
            if (
                have.layers != layers
                or have.hidden_size != hidden_size
                or have.dtype != dtype
                or have.stored_precision != precision
            ):
                raise CorruptData(f"variant {vid} exists with other layers/geometry; the store is inconsistent")
        self.io.put_if_absent(layout.units_meta(vid), group_json({}))
        return vid

    def reader(self, vid: str, refresh: bool = False) -> VariantReader:
        if refresh or vid not in self._readers:
            self._readers[vid] = VariantReader(self, vid)
        return self._readers[vid]

    def commits(self, vid: str) -> tuple[list[CommitRecord], list[tuple[str, str]]]:
        """The variant's committed units' records (by unit id) and the records that commit nothing (key, why)."""
        found = commits.scan(self.io, vid)
        return list(found.committed.values()), found.bad


def _check_readable(rec: VariantRecord, what: str, error: type[HsstoreError]) -> None:
    """The codec and dtype a variant record names must be ones this hsstore reads (written and read alike)."""
    if rec.codec not in REGISTRY or rec.dtype not in STORED:
        raise error(
            f"{what}: codec {rec.codec!r} / dtype {rec.dtype!r} is not one this hsstore reads "
            f"(codecs: {', '.join(REGISTRY)}; dtypes: {', '.join(STORED)})"
        )


def enclosing_store(p: Path) -> Path | None:
    """The hsstore store a folder at ``p`` would lie inside (a folder above it holding an hsstore root
    record), if any."""
    for up in Path(os.path.realpath(p)).parents:
        try:
            raw = (up / layout.root_meta()).read_bytes() if (up / layout.root_meta()).is_file() else None
        except OSError:
            continue
        if raw is not None and b'"' + layout.ROOT_ATTR.encode() + b'"' in raw:
            try:
                if isinstance(group_attributes(raw, str(up)).get(layout.ROOT_ATTR), dict):
                    return up
            except CorruptData:
                continue
    return None


def check_not_nested(p: Path) -> None:
    """Refuse (exit 2) a store path inside another store: stores do not nest."""
    outer = enclosing_store(p)
    if outer is not None:
        raise BadInput(
            f"store path {str(p)!r} is inside the hsstore store {str(outer)!r} (stores do not nest: gc "
            "of the outer one would count the inner one as its debris); choose a path outside it"
        )


def _prepare_directory(p: Path) -> None:
    """Refuse a file, a foreign non-empty directory or a place inside another store as a new store's
    place; make the directory."""
    path = str(p)
    check_not_nested(p)
    if p.exists() and not p.is_dir():
        raise BadInput(f"store path {path!r} is a file; choose a directory path for the store")
    others = [c for c in p.iterdir() if not c.name.startswith(layout.TMP_PREFIX)] if p.is_dir() else []
    if others and not (p / layout.root_meta()).exists():  # a racing creator's temp file is not "others"
        raise BadInput(
            f"store path {path!r} is a non-empty directory that is not an hsstore store; "
            "choose a new or empty directory"
        )
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"cannot create store directory {path!r}: {e.strerror}; choose a writable path") from None
    if not os.access(p, os.W_OK):
        raise BadInput(f"store directory {path!r} is read-only; choose a writable path or fix permissions")


# --- What hsstore writes outside its stores stays outside them: a report (``--json``, ``--plot``), an export


def check_outside_stores(path: str, what: str) -> None:
    """Refuse (exit 2) an output file or folder ``path`` that is empty (an unset shell variable: it would
    mean the current folder), an hsstore store or inside one."""
    if not path.strip():
        raise BadInput(f"{what} is an empty path ({path!r}); name the file or folder to write")
    outer = enclosing_store(Path(os.path.expanduser(path)) / layout.root_meta())  # the store itself, or one above
    if outer is not None:
        raise BadInput(
            f"{what} {path!r} is inside the hsstore store {str(outer)!r}; hsstore writes reports and "
            "exports outside its stores — choose a path outside it"
        )


def check_store_outside_source(store: str, source: str) -> None:
    """Refuse (exit 2) a store inside the folder an import reads, or that folder inside the store: the store's
    files would become files of the tool's cache (EAGLE's loader loads every file of its folder), or the
    import would read the store's own files."""
    if "://" in store:
        return
    s, src = os.path.realpath(os.path.expanduser(store)), os.path.realpath(os.path.expanduser(source))
    inside = s == src or s.startswith(src.rstrip(os.sep) + os.sep) or src.startswith(s.rstrip(os.sep) + os.sep)
    if inside:
        raise BadInput(
            f"store {store!r} and the import folder {source!r} lie one inside the other; the store's files "
            "would become part of the tool's cache — put the store outside the folder"
        )
