"""UnitWriter: one writer's units of work — write arrays, check health, then commit (last, atomically)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hsstore.core.dtypes import TORCH, to_stored
from hsstore.core.errors import WRITE_FIXES, BuildFailed, HsstoreError, WriteFailed, write_cause
from hsstore.core.keys import SampleTokens
from hsstore.core.quant import Quantized, dequantize
from hsstore.core.schema.record import UNSET
from hsstore.core.schema.store_records import CommitRecord, HealthStats, QuantError, UnitInfo, WriterInfo
from hsstore.storage import commits, layout
from hsstore.storage.codecs import SCALE_CHUNK_ROWS, TOKEN_CHUNK_ROWS
from hsstore.storage.fileio import Written, digest, group_json
from hsstore.storage.shardio import array_metadata, encode_shard
from hsstore.storage.stats import from_stats_tensor, problems, stats_tensor

if TYPE_CHECKING:
    from hsstore.storage.store import Store


def _rows(t: torch.Tensor | Quantized, idx: torch.Tensor) -> torch.Tensor | Quantized:
    if isinstance(t, Quantized):
        return Quantized(t.codes.index_select(0, idx), t.scales.index_select(0, idx))
    return t.index_select(0, idx)


def _quant_error(e: Mapping[str, float]) -> QuantError:
    """The commit record of an additive error record of hsstore.core.quant (its ``tokens`` an int)."""
    return QuantError(
        tokens=int(e["tokens"]),
        sum_sq_err=e["sum_sq_err"],
        sum_sq_ref=e["sum_sq_ref"],
        cos_sum=e["cos_sum"],
        cos_min=e["cos_min"],
        max_abs=e["max_abs"],
    )


def _health_stats(s: Mapping[str, float]) -> HealthStats:
    """The commit record of additive health stats (hsstore.storage.stats: the counts are ints)."""
    return HealthStats(
        n=int(s["n"]),
        sum=s["sum"],
        sumsq=s["sumsq"],
        absmax=s["absmax"],
        min=s["min"],
        max=s["max"],
        nan=int(s["nan"]),
        inf=int(s["inf"]),
        zeros=int(s["zeros"]),
    )


def _now() -> str:
    """UTC, to the millisecond: readers order units by it (hsstore.storage.reader.commit_order)."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


class UnitWriter:
    """Writes units of one variant. Exactly one writer owns a unit id; nothing is visible until commit."""

    def __init__(
        self, store: Store, vid: str, writer_id: str | None = None, check_health: bool = True, command: str = "build"
    ) -> None:
        self.store = store
        self.command = command  # the hsstore command that resumes this writer's work (named in failures)
        self.vid = vid
        self.record = store.variant_record(vid)
        self.writer_id = layout.check_name(writer_id or uuid.uuid4().hex[:12], "writer id")
        self.check_health = check_health
        self.seq = 0
        self.info = WriterInfo(host=socket.gethostname(), pid=os.getpid(), writer=self.writer_id)
        self._seen_commits: set[str] = set()
        self._done: set[str] = set()
        self._lock = threading.Lock()  # writes may come from several threads
        # a unit's arrays are compressed and written in parallel (the codecs release the GIL): the last
        # unit of a build is written after the last forward, and this is most of that tail
        self.io_threads = min(8, os.cpu_count() or 1)

    def committed_keys(self) -> set[str]:
        """Keys committed by anyone so far (judges only commit records not seen committed before)."""
        with self._lock:
            found = commits.scan(self.store.io, self.vid, skip=self._seen_commits)
            for uid, commit in found.committed.items():  # records that commit nothing are written over
                self._done.update(k for k, _, _ in commit.samples)
                self._seen_commits.add(layout.commit_key(self.vid, uid))
            return self._done

    def write(
        self,
        samples: Sequence[SampleTokens],
        states: Mapping[int, torch.Tensor | Quantized],
        skip_committed: bool = True,
        health: Mapping[int, torch.Tensor] | None = None,
        quant_error: Mapping[int, Mapping[str, float]] | None = None,
        seq: int | None = None,
    ) -> CommitRecord | None:
        """Write ``samples`` and their states (``layer -> [sum of lengths, H]``, in sample order) as one unit.
        ``seq``: its place among this writer's units (``reserve()``; default: the next), which readers order
        them by, whichever thread commits first.

        Samples already committed are dropped first (re-writing is a no-op). ``health`` = ``layer ->
        stats_tensor(states, lengths)`` computed by the caller (on the GPU, copied back with the states)
        saves recomputing them here. A variant stored quantized takes ``Quantized`` states, the health of
        the states as computed and ``quant_error`` (layer -> hsstore.core.quant record).
        Returns the commit, or None if nothing was left to write.
        """
        rec = self.record
        if sorted(states) != rec.all_layers:
            raise ValueError(f"states for layers {sorted(states)}, variant {self.vid} stores {rec.all_layers}")
        total = sum(s.length for s in samples)
        empty = [s.key for s in samples if s.length == 0]
        if empty:  # (verify condemns a unit holding one, and every other sample of it with it)
            raise ValueError(f"sample {empty[0]} has no tokens; a unit holds samples of 1 token or more")
        for layer, t in states.items():
            self._check_states(layer, t, total)
        keep = list(range(len(samples)))
        if skip_committed:
            done = self.committed_keys()
            seen: set[str] = set()
            keep = []
            for i, s in enumerate(samples):
                if s.key not in done and s.key not in seen:
                    keep.append(i)
                    seen.add(s.key)
        if not keep:
            return None
        if len(keep) < len(samples):
            starts = np.cumsum([0] + [s.length for s in samples])
            idx = torch.from_numpy(np.concatenate([np.arange(starts[i], starts[i + 1]) for i in keep]))
            states = {k: _rows(v, idx) for k, v in states.items()}
            samples = [samples[i] for i in keep]
            health = quant_error = None  # computed over other rows (the error record is then left out)
        stats = self._health(samples, states, health)
        errors = {str(k): _quant_error(v) for k, v in (quant_error or {}).items()}
        return self._write_unit(samples, states, stats, errors, seq)

    def reserve(self) -> int:
        """The next unit's place among this writer's units, taken now (e.g. in batch order, before the unit is
        handed to a writing thread)."""
        with self._lock:
            self.seq += 1
            return self.seq - 1

    def _check_states(self, layer: int, t: torch.Tensor | Quantized, total: int) -> None:
        rec = self.record
        if rec.stored_precision:
            ok = (
                isinstance(t, Quantized)
                and tuple(t.codes.shape) == (total, rec.hidden_size)
                and t.codes.dtype == torch.uint8
                and tuple(t.scales.shape) == (total, 1)
                and t.scales.dtype == torch.float32
            )
            if not ok:
                raise ValueError(
                    f"layer {layer}: variant {self.vid} is stored as {rec.stored_precision} and takes "
                    f"Quantized codes [{total}, {rec.hidden_size}] uint8 with scales [{total}, 1] float32"
                )
        elif (
            not isinstance(t, torch.Tensor) or tuple(t.shape) != (total, rec.hidden_size) or t.dtype != TORCH[rec.dtype]
        ):
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"layer {layer} states {got}; expected {(total, rec.hidden_size)} {TORCH[rec.dtype]}")

    def _health(
        self,
        samples: Sequence[SampleTokens],
        states: Mapping[int, torch.Tensor | Quantized],
        health: Mapping[int, torch.Tensor] | None,
    ) -> dict[str, dict[str, float]]:
        if health is None:  # (of quantized states: their dequantized values; callers pass the computed ones)
            lengths = [s.length for s in samples]
            health = {
                layer: stats_tensor(dequantize(t, torch.float32) if isinstance(t, Quantized) else t, lengths)
                for layer, t in states.items()
            }
        stats: dict[str, dict[str, float]] = {}
        absmax: dict[int, list[float]] = {}
        for layer, t in health.items():
            stats[str(layer)], absmax[layer] = from_stats_tensor(t.tolist())
        if not self.check_health:
            return stats
        for name, st in stats.items():
            bad = problems(st)
            if st["nan"] or st["inf"] or (bad and "zero" in bad[0]):
                raise BuildFailed(
                    f"layer {name} of variant {self.vid}: {'; '.join(bad)} — refusing to commit. "
                    "Check the model and dtype (fp16 overflow?) or pass --allow-unhealthy to store anyway"
                )
        for layer, per_sample in absmax.items():
            for s, m in zip(samples, per_sample):
                if m == 0:
                    raise BuildFailed(
                        f"sample {s.key}: layer {layer} is all zeros — refusing to commit (broken extractor?). "
                        "Pass --allow-unhealthy to store anyway"
                    )
        return stats

    def _failed(self, uid: str, e: WriteFailed) -> WriteFailed:
        cause = write_cause(e)  # the fix advised is the one for this cause (a missing bucket is no full disk)
        return WriteFailed(
            f"unit {uid} of variant {self.vid}: {e}; the unit is not committed. {WRITE_FIXES[cause]} "
            f"and re-run the same command: `hsstore {self.command}` resumes from its committed units",
            cause,
        )

    def _check_written(self, uid: str, written: Mapping[str, Written]) -> None:
        """Every file the commit will name is there with the size written (a commit never names a missing
        file: something outside the lease rule, such as a hand-run ``rm`` or gc on an object store while this
        writer ran, removed it)."""
        for rel, w in written.items():
            got = self.store.io.size(layout.unit_key(self.vid, uid, rel))
            if got != w.size:
                what = "is gone" if got is None else f"holds {got} bytes, not the {w.size} written"
                raise WriteFailed(
                    f"unit {uid} of variant {self.vid}: file {rel} {what} before its commit (removed by "
                    f"another command while this writer ran?); the unit is not committed. Re-run the "
                    f"same command: `hsstore {self.command}` resumes from its committed units"
                )

    def _write_arrays(
        self, uid: str, samples: Sequence[SampleTokens], states: Mapping[int, torch.Tensor | Quantized]
    ) -> dict[str, Written]:
        """The unit's token arrays and one array per layer, written side by side; keys relative to the unit."""
        rec = self.record
        n = sum(s.length for s in samples)
        ids = np.concatenate([s.input_ids.astype(np.int32) for s in samples])
        mask = np.concatenate([s.loss_mask.astype(np.uint8) for s in samples])
        c = min(rec.chunk_tokens, max(1, n))
        tok_c = min(TOKEN_CHUNK_ROWS, max(1, n))
        arrays: list[tuple[str, np.ndarray, int, str, dict[str, Any]]] = [
            ("input_ids", ids, tok_c, "none", {}),
            ("loss_mask", mask, tok_c, "none", {}),
        ]
        for layer, t in states.items():
            if isinstance(t, Quantized):  # e4m3 codes (uint8) and their per-token float32 scales
                arrays.append(
                    (
                        layout.layer_array(layer),
                        t.codes.cpu().numpy(),
                        c,
                        rec.codec,
                        {"hsstore_dtype": rec.stored_precision, "computed_dtype": rec.dtype, "layer": int(layer)},
                    )
                )
                arrays.append(
                    (
                        layout.scale_array(layer),
                        t.scales.cpu().numpy(),
                        min(SCALE_CHUNK_ROWS, max(1, n)),
                        rec.codec,
                        {"hsstore_dtype": "float32", "scales_of": layout.layer_array(layer)},
                    )
                )
            else:
                arrays.append(
                    (
                        layout.layer_array(layer),
                        to_stored(t.cpu()),
                        c,
                        rec.codec,
                        {"hsstore_dtype": rec.dtype, "layer": int(layer)},
                    )
                )
        out: dict[str, Written] = {}
        with ThreadPoolExecutor(max(1, min(self.io_threads, len(arrays)))) as pool:
            for part in pool.map(lambda a: self._write_array(uid, *a), arrays):
                out.update(part)
        return out

    def _write_array(
        self, uid: str, name: str, data: np.ndarray, chunk: int, codec: str, attrs: dict[str, Any]
    ) -> dict[str, Written]:
        """One single-shard zarr v3 array: zarr's own metadata, the shard encoded here (the same bytes
        zarr writes); both written through the checked put. Returns what each file holds."""
        meta_rel, shard_rel = layout.array_files(name, data.ndim)
        put = self.store.io.put
        return {
            meta_rel: put(
                layout.unit_key(self.vid, uid, meta_rel), [array_metadata(data.shape, chunk, data.dtype, codec, attrs)]
            ),
            shard_rel: put(layout.unit_key(self.vid, uid, shard_rel), encode_shard(data, chunk, codec)),
        }

    def _commit_record(
        self,
        uid: str,
        samples: Sequence[SampleTokens],
        layers: list[int],
        written: Mapping[str, Written],
        stats: dict[str, dict[str, float]],
        quant_error: dict[str, QuantError] | None,
    ) -> CommitRecord:
        """The commit record of unit ``uid``, committed now: its samples' spans in token order, its layers, the
        size and xxh3 of every file ``written``, its health stats and (FP8) its storage error."""
        offsets = np.cumsum([0] + [s.length for s in samples]).tolist()
        return CommitRecord(
            unit=uid,
            samples=[(s.key, offsets[i], s.length) for i, s in enumerate(samples)],
            layers=layers,
            files={rel: w.size for rel, w in sorted(written.items())},
            stats={k: _health_stats(v) for k, v in stats.items()},
            writer=self.info,
            committed_at=_now(),
            xxh3={rel: w.xxh3 for rel, w in sorted(written.items())},
            variant=self.vid,
            quant_error=quant_error if quant_error else UNSET,
        )

    def _write_unit(
        self,
        samples: Sequence[SampleTokens],
        states: Mapping[int, torch.Tensor | Quantized],
        stats: dict[str, dict[str, float]],
        quant_error: dict[str, QuantError] | None = None,
        seq: int | None = None,
    ) -> CommitRecord:
        """Claim a new unit id, write its files, then its commit record (last, atomically)."""
        uid = f"{self.writer_id}-{self.reserve() if seq is None else seq:06d}"
        io = self.store.io
        info = UnitInfo(**self.info.to_dict(), started_at=_now())
        unit_meta = group_json({layout.UNIT_ATTR: info.to_dict()})
        try:  # the unit's folder appears with its record in it, leased until committed (storage.leases)
            lease = io.claim(layout.unit_key(self.vid, uid, layout.META), unit_meta)
        except WriteFailed as e:
            raise self._failed(uid, e) from None
        if lease is None:
            raise BuildFailed(
                f"unit {uid} of variant {self.vid} exists already: two writers share the id "
                f"{self.writer_id!r}; give each writer its own"
            )
        try:
            try:
                written = {layout.META: digest([unit_meta]), **self._write_arrays(uid, samples, states)}
            except WriteFailed as e:
                try:  # on a full disk the debris would take space too
                    io.remove_tree(layout.unit_prefix(self.vid, uid))
                except (OSError, HsstoreError):
                    pass  # gc removes it later
                raise self._failed(uid, e) from None
            self._check_written(uid, written)
            commit = self._commit_record(uid, samples, sorted(states), written, stats, quant_error)
            try:  # (a failed commit leaves the unit's files to gc: the record may be visible already)
                io.put_atomic(layout.commit_key(self.vid, uid), json.dumps(commit.to_dict()).encode())
            except WriteFailed as e:
                raise self._failed(uid, e) from None
        finally:
            lease.release()
        with self._lock:
            self._done.update(s.key for s in samples)
        return commit
