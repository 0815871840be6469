"""The store fuzz suite, bounded for CI: seeded mutations of good stores (bit flips, truncation, JSON type
swaps, extra and missing keys, odd files, symlinks, FIFOs, renamed records) against every reading entry
point. Each case must read bit-identical data or be refused with hsstore's own error, within a time
limit, and gc must never remove committed data or anything outside the store.

HSSTORE_FUZZ_CASES and HSSTORE_FUZZ_SEED widen it (scripts/fuzz_store.sh runs 10,000 cases); the
outcome counts are printed at the end of the test session.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from fuzzing import run
from helpers import REPO, crashed_unit, new_variant, write_unit

from hsstore import Store
from hsstore.storage import layout

CASES = int(os.environ.get("HSSTORE_FUZZ_CASES", "60"))
SEED = int(os.environ.get("HSSTORE_FUZZ_SEED", "0"))
CHUNK = 30  # cases per test item: items run side by side under xdist


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two good stores: one written now (two variants, two units each, an uncommitted unit, a build
    record) and a copy of the format 1.0 fixture."""
    d = tmp_path_factory.mktemp("fuzz-bases")
    path = d / "new.zarr"
    store = Store.create(path)
    for dtype, codec in (("bf16", "shuffle-zstd"), ("fp32", "none")):
        vid = new_variant(store, dtype=dtype, hidden=8, chunk=4, codec=codec)
        for seed in (1, 2):
            write_unit(store, vid, [3, 6], seed=seed, writer_id=f"w{seed}")
        store.io.put_atomic(layout.build_key(vid, "0123456789abcdef"), b'{"complete": true}')
    crashed_unit(store, vid, [2], seed=3)
    shutil.copytree(REPO / "tests" / "data" / "format-v1.zarr", d / "v1.zarr")
    return [path, d / "v1.zarr"]


@pytest.mark.parametrize("chunk", range(max(1, -(-CASES // CHUNK))))
def test_mutated_stores_read_back_or_are_refused(
    bases: list[Path], tmp_path: Path, chunk: int, record_property: pytest.RecordProperty
):
    n = min(CHUNK, CASES - chunk * CHUNK)
    counts, failures = run(bases, tmp_path, SEED * 100_000 + chunk, n)
    record_property("fuzz", dict(counts))
    assert sum(counts.values()) == n
    assert not failures, "\n".join(failures[:10])
