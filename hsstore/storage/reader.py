"""VariantReader: committed samples of one variant, by key or index, any layer subset, verified on the way."""

from __future__ import annotations

import os
import threading
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

import numpy as np

from hsstore.core.dtypes import STORED, from_stored
from hsstore.core.errors import BadInput, CorruptData
from hsstore.core.interrupt import ForkSafeLock
from hsstore.core.keys import sample_key
from hsstore.core.schema.store_records import CommitRecord, VariantRecord
from hsstore.storage import commits, layout
from hsstore.storage.backend import Backend, BufferRange, RangeSource
from hsstore.storage.sample_table import Keys, Refs, SampleRef, SampleTable, UnitRecords, unit_part
from hsstore.storage.shardio import ShardReader, check_declared_bytes
from hsstore.storage.stats import merge

if TYPE_CHECKING:
    import torch

    from hsstore.storage.tensor_reads import Stacked


# --- Running one sample's read tasks: in the calling thread, or shared between it and a thread pool.


def run_shared(tasks: list[tuple[Any, ...]], pool: ThreadPoolExecutor | None, threads: int) -> None:
    """Call each ``(function, *args)``; with a ``pool``, this thread and up to ``threads - 1`` pool threads
    take tasks from one list until it is empty (the codecs, pread, crc32c and the FP8 loop release the
    GIL). Every task has ended when this returns or raises."""
    if pool is None:
        for fn, *args in tasks:
            fn(*args)
        return
    todo, lock = iter(tasks), threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                task = next(todo, None)
            if task is None:
                return
            task[0](*task[1:])

    helpers = []
    for _ in range(min(len(tasks), threads) - 1):
        try:
            helpers.append(pool.submit(drain))
        except RuntimeError:  # the interpreter is exiting (an atexit handler reads): this thread does the rest
            break
    try:
        drain()
    finally:
        for f in helpers:  # every task ends before its buffers are handed out (or an error is raised)
            f.exception()
    for f in helpers:
        f.result()


def pieces(offset: int, length: int, chunk_rows: int, row_bytes: int, piece_bytes: int) -> list[tuple[int, int]]:
    """Rows ``[0, length)`` of a sample starting at row ``offset`` cut into ranges ``[a, b)`` of about
    ``piece_bytes`` of output (``row_bytes`` a row) on chunk boundaries: threads share a sample's layers
    and no chunk is decoded twice."""
    step = chunk_rows * max(1, piece_bytes // max(1, chunk_rows * row_bytes))
    cuts = [0, *range(step - offset % step, length, step), length]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_threads(cpus: int) -> int:
    """Threads one process decodes a sample's layers on: up to 8 of its ``cpus``. More did not pay: one
    rank on a 16-core host read slower with 16 than with 8 (docs/notes/benchmarks-history.md, "Round 2 on the 16-core host")."""
    return max(1, min(8, cpus))


def worker_share(threads: int) -> int:
    """``threads`` divided among the DataLoader workers when this process is one of them (at least 1)."""
    from torch.utils.data import get_worker_info  # (the read path has imported torch by now)

    info = get_worker_info()
    return threads if info is None else max(1, threads // info.num_workers)


def process_pool(threads: int) -> tuple[ThreadPoolExecutor | None, int]:
    """(a pool of ``n - 1`` threads or None, ``n``): ``n`` this process's ``worker_share`` of ``threads``;
    the calling thread is the n-th."""
    n = worker_share(threads)
    return (ThreadPoolExecutor(n - 1, thread_name_prefix="hsstore-read") if n > 1 else None), n


# a sample's layers go to the read threads above this many bytes (below, hand-offs cost more than they save)
THREAD_MIN_BYTES = 4 << 20
PIECE_BYTES = 2 << 20  # a large sample's layers are read in tasks of about this much output


class StoreLike(Protocol):
    """What a reader needs of its store (hsstore.storage.store.Store)."""

    io: Backend
    location: str

    @property
    def is_local(self) -> bool: ...

    def variant_record(self, vid: str) -> VariantRecord: ...


def commit_order(records: Mapping[str, CommitRecord]) -> list[str]:
    """The units (unit id -> commit record) in a reader's order: writers by their first commit (a record without
    the time first; UTC ISO times sort as text), then each writer's units in the order it made them (a unit id is
    ``<writer id>-<sequence>``). A store that grows keeps every index it had (by id, a later writer's random id
    could come first), and one writer's units keep its order though its threads commit them out of turn, so a
    build of the same inputs, or a convert of a variant, orders its samples alike; a writer whose clock is behind
    another's may still come before what it follows."""

    def writer(uid: str) -> str:
        return uid.rsplit("-", 1)[0]

    first: dict[str, str] = {}
    for uid, rec in records.items():
        at = rec.committed_at if isinstance(rec.committed_at, str) else ""
        first[writer(uid)] = min(first.get(writer(uid), at), at)
    return sorted(records, key=lambda u: (first[writer(u)], writer(u), u))


class VariantReader:
    """Reads committed samples of one variant (units committed as hsstore.storage.commits defines)."""

    def __init__(self, store: StoreLike, vid: str, units: Collection[str] | None = None) -> None:
        """``units``: read exactly these committed units (a snapshot another reader took, e.g. a dataset's
        parent process for its workers), not every unit committed now; CorruptData if one is not committed."""
        self.store = store
        self.io = store.io
        self.id = vid
        self.record = store.variant_record(vid)
        found = commits.scan(self.io, vid, keep=unit_part)
        parts = found.committed
        if units is not None:
            gone = sorted(set(units) - set(parts))
            if gone:
                raise CorruptData(
                    f"unit {gone[0]} of variant {vid} was committed when this reader's snapshot was "
                    f"taken and is not now ({len(gone)} such unit(s)); run `hsstore verify`"
                )
            parts = {u: parts[u] for u in units}  # in the snapshot's order
        else:
            parts = {u: parts[u] for u in commit_order({u: p.header for u, p in parts.items()})}
        self.bad_commits = found.bad
        # units in commit order: the first unit to hold a key wins, so racing writers never show a key twice
        self.table = SampleTable(list(parts.values()))  # (held as arrays: hsstore.storage.sample_table)
        self.units = UnitRecords(self.table)  # uid -> CommitRecord, its sample list made when asked for
        self.refs = Refs(self.table, vid)
        self.keys = Keys(self.table)  # unit order, then offset: reading in this order is chunk-local
        self._shards: dict[tuple[str, str], ShardReader] = {}
        self._checked_units: set[str] = set()
        self._lock = ForkSafeLock()  # (a DataLoader may fork while another thread holds it)
        self.read_threads = read_threads(usable_cpus())  # a sample's layers read side by side
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid: int | None = None
        self._pool_threads = 1
        self.tokenizer_fingerprint = self.record.prov.recipe.tokenizer.fingerprint

    @property
    def commits(self) -> Sequence[CommitRecord]:
        """The committed units' records, in the reader's (commit) order (each made when reached: one at a time in a loop)."""
        return self.units.records()

    @property
    def n_tokens(self) -> int:
        return self.table.n_tokens()

    def unit_sizes(self) -> list[int]:
        """Samples this reader serves from each unit that serves any, in unit order (sums to len(keys))."""
        return self.table.unit_sizes()

    def unit_counts(self) -> list[tuple[str, int]]:
        """(unit id, samples this reader serves from it) of each unit that serves any, in unit order."""
        return self.table.unit_counts()

    def unit_refs(self, uid: str) -> list[SampleRef]:
        """The samples this reader serves from unit ``uid`` (a duplicate a unit before it holds is not one)."""
        return self.table.unit_refs(uid)

    @property
    def bytes_read(self) -> int:
        """Bytes this reader has read from its arrays' chunk files."""
        return sum(s.bytes_read for s in self._shards.values())

    def stats(self) -> dict[int, dict[str, float]]:
        """Per-layer additive health stats over all committed units."""
        return {
            layer: merge(c.stats[str(layer)].to_dict() for c in self.table.headers if str(layer) in c.stats)
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
        zeros); with ``checksums``, its bytes also match the checksum the writer recorded (a full read)."""
        if uid in self._checked_units and not checksums:
            return
        c = self.units[uid]
        why = self.commit_shape_problem(c)
        if why:
            raise CorruptData(f"{why}; its {len(c.samples)} samples are unreadable. Run `hsstore verify`")
        bad = []  # every file that differs (two swapped files are named together)
        for rel, size in c.files.items():
            key = layout.unit_key(self.id, uid, rel)
            got = self.io.size(key)
            what = None if got == size else "is missing" if got is None else f"has {got} bytes, {size} were committed"
            if what is None and checksums and rel in c.checksums and (kind := c.checksum_kind) is not None:
                held = self.io.checksum(key, kind)
                what = None if held == c.checksums[rel] else f"has {kind} {held}, {c.checksums[rel]} was committed"
            if what is not None:
                bad.append(f"file {rel} {what}")
                if not checksums:  # a reader stops at the first; verify names them all
                    break
        if bad:
            first = c.samples[0][0] if c.samples else "?"
            raise CorruptData(
                f"unit {uid} of variant {self.id}: {'; '.join(bad)}; its {len(c.samples)} samples "
                f"(first key {first}) are unreadable. Run `hsstore verify`"
            )
        self._checked_units.add(uid)

    def commit_shape_problem(self, c: CommitRecord) -> str | None:
        """Why a committed unit's record does not fit its variant and the format (None if it does)."""
        if isinstance(c.variant, str) and c.variant != self.id:
            return (
                f"commit record of unit {c.unit} commits to variant {c.variant}, not {self.id} (copied from another "
                "variant or store?)"
            )
        if c.checksum_kind is not None and set(c.checksums) != set(c.files):
            return f"commit record of unit {c.unit} holds no {c.checksum_kind} for {sorted(set(c.files) - set(c.checksums))[:4]}"
        if c.layers != self.record.all_layers:
            return (
                f"commit record of unit {c.unit} lists layers {c.layers}, the variant stores {self.record.all_layers}"
            )
        want = layout.unit_files(c.layers, quantized=bool(self.record.stored_precision))
        if set(c.files) != want:
            odd = sorted(set(c.files) ^ want)
            return f"commit record of unit {c.unit} does not list exactly the unit's files (differs in {odd[:4]})"
        cover = c.coverage_problem()
        return f"commit record of unit {c.unit}: {cover}" if cover else None

    def shard(self, uid: str, name: str) -> ShardReader:
        """The reader of array ``name`` of committed unit ``uid``, checked against its commit and variant."""
        key = (uid, name)
        reader = self._shards.get(key)
        if reader is None:
            with self._lock:
                reader = self._shards.get(key)
                if reader is None:
                    self.check_unit(uid)
                    reader = ShardReader(
                        self.io,
                        f"{layout.unit_prefix(self.id, uid)}/{name}",
                        f"unit {uid} of variant {self.id}, {name}",
                    )
                    self._check_geometry(reader, uid, name)
                    self._shards[key] = reader
        return reader

    def _check_geometry(self, reader: ShardReader, uid: str, name: str) -> None:
        rec, n = self.record, self.table.unit_tokens(uid)
        want: tuple[tuple[int, ...], np.dtype[Any]]
        if name in layout.TOKEN_ARRAYS:
            want = ((n,), np.dtype("<i4") if name == "input_ids" else np.dtype("u1"))
        elif rec.stored_precision and name.startswith("scale_"):  # per-token scales of FP8 codes
            want = ((n, 1), np.dtype("<f4"))
        elif rec.stored_precision:  # e4m3 codes
            want = ((n, rec.hidden_size), np.dtype("u1"))
        else:
            want = ((n, rec.hidden_size), STORED[rec.dtype].newbyteorder("<"))
        if (reader.shape, reader.dtype) != want:
            raise CorruptData(
                f"unit {uid} of variant {self.id}: {name} is {reader.shape} {reader.dtype}, its commit "
                f"and variant record say {want[0]} {want[1]}. Run `hsstore verify`"
            )
        said = reader.layout.layer
        if said is not None and name.startswith("layer_") and name != layout.layer_array(said):
            raise CorruptData(
                f"unit {uid} of variant {self.id}: {name} holds layer {said} (its metadata says so): the unit's layer "
                "folders were swapped or copied over. Run `hsstore verify`"
            )

    def _slice(
        self,
        ref: SampleRef,
        name: str,
        out: np.ndarray | None = None,
        a: int = 0,
        b: int | None = None,
        src: BufferRange | None = None,
    ) -> np.ndarray:
        """Rows ``[a, b)`` of ``ref`` (default: all) of array ``name``, into ``out``, from ``src`` if given."""
        b = ref.length if b is None else b
        try:
            return self.shard(ref.unit, name).rows(ref.offset + a, ref.offset + b, out=out, src=src)
        except CorruptData as e:
            raise CorruptData(str(e) if ref.key in str(e) else f"sample {ref.key}: {e}") from None

    def ref(self, key_or_index: str | int) -> SampleRef:
        if isinstance(key_or_index, (int, np.integer)):
            return self.table.ref(int(key_or_index))
        return self.refs[key_or_index]

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

    def need_spans(self, ref: SampleRef, layers: list[int]) -> list[tuple[RangeSource, int, int]]:
        """(source, offset, bytes) of the file ranges holding ``ref``'s tokens and ``layers`` (to read ahead)."""
        names = [*layout.TOKEN_ARRAYS, *(layout.layer_array(i) for i in layers)]
        if self.record.stored_precision:
            names += [layout.scale_array(i) for i in layers]
        out = []
        for name in names:
            shard = self.shard(ref.unit, name)
            span = shard.need_span(ref.offset, ref.offset + ref.length)
            if span is not None:
                out.append((shard.src, *span))
        return out

    def read_array(
        self, ref: SampleRef, name: str, out: np.ndarray | None = None, a: int = 0, b: int | None = None
    ) -> np.ndarray:
        """Rows ``[a, b)`` (default: all) of ``ref``'s array ``name``, into ``out`` if given (may be strided)."""
        return self._slice(ref, name, out, a, b)

    def pieces(self, ref: SampleRef, name: str, row_bytes: int) -> list[tuple[int, int]]:
        """``ref``'s rows as the read tasks of one large sample (hsstore.storage.reader.pieces)."""
        return pieces(ref.offset, ref.length, self.shard(ref.unit, name).chunk_rows, row_bytes, PIECE_BYTES)

    def quant_error(self) -> dict[int, dict[str, float]]:
        """Per-layer storage error over all committed units of a quantized variant ({} otherwise)."""
        from hsstore.core.quant import merge as merge_errors

        if not self.record.stored_precision:
            return {}
        return {
            layer: merge_errors(
                e[str(layer)] for e in (c.storage_errors for c in self.table.headers) if str(layer) in e
            )
            for layer in self.record.all_layers
        }

    @overload
    def read_stacked(self, ref: SampleRef, layers: list[int], raw: Literal[False] = False) -> torch.Tensor: ...
    @overload
    def read_stacked(self, ref: SampleRef, layers: list[int], raw: bool) -> Stacked: ...

    def read_stacked(self, ref: SampleRef, layers: list[int], raw: bool = False) -> Stacked:
        """States of ``layers`` as one ``[T, len(layers), H]`` tensor in the stored dtype, each layer read into
        its slot; FP8 variants dequantized to bf16, or ``raw``: (float8_e4m3fn codes, float32 scales [T, n, 1])."""
        return self.read_groups(ref, [layers], raw)[0]

    @overload
    def read_groups(
        self,
        ref: SampleRef,
        groups: list[list[int]],
        raw: Literal[False] = False,
        fetched: Mapping[str, BufferRange] | None = None,
    ) -> list[torch.Tensor]: ...
    @overload
    def read_groups(
        self, ref: SampleRef, groups: list[list[int]], raw: bool, fetched: Mapping[str, BufferRange] | None = None
    ) -> list[Stacked]: ...

    def read_groups(
        self,
        ref: SampleRef,
        groups: list[list[int]],
        raw: bool = False,
        fetched: Mapping[str, BufferRange] | None = None,
    ) -> list[Stacked] | list[torch.Tensor]:
        """``read_stacked`` of each group of layers (e.g. aux and target), all layers in one pass: side by side
        on the reader's threads when the sample pays for the hand-offs, else in this thread; ``fetched``:
        array name -> its chunk bytes read ahead (hsstore.read.prefetch_reads; ignored for FP8 variants)."""
        for layers in groups:
            self._check_layers(layers)
        rec = self.record
        if rec.stored_precision:
            from hsstore.storage.tensor_reads import quantized_groups

            return quantized_groups(self, ref, groups, raw)
        from hsstore.storage import tensor_reads  # (torch: imported on the first read of states, not for metadata)

        tasks, outs, nbytes = [], [], 0
        for layers in groups:
            check_declared_bytes(
                ref.length * len(layers) * rec.hidden_size * STORED[rec.dtype].itemsize, f"sample {ref.key}"
            )
            buf, tensor = tensor_reads.empty((ref.length, len(layers), rec.hidden_size), STORED[rec.dtype])
            for j, layer in enumerate(layers):
                name = layout.layer_array(layer)
                tasks += [
                    (self._slice, ref, name, buf[a:b, j], a, b, (fetched or {}).get(name))
                    for a, b in self.pieces(ref, name, buf.strides[1])
                ]
            outs.append(tensor)
            nbytes += buf.nbytes
        self.run_tasks(tasks, nbytes)
        return [tensor_reads.as_dtype(t, rec.dtype) for t in outs]

    def run_tasks(self, tasks: list[tuple[Any, ...]], nbytes: int) -> None:
        """Call each ``(function, *args)``: in this thread if there is one task or under ``THREAD_MIN_BYTES``
        of output (a hand-off costs more than it saves), else shared with the pool (hsstore.storage.reader)."""
        pool = self._layer_pool() if len(tasks) > 1 and nbytes >= THREAD_MIN_BYTES else None
        run_shared(tasks, pool, self._pool_threads)

    def _layer_pool(self) -> ThreadPoolExecutor | None:
        """Threads that read a sample's layers side by side: one pool per process (threads do not survive
        a fork), ``read_threads`` shared among DataLoader workers (hsstore.storage.reader.worker_share)."""
        if self._pool_pid != os.getpid():
            self._pool, self._pool_threads = process_pool(self.read_threads)
            self._pool_pid = os.getpid()
        return self._pool

    def _check_layers(self, layers: list[int]) -> None:
        missing = [i for i in layers if i not in self.record.all_layers]
        if missing:
            raise BadInput(f"layer(s) {missing} are not stored in variant {self.id}; stored: {self.record.all_layers}")

    @property
    def reads_bf16(self) -> bool:
        """Whether ``read_layers`` returns bf16 states (stored so, or dequantized from a reduced precision)."""
        return self.record.dtype == "bf16" or bool(self.record.stored_precision)

    def read_layers(self, ref: SampleRef, layers: list[int]) -> list[torch.Tensor]:
        """States ``[T, H]`` of each requested layer, in the stored dtype (bf16 as torch.bfloat16)."""
        self._check_layers(layers)
        if self.record.stored_precision:  # dequantized bf16, one [T, H] tensor per layer
            stacked = self.read_stacked(ref, layers)
            return [stacked[:, j] for j in range(len(layers))]
        return [from_stored(self._slice(ref, layout.layer_array(i)), self.record.dtype) for i in layers]

    def read(self, key_or_index: str | int, layers: list[int] | None = None) -> dict[str, Any]:
        import torch  # the states come back as tensors; metadata and raw reads need numpy only

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
