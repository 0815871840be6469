"""The concurrency soak: build, gc (plain and --force --grace 0), convert, export, an import of the export
folder and readers on one store at once (the build in the test process, each other role in a process of its
own), for a bounded time (``HSSTORE_SOAK_SECONDS``, default 20) from a seed (``HSSTORE_SOAK_SEED``, default 0;
the failing seed is in the test's id). It ends with every committed sample of every variant readable,
``verify`` clean, the export folder exactly one export, and every imported sample holding the source's states
of the layers its variant names."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import racers
import torch
from helpers import run_cli, wait_for, write_manifest
from test_concurrency import assert_all_readable

from hsstore import Store
from hsstore.storage.verify import verify

SECONDS = float(os.environ.get("HSSTORE_SOAK_SECONDS", "20"))
SEED = int(os.environ.get("HSSTORE_SOAK_SEED", "0"))


@pytest.mark.process
def test_soak_build_gc_convert_export_and_readers_at_once(tiny_store: Path, tmp_path: Path):
    path = tmp_path / "s.zarr"
    shutil.copytree(tiny_store, path)
    before = {v.id: v.n_samples for v in Store.open(path).variants}
    m = write_manifest(
        tmp_path / "m.toml", dtypes='["bf16", "fp32"]', layers="{ aux = [0, 1], target = [3] }", store=str(path)
    )
    t0 = time.monotonic()
    others = [
        racers.start("soak_gc", path, SEED),
        racers.start("soak_gc", path, SEED + 1),
        racers.start("soak_reader", path, SEED),
        racers.start("soak_convert", path, SEED),
        racers.start("soak_export", path, SEED, tmp_path / "export"),
        racers.start("soak_import", path, SEED, tmp_path / "export", tmp_path / "imported.zarr"),
    ]
    # the build runs in this process, once the racers run (convert has derived its variant): a process
    # apart from theirs, without an interpreter start of its own
    wait_for(
        lambda: len(Store.open(path).variant_ids()) > len(before) or any(p.poll() is not None for p in others),
        300,
        "the convert racer's first variant",
    )
    assert all(p.poll() is None for p in others), "a racer ended before the build started"
    build = run_cli("build", str(m), "--limit", "46", "--quiet")
    time.sleep(max(0.0, SECONDS - (time.monotonic() - t0)))
    results = racers.stop_all(path, others, timeout=300)
    assert build.returncode == 0, f"seed {SEED}: build: {build.stderr[-2000:]}"
    for role, (rc, err) in zip(["gc", "gc", "reader", "convert", "export", "import"], results):
        assert rc == 0, f"seed {SEED}: {role}: {err[-2000:]}"
    after = {v.id: v.n_samples for v in Store.open(path).variants}
    assert all(after[v] > n for v, n in before.items()), (before, after)  # the build added samples to each
    assert len(after) == len(before) + 1  # and convert derived its variant
    for vid in after:
        assert assert_all_readable(path, vid) == after[vid]
    record = json.loads((tmp_path / "export" / "hsstore-export.json").read_text())
    files = [p for p in (tmp_path / "export").rglob("*") if p.name.endswith((".ckpt", ".ckpt.gz"))]
    assert record["complete"] and len(files) == record["n_samples"]
    _assert_imports_hold_what_they_say(path, tmp_path / "imported.zarr")


def _assert_imports_hold_what_they_say(source: Path, imported: Path) -> None:
    """Every sample imported from the export folder while it was rewritten holds, under each layer its
    variant names, exactly the source's states of that layer: no import labelled one export's files with
    another export's record."""
    if not imported.exists():
        return  # every import was refused (the export held the folder each time): nothing to check
    src = Store.open(source)
    fp32 = src.reader(src.select("dtype=fp32"))  # what soak_export exports
    dst = Store.open(imported)
    for vid in dst.variant_ids():
        r = dst.reader(vid)
        for key in r.keys:
            got = r.read(key)["layers"]
            want = fp32.read(key, list(got))["layers"]
            for layer in got:
                assert torch.equal(got[layer], want[layer]), f"seed {SEED}: {vid} {key} layer {layer}"
    assert verify(dst).ok
