"""The import wall: layers import only downward, nothing imports the CLI, no import circles, and the light
entry points stay light. Read from the source (every import, deferred ones included) and checked in fresh
interpreters (what a module really loads)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "hsstore"
# bottom to top; a module may import its own layer and the layers below it
LAYERS = ["core", "storage", "testing", "read", "capture", "compare", "interop", "cli"]
# what only tests and scripts import: the shared factories sit on storage, and nothing is built on them
APART = {"cli", "testing"}
# third-party packages a layer must never import (the model stack stays out of storage and reading)
FORBIDDEN = {
    "core": {"transformers", "datasets", "tokenizers", "zarr", "torch.distributed"},
    "storage": {"transformers", "datasets", "tokenizers"},
    "testing": {"transformers", "datasets", "tokenizers"},
    "read": {"transformers", "datasets", "tokenizers"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, at any depth of the file (function-level imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    mods = {_module_name(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in _imports(p) if i in mods and i != m} for m, p in mods.items()}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_package_has_a_layer():
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert packages <= set(LAYERS), f"place {sorted(packages - set(LAYERS))} in LAYERS (bottom to top)"


def test_imports_only_point_down_and_never_at_the_cli():
    wrong = []
    for mod, deps in _graph().items():
        here = _layer(mod)
        for dep in deps:
            there = _layer(dep)
            if there in APART and here != there and mod != "hsstore.__main__":
                wrong.append(f"{mod} imports {'the CLI' if there == 'cli' else there} ({dep})")
            elif here and there and LAYERS.index(there) > LAYERS.index(here):
                wrong.append(f"{mod} ({here}) imports upward: {dep} ({there})")
    assert not wrong, "\n".join(sorted(wrong))


def test_layers_keep_the_model_stack_out():
    wrong = []
    for path in PKG.rglob("*.py"):
        mod = _module_name(path)
        banned = FORBIDDEN.get(_layer(mod) or "", set())
        for name in _imports(path):
            if any(name == b or name.startswith(b + ".") for b in banned):
                wrong.append(f"{mod} imports {name}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_circles():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import circles: {cycles}"


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "entry,banned",
    [
        ("import hsstore", {"torch", "zarr", "transformers", "numpy"}),
        ("import hsstore.cli.main", {"torch", "zarr", "transformers"}),
        (
            "import hsstore.core.batching, hsstore.core.partition, hsstore.core.schema, hsstore.core.provenance_match",
            {"torch", "zarr", "transformers"},
        ),
        ("import hsstore.storage.store, hsstore.storage.verify, hsstore.storage.gc", {"transformers", "datasets"}),
        ("import hsstore.read.dataset, hsstore.read.streaming", {"transformers", "datasets"}),
        # a manifest error is reported before torch loads (0.5 s, not 2.3 s); a CPU build's driver loads
        # torch only through transformers' AutoConfig, when it reads the model's config
        (
            "import hsstore.capture.run.driver, hsstore.capture.inputs.manifest_file, hsstore.core.precision_names",
            {"torch", "transformers", "zarr"},
        ),
        # planning is arithmetic: sizes, units, FLOPs and intervals need none of the model stack (hsstore plan
        # loads transformers to tokenize, torch only to count parameters on the meta device or to calibrate)
        (
            "import hsstore.core.flops, hsstore.core.batching, hsstore.core.flops, hsstore.core.outputs, "
            "hsstore.core.schema.plan",
            {"torch", "zarr", "transformers", "numpy"},
        ),
        ("import hsstore.storage.sizing, hsstore.storage.sizing", {"torch", "transformers", "zarr"}),
        (
            "import hsstore.capture.plan.plan_sizes, hsstore.capture.plan.plan_sizes, hsstore.capture.plan.plan_report, hsstore.capture.plan.plan_sizes",
            {"torch", "transformers", "zarr"},
        ),
    ],
)
@pytest.mark.process
def test_entry_points_load_only_what_they_need(entry: str, banned: set[str]):
    loaded = _loaded_after(entry)
    assert not banned & loaded, f"{entry!r} loads {sorted(banned & loaded)}"
    assert not any(m.startswith("hsstore.capture") for m in loaded) or "capture" in entry


@pytest.mark.process
def test_help_of_every_command_loads_neither_torch_nor_transformers():
    """``hsstore --help`` and each command's ``--help`` through the real entry point, in a fresh
    interpreter: help is rendered from the commands' signatures, before any of their work is imported."""
    code = (
        "import sys, json, typer\nfrom hsstore.cli.main import main\nfrom hsstore.cli.app import app\n"
        "names = sorted(typer.main.get_command(app).commands)\n"
        "for argv in [[], *([n] for n in names)]:\n"
        "    sys.argv = ['hsstore', *argv, '--help']\n"
        "    try:\n        main()\n    except SystemExit as e:\n        assert not e.code, (argv, e.code)\n"
        "print(json.dumps([names, [m for m in ('torch', 'transformers') if m in sys.modules]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"build", "convert", "diff", "info", "verify"} <= set(names), names
    assert loaded == [], f"hsstore --help loads {loaded}"


def _two_variant_store(path: Path) -> Path:
    from hsstore import Store
    from hsstore.testing.factories import new_variant, write_unit

    store = Store.create(path)
    for dtype in ("bf16", "fp32"):
        write_unit(store, new_variant(store, dtype), [5, 9])
    return path


def _cli_loads(argv: list[str], modules: tuple[str, ...]) -> tuple[list[str], str]:
    """(which of ``modules`` ``hsstore ARGV`` loads, its stdout), run through the real entry point in a
    fresh interpreter."""
    code = (
        "import sys, json; from hsstore.cli.main import main\n"
        f"sys.argv = ['hsstore', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        f"print(json.dumps([m for m in {modules!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stdout


@pytest.mark.process
def test_info_and_verify_of_a_local_store_load_neither_torch_nor_transformers(tmp_path: Path):
    """Reading metadata and checking every stored value is numpy's work: a real store, the real entry point."""
    store = str(_two_variant_store(tmp_path / "s.zarr"))
    for argv in (["info", store, "--json"], ["verify", store]):
        loaded, stdout = _cli_loads(argv, ("torch", "transformers"))
        assert loaded == [], f"hsstore {argv[0]} loads {loaded}"
        assert '"variants"' in stdout or "OK: 4 samples checked" in stdout, stdout


@pytest.mark.process
def test_a_local_store_is_read_without_zarr(tmp_path: Path):
    """zarr-python writes arrays' metadata and reaches object stores; a local store is read by hsstore's
    own shard reader, so info, verify and a dataset's items never import zarr (~0.1 s a process)."""
    store = str(_two_variant_store(tmp_path / "s.zarr"))
    for argv in (["info", store, "--json"], ["verify", store]):
        loaded, _ = _cli_loads(argv, ("zarr",))
        assert loaded == [], f"hsstore {argv[0]} of a local store loads zarr"
    code = (
        "import sys; from hsstore import HiddenStateDataset\n"
        f"item = HiddenStateDataset({store!r}, variant='dtype=bf16')[1]\n"
        "assert item['aux_hidden'].shape == (9, 2, 16), item['aux_hidden'].shape\n"
        "print('zarr' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", "reading a dataset item of a local store loads zarr"


MAX_MODULE_LINES = 600  # one concept per module, not a line count (issue 42): a cap only against sprawl
MAX_FUNCTION_LINES = 50
MAX_MODULES = 100  # besides __init__.py: a package a new maintainer maps in ten minutes


def test_modules_and_functions_stay_small():
    """One concept a module (<= 600 lines: a module is cut by concept, not by a line count; past 600 lines it
    holds two), one job a function (<= 50 lines, signature and docstring included)."""
    wrong = []
    for path in sorted(PKG.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(PKG.parent)
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            wrong.append(f"{rel}: {n} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    wrong.append(f"{rel}:{node.lineno} {node.name}: {n} lines (at most {MAX_FUNCTION_LINES})")
    assert not wrong, "\n".join(wrong)


def test_scripts_import_the_package_not_each_other():
    """A script runs as ``python scripts/X.py`` with the repo root on PYTHONPATH: what scripts share lives
    in hsstore.testing, so no script imports a sibling script or edits sys.path."""
    scripts = PKG.parent / "scripts"
    names = {p.stem for p in scripts.glob("*.py")}
    wrong = []
    for path in sorted(scripts.glob("*.py")):
        text = path.read_text()
        wrong += [f"{path.name} imports the script {n}" for n in sorted(_imports(path) & names)]
        if re.search(r"sys\.path\s*(\.|\[|=|\+=)", text):
            wrong.append(f"{path.name} edits sys.path")
    assert not wrong, "\n".join(wrong)


def test_no_two_modules_share_a_file_name():
    """A file name names one concept: ``provenance.py`` in three layers made a reader open the wrong one.
    Only ``__init__.py`` and the entry point repeat."""
    seen: dict[str, list[str]] = {}
    for path in PKG.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(PKG.parent)))
    repeated = {name: sorted(paths) for name, paths in seen.items() if len(paths) > 1}
    assert not repeated, f"rename so each file name says its concept: {repeated}"


def test_the_package_has_few_modules():
    """Modules are cut by concept: a reader and its read-ahead, an audit and its evidence, are one module each,
    so the package stays small enough to map (``python scripts/structure.py`` prints the figures)."""
    modules = sorted(str(p.relative_to(PKG.parent)) for p in PKG.rglob("*.py") if p.name != "__init__.py")
    assert len(modules) <= MAX_MODULES, f"{len(modules)} modules (at most {MAX_MODULES}): merge what is one concept"


TESTS = PKG.parent / "tests"
BEHAVIOUR_FOLDERS = {
    "scenarios": "behaviours that cross packages (a build end to end, crashes, races)",
    "repo": "rules of the repository itself (this file, the docs)",
}


def test_tests_mirror_the_package():
    """A test of module ``hsstore/<package>/.../<module>.py`` lives in ``tests/<package>/test_<module>.py``
    (or ``test_<module>_<aspect>.py``), so a maintainer finds a module's tests by its path; behaviour suites
    live in ``tests/scenarios/`` and the repository's own rules in ``tests/repo/``. Nothing lies flat."""
    misplaced = []
    for test in sorted(TESTS.rglob("test_*.py")):
        rel = test.relative_to(TESTS)
        if len(rel.parts) != 2:
            misplaced.append(f"{rel}: not in a package's or a behaviour folder")
            continue
        folder, name = rel.parts[0], test.stem.removeprefix("test_")
        if folder in BEHAVIOUR_FOLDERS:
            continue
        if folder not in LAYERS:
            misplaced.append(f"{rel}: tests/{folder}/ mirrors no package of hsstore/ ({', '.join(LAYERS)})")
            continue
        modules = {p.stem for p in (PKG / folder).rglob("*.py") if p.name != "__init__.py"}
        if not any(name == m or name.startswith(m + "_") for m in modules):
            misplaced.append(f"{rel}: names no module of hsstore/{folder}/ (test_<module>[_<aspect>].py)")
    assert not misplaced, "move or rename:\n" + "\n".join(misplaced)
