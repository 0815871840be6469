"""Follows one ``hsstore`` command through the package as it runs: the modules it enters, the distinct calls
that cross from one module into another, and how often the running code crossed (into a module, and back).
How far a reader must follow a command; issue 42 compares a build's and a diff's walk before and after the
re-cut. Builds run their workers in this process, so the worker's code is walked too.

    python scripts/walk.py build manifests/tiny.toml --limit 4 --store /tmp/walk/s.zarr --quiet
    python scripts/walk.py diff '/tmp/walk/s.zarr#dtype=bf16' '/tmp/walk/s.zarr#dtype=fp32'
    python scripts/walk.py --tree DIR diff ...   # another tree's package: git archive REV hsstore | tar -x -C DIR
    python scripts/walk.py --imports-only build ...   # only the modules a command imports (no profile hook)

Counted: calls between functions of two different ``hsstore`` modules (a module's top-level code, run when it
is imported, is not a call), in every thread; "calls" are distinct (caller, callee) function pairs, "crossings"
every such call as it happened, "returns" every return across modules. Loops over samples repeat crossings, so
compare crossings only on the same input. The profile hook slows Python-heavy work (a build's chat templating
and forward) by orders of magnitude; ``--imports-only`` runs the command at full speed and reports the package
modules it imported, which bounds the modules it can have entered.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class Walk:
    """Cross-module calls and returns inside the package, as a profile hook sees them."""

    def __init__(self) -> None:
        self.modules: set[str] = set()
        self.calls: set[tuple[str, str]] = set()
        self.crossings = 0
        self.returns = 0

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return") or frame.f_code.co_name == "<module>":
            return
        here = frame.f_globals.get("__name__", "")
        if not here.startswith("hsstore"):
            return
        self.modules.add(here)
        back = frame.f_back
        there = back.f_globals.get("__name__", "") if back is not None else ""
        if not there.startswith("hsstore") or there == here:
            return
        if event == "call":
            self.crossings += 1
            self.calls.add((f"{there}.{back.f_code.co_name}", f"{here}.{frame.f_code.co_name}"))
        else:
            self.returns += 1

    def report(self) -> dict[str, Any]:
        return {
            "modules": len(self.modules),
            "calls": len(self.calls),
            "crossings": self.crossings,
            "returns": self.returns,
            "module_names": sorted(self.modules),
        }


def run_here(argv: list[str], hook: bool = True) -> dict[str, Any]:
    """``hsstore ARGV`` in this process under the walk (or, without ``hook``, only the modules it imports);
    builds' workers inline where the package can."""
    import contextlib
    import importlib

    from hsstore.cli.main import main

    inline: Any = contextlib.nullcontext()
    for name in ("hsstore.capture.run.driver", "hsstore.capture.run.inline"):  # today's tree; before the re-cut
        try:
            inline = importlib.import_module(name).inline_workers()
            break
        except (ImportError, AttributeError):
            continue
    walk = Walk()  # (empty without the hook)
    sys.argv = ["hsstore", *argv]
    if hook:
        threading.setprofile(walk.hook)
        sys.setprofile(walk.hook)
    code = 0
    try:
        with inline:
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    if not hook:
        imported = sorted(m for m in sys.modules if m.startswith("hsstore"))
        return {"exit": code, "imported": len(imported), "module_names": imported}
    return {"exit": code, **walk.report()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default=str(REPO), help="the folder whose hsstore/ is walked (default: this checkout)")
    ap.add_argument("--json", default=None, help="also write the report here")
    ap.add_argument("--imports-only", action="store_true", help="report the package modules the command imports")
    ap.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # the child process
    args, argv = ap.parse_known_args()
    if args.here:
        print(json.dumps(run_here(argv, hook=not args.imports_only)))
        return
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [args.tree, os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    child = [sys.executable, __file__, "--here", *(["--imports-only"] if args.imports_only else []), *argv]
    out = subprocess.run(child, env=env, capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        sys.exit(f"walk of hsstore {' '.join(argv)} failed:\n{out.stderr[-2000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if args.imports_only:
        print(
            f"hsstore {' '.join(argv)} ({args.tree}): exit {report['exit']}; {report['imported']} package modules "
            "imported (packages' __init__ included)"
        )
    else:
        print(
            f"hsstore {' '.join(argv)} ({args.tree}): exit {report['exit']}; {report['modules']} modules entered, "
            f"{report['calls']} distinct cross-module calls, {report['crossings']} crossings, "
            f"{report['returns']} returns"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
