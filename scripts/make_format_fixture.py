"""Writes tests/data/format-v1.zarr (a tiny store of the current format) and the sums a test expects.

Run only when the format version changes on purpose; the old fixture must keep reading.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hsstore import Store
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import make_samples, make_states, new_variant

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    out = REPO / "tests" / "data" / "format-v1.zarr"
    shutil.rmtree(out, ignore_errors=True)
    store = Store.create(out)
    expected = {}
    for dtype in ("bf16", "fp32"):
        vid = new_variant(store, dtype=dtype, hidden=8)
        samples = make_samples([3, 17, 5], seed=1)
        states = make_states(samples, 8, dtype, [0, 1, 2], seed=2)
        UnitWriter(store, vid, writer_id="fixture").write(samples, states)
        r = Store.open(out).reader(vid)
        expected[vid] = {
            "n_samples": len(samples),
            "layer_sums": {
                s.key: {str(i): float(t.double().sum()) for i, t in r.read(s.key)["layers"].items()} for s in samples
            },
        }
    (REPO / "tests" / "data" / "format-v1.expected.json").write_text(json.dumps(expected, indent=1))
    print(f"wrote {out}")
