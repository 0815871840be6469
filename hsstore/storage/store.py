"""The Store: open/create a Zarr v3 hierarchy of variants, list and select them, read committed samples."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from zarr.storage import FsspecStore, LocalStore

from hsstore.storage import layout
from hsstore.storage.blobs import TMP_PREFIX, Blobs
from hsstore.core.dtypes import from_stored
from hsstore.core.errors import BadInput, CorruptData, StoreNotFound, UnsupportedFormat
from hsstore.core.keys import sample_key
from hsstore.core.provenance import select, variant_id
from hsstore.storage.records import CommitRecord, VariantRecord, group_json, parse_json
from hsstore.storage.shardio import ShardReader
from hsstore.storage.stats import merge


@dataclass(frozen=True)
class Variant:
    """A committed variant as listed by ``Store.variants``."""

    id: str
    provenance: dict[str, Any]
    n_samples: int
    n_tokens: int


@dataclass(frozen=True)
class SampleRef:
    """Where one committed sample lives: its unit and the token range inside it."""

    key: str
    unit: str
    offset: int
    length: int


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def split_target(target: str) -> tuple[str, str | None]:
    """``"store.zarr#dtype=bf16"`` -> ``("store.zarr", "dtype=bf16")``."""
    path, sep, selector = str(target).partition("#")
    return path, (selector if sep else None)


class Store:
    """An hsstore store: one Zarr v3 group holding variants of hidden states of samples."""

    def __init__(self, zstore: Any, location: str) -> None:
        self.zstore = zstore
        self.location = location
        self.blobs = Blobs(zstore)
        self._readers: dict[str, VariantReader] = {}

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def _zarr_store(cls, path: str, read_only: bool) -> Any:
        if _is_url(path):
            # no listing cache: with several writers a cached listing hides their commits
            try:
                return FsspecStore.from_url(path, read_only=read_only, storage_options={"use_listings_cache": False})
            except TypeError:
                return FsspecStore.from_url(path, read_only=read_only)
        local = path[len("file://") :] if path.startswith("file://") else path
        return LocalStore(local, read_only=read_only)

    @classmethod
    def open(cls, path: str | os.PathLike[str], mode: str = "r", count_bytes: bool = False) -> Store:
        """Open an existing store; ``mode="a"`` to write into it; ``count_bytes`` to measure reads
        (``store.zstore.bytes_read``)."""
        path = os.fspath(path)
        if not _is_url(path):
            p = Path(path)
            if not p.exists():
                raise StoreNotFound(f"no store at {path!r}; build one with `hsstore build MANIFEST --store {path}`")
            if not p.is_dir():
                raise BadInput(f"store path {path!r} is a file, not a store directory; pass the store's folder")
        zstore = cls._zarr_store(path, read_only=(mode == "r"))
        if count_bytes:
            from hsstore.storage.iostats import CountingStore

            zstore = CountingStore(zstore)
        store = cls(zstore, path)
        store._check_root()
        return store

    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> Store:
        """Create a store (or open the existing hsstore store at ``path``) for writing."""
        path = os.fspath(path)
        if not _is_url(path):
            p = Path(path)
            if p.exists() and not p.is_dir():
                raise BadInput(f"store path {path!r} is a file; choose a directory path for the store")
            others = [c for c in p.iterdir() if not c.name.startswith(TMP_PREFIX)] if p.is_dir() else []
            if others and not (p / "zarr.json").exists():  # a racing creator's temp file is not "others"
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
        store = cls(cls._zarr_store(path, read_only=False), path)
        if store.blobs.get("zarr.json") is None:
            root = {layout.ROOT_ATTR: {"format_version": layout.FORMAT_VERSION, "kind": "hidden-state store"}}
            store.blobs.put_if_absent("zarr.json", group_json(root))
            store.blobs.put_if_absent("variants/zarr.json", group_json({}))
        store._check_root()
        return store

    def _check_root(self) -> None:
        raw = self.blobs.get("zarr.json")
        if raw is None:
            raise StoreNotFound(f"{self.location!r} is not an hsstore store (no zarr.json); check the path")
        meta = parse_json(raw, f"{self.location}/zarr.json")
        info = meta.get("attributes", {}).get(layout.ROOT_ATTR) if isinstance(meta, dict) else None
        if not isinstance(info, dict) or "format_version" not in info:
            raise StoreNotFound(
                f"{self.location!r} is a zarr group but not an hsstore store (no attributes.hsstore); check the path"
            )
        major = str(info["format_version"]).split(".")[0]
        if major != layout.FORMAT_VERSION.split(".")[0]:
            raise UnsupportedFormat(
                f"{self.location!r} has hsstore format version {info['format_version']}, this hsstore reads "
                f"{layout.FORMAT_VERSION.split('.')[0]}.x; upgrade hsstore (pip install -U hsstore)"
            )
        self.format_version = str(info["format_version"])

    # ---- variants ------------------------------------------------------------------------------
    def variant_ids(self) -> list[str]:
        """Ids of variants with at least one committed unit."""
        return [v for v in self.blobs.list_dir("variants") if v != "zarr.json" and self.blobs.list(layout.commits_prefix(v))]

    def variant_record(self, vid: str) -> VariantRecord:
        raw = self.blobs.get(f"{layout.variant_prefix(vid)}/zarr.json")
        if raw is None:
            raise StoreNotFound(f"variant {vid!r} is not in store {self.location!r}")
        meta = parse_json(raw, f"variant {vid} metadata")
        try:
            return VariantRecord.from_dict(meta["attributes"][layout.VARIANT_ATTR])
        except (KeyError, TypeError) as e:
            raise CorruptData(f"variant {vid} metadata lacks {e}; run `hsstore verify`") from None

    @property
    def variants(self) -> list[Variant]:
        out = []
        for vid in self.variant_ids():
            r = self.reader(vid)
            out.append(Variant(vid, r.record.provenance, len(r.refs), r.n_tokens))
        return out

    def select(self, selector: str | None) -> str:
        """The id of the one committed variant ``selector`` names (id prefix or key=value pairs)."""
        provs = {vid: self.variant_record(vid).provenance for vid in self.variant_ids()}
        return select(provs, selector, where=self.location)

    def create_variant(
        self,
        provenance: dict[str, Any],
        layers: dict[str, list[int]],
        hidden_size: int,
        dtype: str,
        codec: str,
        chunk_tokens: int,
    ) -> str:
        """Record a variant (idempotent: the same provenance gives the same id and keeps the first record)."""
        vid = variant_id(provenance)
        rec = VariantRecord(vid, provenance, layers, hidden_size, dtype, codec, chunk_tokens)
        key = f"{layout.variant_prefix(vid)}/zarr.json"
        if not self.blobs.put_if_absent(key, group_json({layout.VARIANT_ATTR: rec.to_dict()})):
            have = self.variant_record(vid)
            if have.layers != layers or have.hidden_size != hidden_size or have.dtype != dtype:
                raise CorruptData(f"variant {vid} exists with other layers/geometry; the store is inconsistent")
        self.blobs.put_if_absent(f"{layout.variant_prefix(vid)}/units/zarr.json", group_json({}))
        return vid

    def reader(self, vid: str, refresh: bool = False) -> VariantReader:
        if refresh or vid not in self._readers:
            self._readers[vid] = VariantReader(self, vid)
        return self._readers[vid]

    def commits(self, vid: str) -> tuple[list[CommitRecord], list[tuple[str, str]]]:
        """All commit records of a variant (sorted by unit id) and the unreadable ones as (key, why)."""
        good, bad = [], []
        for key in self.blobs.list(layout.commits_prefix(vid)):
            if not key.endswith(".json"):
                continue
            raw = self.blobs.get(key)
            try:
                if raw is None:
                    raise CorruptData(f"{key} vanished")
                good.append(CommitRecord.from_dict(parse_json(raw, key), key))
            except CorruptData as e:
                bad.append((key, str(e)))
        return sorted(good, key=lambda c: c.unit), bad


class VariantReader:
    """Reads committed samples of one variant: by key or index, any layer subset, verified on the way."""

    def __init__(self, store: Store, vid: str) -> None:
        self.store = store
        self.id = vid
        self.record = store.variant_record(vid)
        self.commits, self.bad_commits = store.commits(vid)
        self.units = {c.unit: c for c in self.commits}
        refs: dict[str, SampleRef] = {}
        # units sorted by id: the first unit to hold a key wins, so racing writers never show a key twice
        for c in self.commits:
            for key, off, n in c.samples:
                refs.setdefault(key, SampleRef(key, c.unit, off, n))
        self.refs = refs
        self.keys = list(refs)  # unit order, then offset: reading in this order is chunk-local
        self._arrays: dict[tuple[str, str], Any] = {}
        self._checked_units: set[str] = set()
        self._lock = threading.Lock()
        self.read_threads = min(8, os.cpu_count() or 1)  # layers of one sample read in parallel
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid: int | None = None
        self.tokenizer_fingerprint = self.record.provenance.get("recipe", {}).get("tokenizer", {}).get("fingerprint", "")

    @property
    def n_tokens(self) -> int:
        return sum(r.length for r in self.refs.values())

    @property
    def bytes_read(self) -> int:
        """Bytes this reader has read: direct shard reads, plus zarr's when opened with ``count_bytes``."""
        direct = sum(a.bytes_read for a in self._arrays.values() if isinstance(a, ShardReader))
        return direct + int(getattr(self.store.zstore, "bytes_read", 0))

    def stats(self) -> dict[int, dict[str, float]]:
        """Per-layer additive health stats over all committed units."""
        return {
            layer: merge(c.stats[str(layer)] for c in self.commits if str(layer) in c.stats)
            for layer in self.record.all_layers
        }

    def check_corrupt_commits(self) -> None:
        if self.bad_commits:
            key, why = self.bad_commits[0]
            raise CorruptData(
                f"variant {self.id} has {len(self.bad_commits)} unreadable commit record(s), first {key}: {why}. "
                "Run `hsstore verify` to list them"
            )

    def check_unit(self, uid: str, checksums: bool = False) -> None:
        """Every file the commit recorded is there with its recorded size (a missing shard would read as
        zeros); with ``checksums``, its bytes also match the crc32c the writer recorded (a full read)."""
        if uid in self._checked_units and not checksums:
            return
        c = self.units[uid]
        prefix = layout.unit_prefix(self.id, uid)
        for rel, size in c.files.items():
            got = self.store.blobs.size(f"{prefix}/{rel}")
            what = None if got == size else "is missing" if got is None else f"has {got} bytes, {size} were committed"
            if what is None and checksums and rel in c.crc32c:
                crc = self.store.blobs.crc32c(f"{prefix}/{rel}")
                what = None if crc == c.crc32c[rel] else f"has crc32c {crc}, {c.crc32c[rel]} was committed"
            if what is not None:
                first = c.samples[0][0] if c.samples else "?"
                raise CorruptData(
                    f"unit {uid} of variant {self.id}: file {rel} {what}; its {len(c.samples)} samples "
                    f"(first key {first}) are unreadable. Run `hsstore verify`"
                )
        self._checked_units.add(uid)

    def _array(self, uid: str, name: str) -> Any:
        key = (uid, name)
        arr = self._arrays.get(key)
        if arr is None:
            with self._lock:
                self.check_unit(uid)
                path = f"{layout.unit_prefix(self.id, uid)}/{name}"
                try:
                    arr = zarr.open_array(self.store.zstore, path=path, mode="r")
                except Exception as e:
                    raise CorruptData(f"unit {uid} of variant {self.id}: cannot open {name}: {e}") from None
                self._arrays[key] = arr
        return arr

    def _shard(self, uid: str, name: str) -> ShardReader | None:
        """The direct reader of a local single-shard array (None: read through zarr)."""
        key = (uid, "shard:" + name)
        if key not in self._arrays:
            root = self.store.blobs.root
            reader = None
            if root is not None:
                with self._lock:
                    self.check_unit(uid)
                path = root / layout.unit_prefix(self.id, uid) / name
                try:
                    reader = ShardReader(str(path), f"unit {uid} of variant {self.id}, {name}")
                except ValueError:
                    reader = None  # another layout (e.g. format 1.0 token arrays): zarr reads it
                except FileNotFoundError as e:
                    raise CorruptData(f"unit {uid} of variant {self.id}: {name} is missing ({e.filename})") from None
            self._arrays[key] = reader
        return self._arrays[key]

    def _slice(self, ref: SampleRef, name: str) -> np.ndarray:
        try:
            shard = self._shard(ref.unit, name)
            if shard is not None:
                return shard.rows(ref.offset, ref.offset + ref.length)
            return self._array(ref.unit, name)[ref.offset : ref.offset + ref.length]
        except CorruptData as e:
            if ref.key in str(e):
                raise
            raise CorruptData(f"sample {ref.key}: {e}") from None
        except Exception as e:  # zarr raises on checksum and decode errors; name the sample
            raise CorruptData(
                f"sample {ref.key} (unit {ref.unit}, variant {self.id}): {name} is corrupt ({type(e).__name__}: {e}). "
                "Run `hsstore verify`"
            ) from None

    def ref(self, key_or_index: str | int) -> SampleRef:
        if isinstance(key_or_index, (int, np.integer)):
            return self.refs[self.keys[int(key_or_index)]]
        try:
            return self.refs[key_or_index]
        except KeyError:
            raise KeyError(f"sample {key_or_index!r} is not committed in variant {self.id}") from None

    def read_tokens(self, ref: SampleRef) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids int32 [T], loss_mask uint8 [T]) of one sample, checked against its key."""
        ids = self._slice(ref, "input_ids")
        mask = self._slice(ref, "loss_mask")
        if sample_key(self.tokenizer_fingerprint, ids, mask) != ref.key:
            raise CorruptData(
                f"sample {ref.key} (unit {ref.unit}, variant {self.id}): stored tokens do not hash to the key. "
                "Run `hsstore verify`"
            )
        return ids, mask

    def read_stacked(self, ref: SampleRef, layers: list[int]) -> torch.Tensor:
        """States of ``layers`` as one ``[T, len(layers), H]`` tensor in the stored dtype, each layer read
        straight into its slot on local stores (no second copy to stack them)."""
        from hsstore.core.dtypes import STORED

        rec = self.record
        buf = np.empty((ref.length, len(layers), rec.hidden_size), dtype=STORED[rec.dtype])

        def one(j: int, shard: ShardReader | None) -> None:
            if shard is None:
                buf[:, j] = self._slice(ref, layout.layer_array(layers[j]))
            else:
                shard.rows(ref.offset, ref.offset + ref.length, out=buf[:, j])

        try:
            shards = [self._shard(ref.unit, layout.layer_array(layer)) for layer in layers]
            pool = self._layer_pool() if len(layers) > 1 and all(shards) else None
            if pool is None:
                for j, shard in enumerate(shards):
                    one(j, shard)
            else:  # layers decode side by side (the codecs, pread and crc32c release the GIL)
                for f in [pool.submit(one, j, shard) for j, shard in enumerate(shards)]:
                    f.result()
        except CorruptData as e:
            raise CorruptData(str(e) if ref.key in str(e) else f"sample {ref.key}: {e}") from None
        return from_stored(buf, rec.dtype)

    def _layer_pool(self) -> ThreadPoolExecutor | None:
        """Threads that read the layers of one sample in parallel; one pool per process (a forked
        DataLoader worker gets its own: threads do not survive a fork)."""
        if self.read_threads < 2:
            return None
        if self._pool_pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.read_threads, thread_name_prefix="hsstore-read")
            self._pool_pid = os.getpid()
        return self._pool

    def read_layers(self, ref: SampleRef, layers: list[int]) -> list[torch.Tensor]:
        """States ``[T, H]`` of each requested layer, in the stored dtype (bf16 as torch.bfloat16)."""
        missing = [i for i in layers if i not in self.record.all_layers]
        if missing:
            raise BadInput(f"layer(s) {missing} are not stored in variant {self.id}; stored: {self.record.all_layers}")
        return [from_stored(self._slice(ref, layout.layer_array(i)), self.record.dtype) for i in layers]

    def read(self, key_or_index: str | int, layers: list[int] | None = None) -> dict[str, Any]:
        ref = self.ref(key_or_index)
        ids, mask = self.read_tokens(ref)
        layers = self.record.all_layers if layers is None else list(layers)
        states = self.read_layers(ref, layers)
        return {
            "key": ref.key,
            "input_ids": torch.from_numpy(ids.astype(np.int64)),
            "loss_mask": torch.from_numpy(mask.astype(np.bool_)),
            "layers": dict(zip(layers, states)),
        }


def info_dict(store: Store) -> dict[str, Any]:
    """What ``hsstore info --json`` prints."""
    from hsstore.storage.stats import summary

    out: dict[str, Any] = {"format_version": store.format_version, "location": store.location, "variants": []}
    for vid in store.variant_ids():
        r = store.reader(vid)
        files = sum(sum(c.files.values()) for c in r.commits)
        rec = r.record
        itemsize = {"bf16": 2, "fp16": 2, "fp32": 4}[rec.dtype]
        raw = sum(c.n_tokens for c in r.commits) * rec.hidden_size * itemsize * len(rec.all_layers)
        out["variants"].append(
            {
                "id": vid,
                "provenance": rec.provenance,
                "n_samples": len(r.refs),
                "n_tokens": r.n_tokens,
                "n_units": len(r.commits),
                "bytes": files,
                "raw_state_bytes": raw,
                "compression_ratio": (raw / files) if files else None,
                "codec": rec.codec,
                "dtype": rec.dtype,
                "hidden_size": rec.hidden_size,
                "layers": rec.layers,
                "health": {str(k): summary(v) for k, v in r.stats().items()},
                "unreadable_commits": len(r.bad_commits),
            }
        )
    return out

