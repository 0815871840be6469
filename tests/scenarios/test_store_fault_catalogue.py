"""docs/errors.md, "Store faults": every case has a row, and every row names tests that exist."""

from __future__ import annotations

import re

from helpers import REPO

CASES = {
    "write-file-too-large",
    "write-disk-full",
    "write-io-error",
    "file-checksum-mismatch",
    "gc-symlink",
    "commit-record-renamed",
    "store-symlink",
    "store-special-file",
    "store-executable",
    "store-temp-file",
    "store-stray-file",
    "store-stray-directory",
    "build-record-not-json",
    "commit-path-leaves-store",
    "commit-covers-part",
    "commit-files-mismatch",
    "record-not-json",
    "variant-record-wrong-type",
    "store-path-with-hash",
    "output-incomplete",
    "store-unreachable",
}


def test_every_store_fault_has_a_row_naming_a_real_test():
    doc = (REPO / "docs" / "errors.md").read_text()
    section = doc[doc.index("## Store faults") :].split("\n## ")[0]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    named = {c for r in rows for c in re.findall(r"`([a-z0-9-]+)`", r.split("|")[1])}
    assert CASES <= named, sorted(CASES - named)
    for r in rows:
        refs = re.findall(r"`(?:tests/)?([\w/]*test_\w+\.py)::(\w+)`", r.rstrip(" |").rsplit("|", 1)[-1])
        assert refs, r[:60]
        for f, name in refs:
            (src,) = [p for p in (REPO / "tests").rglob(f.rsplit("/", 1)[-1])]
            assert re.search(rf"^def {name}\(", src.read_text(), re.M), f"{f}::{name}"
