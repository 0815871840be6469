"""Readahead hints from a helper process (hsstore.read.hints): they fill the page cache for this process's
reads, only for the file the reader named, and the helper never outlives its reader."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time
from pathlib import Path

import pytest

from hsstore import StreamingHiddenStateDataset
from hsstore.read import hints, readahead
from hsstore.storage import layout
from hsstore.storage.local import LocalRange
from hsstore.testing.disk import evict

from test_read_path import _check, _store

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page-cache hints are Linux's")
PAGE = mmap.PAGESIZE


def resident(path: Path, start: int = 0, end: int | None = None) -> float:
    """The share of ``path``'s pages in ``[start, end)`` held in the page cache (mincore on a private
    mapping: nothing is read)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        buf = (ctypes.c_char * size).from_buffer(mm)
        pages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec) == 0
        del buf
        lo, hi = start // PAGE, -(-(size if end is None else end) // PAGE)
        return sum(v & 1 for v in vec[lo:hi]) / max(1, hi - lo)
    finally:
        mm.close()


def settled(files: list[Path], at_least: float) -> float:
    """The least resident share of ``files``, polled until it reaches ``at_least`` or 10 s have passed
    (mincore counts a page once its read has completed; a hint's reads are asynchronous)."""
    deadline = time.monotonic() + 10
    while (share := min(resident(f) for f in files)) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return share


def settled_range(path: Path, start: int, end: int) -> float:
    deadline = time.monotonic() + 10
    while (share := resident(path, start, end)) < 0.9 and time.monotonic() < deadline:
        time.sleep(0.05)
    return share


@pytest.fixture
def cold_file(tmp_path: Path) -> Path:
    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(4 << 20))
    evict(f)
    if resident(f) > 0.1:
        pytest.skip("this filesystem keeps evicted pages (tmpfs?): residency cannot be observed")
    return f


def _source(path: Path) -> LocalRange:
    return LocalRange(os.open(path, os.O_RDONLY), path.name)


def _hint_and_wait(spans: list) -> list:
    helper = hints.start_helper()
    assert helper is not None
    rest = helper.send(spans)
    helper.close()  # the helper ends once it has issued every hint it was sent
    return rest


def test_the_helper_reads_the_named_range_into_the_page_cache_and_nothing_else(cold_file: Path):
    src = _source(cold_file)
    try:
        assert _hint_and_wait([(src, 0, 1 << 20)]) == []
        first = settled([cold_file], 0.25)
        assert first >= 0.25  # the first MiB of four (the kernel may round its readahead up a little) ...
        assert first < 0.9  # ... and not the rest
    finally:
        src.close()


def test_the_helper_ignores_a_file_whose_identity_does_not_match(cold_file: Path):
    """A line naming an fd whose device and inode are not what the reader sent (the fd was reused for
    another file) is dropped: no hint lands on the wrong file; the next, correct, line is served."""
    src, wrong = _source(cold_file), _source(cold_file)
    try:
        wrong.ident = (src.ident[0], src.ident[1] + 1)
        _hint_and_wait([(wrong, 0, 2 << 20), (src, 3 << 20, 1 << 20)])
        assert settled_range(cold_file, 3 << 20, 4 << 20) >= 0.9  # the correct line's reads have landed ...
        assert resident(cold_file, 0, 2 << 20) < 0.1  # ... the wrong one's never started
    finally:
        src.close()
        wrong.close()


def test_sources_that_are_not_local_files_come_back_to_the_caller(cold_file: Path):
    class Remote:
        fd = -1

    assert _hint_and_wait([(Remote(), 0, 10)])[0][1:] == (0, 10)


def _helpers() -> set[int]:
    """Pids of this process's hint helpers still running."""
    me, out = os.getpid(), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me and b"POSIX_FADV_WILLNEED" in cmd and stat.split()[2] != "Z":
            out.add(int(pid))
    return out


def test_a_stream_with_helper_hints_reads_the_same_epoch_and_leaves_no_helper(tmp_path: Path, monkeypatch):
    path, want = _store(tmp_path, [[40, 70, 25], [90, 10]])
    monkeypatch.setattr(readahead, "HELPER_PROCESS", True)
    it = iter(StreamingHiddenStateDataset(path, seed=3))
    first = next(it)
    assert len(_helpers()) == 1
    rest = list(it)
    assert _helpers() == set()  # the epoch ended: its helper is gone
    for item in [first, *rest]:
        _check(item, want)
    assert sorted(x["key"] for x in [first, *rest]) == sorted(want)
    it = iter(StreamingHiddenStateDataset(path, seed=3))
    next(it)
    it.close()  # a training loop that stops mid-epoch
    assert _helpers() == set()


def test_hints_go_on_from_the_thread_when_the_helper_dies(tmp_path: Path):
    """A helper killed mid-epoch (OOM killer, a user's kill) costs nothing but its own hints: the readahead
    thread hints itself from then on, so the later samples' bytes still reach the page cache ahead."""
    path, _ = _store(tmp_path, [[400, 700, 250, 330, 180]], hidden=256)
    reader = StreamingHiddenStateDataset(path).reader
    refs = [reader.ref(i) for i in range(len(reader.keys))]
    layers = reader.record.all_layers
    ahead = readahead.Readahead(reader, refs, layers, budget=0, helper=True)  # hints only what at() names
    try:
        ahead.at(0)
        unit = path / "variants" / reader.id / "units" / refs[0].unit
        files = [unit / layout.array_files(layout.layer_array(i), 2)[1] for i in layers]
        evict(path)
        if max(resident(f) for f in files) > 0.1:
            pytest.skip("this filesystem keeps evicted pages (tmpfs?): residency cannot be observed")
        assert ahead.helper is not None
        ahead.helper.proc.kill()
        ahead.helper.proc.wait()
        for i in range(1, len(refs)):
            ahead.at(i)
    finally:
        ahead.close()
    assert ahead.helper is None  # it noticed
    assert settled(files, 0.5) >= 0.5  # the later samples (most of each file) were hinted anyway
