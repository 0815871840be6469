"""How close an uncalibrated ``hsstore plan`` is to the build it plans: plans a manifest into a fresh store
(a probe of the model, or stated assumptions for a model over the probe's size limit),
builds it, plans again against the built store (ratios measured on disk), and
prints each variant's planned bytes against ``hsstore info``'s, with the expected error each plan states.

    python scripts/plan_accuracy.py manifests/tiny.toml [--limit N] [--dtype bf16 ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cli(*args: str) -> tuple[str, float]:
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "hsstore", *args], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"hsstore {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout, time.time() - t0


def main(manifest: str, *extra: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = str(Path(d) / "s.zarr")
        fresh, t_fresh = _cli("plan", manifest, "--store", store, *extra, "--json")
        _, t_build = _cli("build", manifest, "--store", store, *extra, "--quiet")
        again, t_again = _cli("plan", manifest, "--store", store, *extra, "--json")
        info = {v["dtype"]: v for v in json.loads(_cli("info", store, "--json")[0])["variants"]}
    print(
        f"{manifest} {' '.join(extra)}: plan {t_fresh:.1f}s (fresh store), build {t_build:.1f}s, "
        f"plan {t_again:.1f}s (built store)"
    )
    for name, plan in (("fresh store", fresh), ("built store", again)):
        for v in json.loads(plan)["variants"]:
            real = info[v["dtype"]]["bytes"]
            err = v["ratio"]["expected_error"]
            print(
                f"  {name:11s} {v['dtype']:5s} planned {v['bytes']:>11,} built {real:>11,} "
                f"{v['bytes'] / real - 1:+7.1%} (stated ±{'unbounded' if err is None else f'{err:.0%}'}; "
                f"ratio {v['ratio']['value']:.2f}x: {v['ratio']['source']})"
            )


if __name__ == "__main__":
    main(*sys.argv[1:])
