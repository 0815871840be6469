"""Readahead asks the kernel for exactly the coming samples' bytes: observed in the page cache (mincore),
not inferred from timings."""

from __future__ import annotations

import ctypes
import mmap
import sys
import time
from pathlib import Path

import pytest
from helpers import read_path_store as _store

from hsstore import StreamingHiddenStateDataset
from hsstore.read.prefetch_reads import Readahead
from hsstore.storage import layout
from hsstore.testing.bench import evict

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-cache hints are Linux's")
PAGE = mmap.PAGESIZE


def resident(path: Path, start: int, end: int) -> float:
    """The share of ``path``'s pages in ``[start, end)`` held in the page cache (mincore on a private
    mapping: nothing is read)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        buf = (ctypes.c_char * size).from_buffer(mm)
        vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
        assert ctypes.CDLL(None).mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec) == 0
        del buf
        lo, hi = start // PAGE, -(-end // PAGE)
        return sum(v & 1 for v in vec[lo:hi]) / max(1, hi - lo)
    finally:
        mm.close()


def landed(path: Path, start: int, end: int) -> float:
    """``resident`` once the hinted reads have had time to complete (they are asynchronous, and mincore
    counts a page only when its read is done): polled for up to 10 s."""
    deadline = time.monotonic() + 10
    while (share := resident(path, start, end)) < 0.9 and time.monotonic() < deadline:
        time.sleep(0.05)
    return share


def test_readahead_requests_the_coming_samples_bytes_and_no_others(tmp_path: Path):
    path, _ = _store(tmp_path, [[400, 700, 250, 330, 180]], hidden=256, chunk=64)
    reader = StreamingHiddenStateDataset(path, shuffle=False).reader
    refs = [reader.ref(i) for i in range(len(reader.keys))]
    layers = reader.record.all_layers
    unit = path / "variants" / reader.id / "units" / refs[0].unit
    evict(path)

    def byte_range(ref, layer: int) -> tuple[Path, int, int]:
        """Where ``ref``'s chunks of ``layer`` lie in its shard file (by the shard's own index)."""
        shard = reader.shard(ref.unit, layout.layer_array(layer))
        lo, hi = ref.offset // shard.chunk_rows, (ref.offset + ref.length - 1) // shard.chunk_rows
        start, (last, n) = shard.spans[lo][0], shard.spans[hi]
        return unit / layout.array_files(layout.layer_array(layer), 2)[1], start, last + n

    first, last = [byte_range(refs[0], i) for i in layers], [byte_range(refs[-1], i) for i in layers]
    if max(resident(*r) for r in first + last) > 0.1:
        pytest.skip("this filesystem keeps evicted pages (tmpfs?): residency cannot be observed")
    ahead = Readahead(reader, refs, layers, budget=0)  # a budget of 0: only the sample named by at()
    try:
        ahead.at(0)
        assert min(landed(*r) for r in first) >= 0.9  # sample 0 of every layer was asked for ...
        assert max(resident(*r) for r in last) < 0.1  # ... and the last sample's chunks were not
        ahead.at(len(refs) - 1)
        assert min(landed(*r) for r in last) >= 0.9
    finally:
        ahead.close()
