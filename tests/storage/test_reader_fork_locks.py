"""A DataLoader forks its workers while another thread of the training process may be inside a reader:
the locks it held then must not stay held in the workers (hsstore.core.interrupt)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from helpers import read_path_item_check as _check
from helpers import read_path_store as _store
from torch.utils.data import DataLoader

from hsstore import HiddenStateDataset
from hsstore.core.interrupt import ForkSafeLock
from hsstore.storage.shardio import DECODED

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="fork is Linux's here")


def test_a_lock_held_in_the_parent_is_free_in_a_forked_child():
    lock = ForkSafeLock()
    with lock:
        pid = os.fork()
        if pid == 0:  # the child: the parent's holder does not exist here
            os._exit(0 if lock.acquire(timeout=5) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not lock.locked()


def _read_all_forked_while_held(ds: HiddenStateDataset, lock) -> list:
    """Every item through one forked DataLoader worker started while ``lock`` is held (as another thread
    of this process would hold it, mid-read, at the moment of the fork)."""
    loader = DataLoader(ds, batch_size=None, num_workers=1, timeout=30, multiprocessing_context="fork")
    with lock:
        it = iter(loader)  # the worker is forked here
    return list(it)


def test_workers_forked_while_the_reader_opens_a_shard_read_every_item(tmp_path: Path):
    path, want = _store(tmp_path, [[40, 70], [25, 30]])
    ds = HiddenStateDataset(path)
    ds[0]  # the first unit's arrays are open; the worker opens the second's, under the reader's lock
    items = _read_all_forked_while_held(ds, ds.reader._lock)
    assert sorted(it["key"] for it in items) == sorted(want)
    for item in items:
        _check(item, want)


def test_workers_forked_while_a_decoded_chunk_is_cached_read_every_item(tmp_path: Path):
    path, want = _store(tmp_path, [[40, 70, 25, 30]], chunk=4096)  # one chunk holds every sample
    ds = HiddenStateDataset(path)
    items = _read_all_forked_while_held(ds, DECODED.lock)
    assert sorted(it["key"] for it in items) == sorted(want)
    for item in items:
        _check(item, want)
