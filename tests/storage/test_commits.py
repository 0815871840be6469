"""Which units are committed (hsstore.storage.commits): litter an operating system leaves in a variant's commits/
folder is not a commit record."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsstore import HiddenStateDataset
from hsstore.storage.store import Store
from hsstore.storage.verify import verify
from hsstore.testing.factories import new_variant, write_unit


@pytest.mark.parametrize("litter", [".DS_Store", "._w-000000.json", ".nfs0000000000a1b2c3"])
def test_a_hidden_file_in_commits_leaves_the_variant_readable_and_verify_names_it_once(tmp_path: Path, litter: str):
    """macOS Finder's .DS_Store and ._NAME files, an NFS silly-rename: none is a record (hsstore never names a file
    with a leading dot), so readers serve the variant as before and verify names the file once, as a stray file. A
    Finder window on commits/ made the whole variant unreadable (every read: "unreadable commit record")."""
    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store)
    samples, _ = write_unit(store, vid, [5, 7])
    (tmp_path / "s.zarr" / "variants" / vid / "commits" / litter).write_bytes(b"\x00\x01Bud1")
    reader = Store.open(tmp_path / "s.zarr").reader(vid)
    assert sorted(reader.keys) == sorted(s.key for s in samples)
    assert sorted(HiddenStateDataset(tmp_path / "s.zarr", variant="dtype=bf16").keys) == sorted(s.key for s in samples)
    problems = [p for p in verify(Store.open(tmp_path / "s.zarr")).problems if litter in str(p)]
    assert len(problems) == 1 and "not written by hsstore" in str(problems[0]), problems
