"""The package's shape, as issue 42 measures it: modules (besides ``__init__``), their lines, the largest,
functions over the cap, whether ruff (lint and format) and mypy are clean (and mypy's baseline), whether the results the CLI
renders are records, how the tests are laid out, and the doc split: reference
pages apart from lab notes, docs/benchmarks.md against its 300-line cap. Anyone can rerun it:

    python scripts/structure.py
"""

from __future__ import annotations

import ast
import re
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    mods = sorted(p for p in (REPO / "hsstore").rglob("*.py") if p.name != "__init__.py")
    lines = {p: len(p.read_text().splitlines()) for p in mods}
    long_functions = 0
    for p in mods:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 50:
                long_functions += 1
    print(
        f"modules (besides __init__): {len(mods)}; lines: median {statistics.median(lines.values()):.0f}, "
        f"max {max(lines.values())}"
    )
    for p, n in sorted(lines.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {n:5d}  {p.relative_to(REPO)}")
    print(f"functions over 50 lines: {long_functions}")
    for command in (["check"], ["format", "--check"]):
        ruff = subprocess.run(
            [str(Path(sys.executable).parent / "ruff"), *command, "-q", "hsstore", "tests", "scripts"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        print(f"ruff {' '.join(command)}: {'clean' if ruff.returncode == 0 else 'NOT clean'}")
    print_mypy()
    results = cli_results()
    dicts = sorted(k for k, r in results.items() if r.split("[")[0] in ("dict", "Any", "(none)"))
    print(
        f"package functions the CLI calls: {len(results)}; returning a dict, Any or unannotated: {len(dicts)}"
        + "".join(f"\n  {k}" for k in dicts)
    )
    tests = sorted((REPO / "tests").rglob("test_*.py"))
    folders: dict[str, int] = {}
    for t in tests:
        key = t.parent.name if t.parent != REPO / "tests" else "(flat)"
        folders[key] = folders.get(key, 0) + 1
    print(f"test files: {len(tests)}: " + ", ".join(f"{k} {v}" for k, v in sorted(folders.items())))
    print_doc_split()


def print_mypy() -> None:
    """mypy's verdict ([tool.mypy] in pyproject.toml) and the modules its ignore_errors baseline still holds."""
    mypy = subprocess.run([str(Path(sys.executable).parent / "mypy")], cwd=REPO, capture_output=True, text=True)
    print(f"mypy: {'clean' if mypy.returncode == 0 else 'NOT clean'} ({mypy.stdout.strip().splitlines()[-1]})")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    baseline = [m for o in config.get("overrides", []) if o.get("ignore_errors") for m in o["module"]]
    strict = [m for m in baseline if m.split(".")[1] in ("core", "storage", "read")]
    print(f"mypy baseline (errors ignored): {len(baseline)} modules, {len(strict)} of them in the strict layers")


def cli_results() -> dict[str, str]:
    """The functions of the command layers the CLI imports, with their return annotations (a result it renders
    should be a record, not a dict)."""
    out = {}
    for cli in sorted((REPO / "hsstore" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(cli.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hsstore.")):
                continue
            src = REPO / (node.module.replace(".", "/") + ".py")
            if node.module.startswith(("hsstore.cli", "hsstore.core")) or not src.exists():  # core: helpers, no results
                continue
            defs = {n.name: n for n in ast.parse(src.read_text()).body if isinstance(n, ast.FunctionDef)}
            for name in (a.name for a in node.names if a.name in defs):
                returns = defs[name].returns
                out[f"{node.module}.{name}"] = ast.unparse(returns) if returns else "(none)"
    return out


BENCHMARKS_MAX_LINES = 300  # docs/benchmarks.md is the current table; dated rounds go to docs/notes/


def print_doc_split() -> None:
    """Reference pages (docs/*.md: what is true of today's code) apart from lab notes (docs/notes/: dated
    rounds, kept as written), and docs/benchmarks.md against its cap."""
    for title, pages in (
        ("reference", sorted((REPO / "docs").glob("*.md"))),
        ("notes", sorted((REPO / "docs" / "notes").glob("*.md"))),
    ):
        words = sum(len(d.read_text().split()) for d in pages)
        print(f"docs, {title}: {len(pages)} pages, {words:,} words: {', '.join(d.stem for d in pages)}")
    bench = (REPO / "docs" / "benchmarks.md").read_text()
    n = len(bench.splitlines())
    print(
        f"docs/benchmarks.md: {n} lines (at most {BENCHMARKS_MAX_LINES}: "
        f"{'within' if n <= BENCHMARKS_MAX_LINES else 'OVER'}); "
        f"{len(re.findall(r'^##+ ', bench, re.M))} sections, {bench.count('not yet filled')} not yet filled"
    )


if __name__ == "__main__":
    main()
