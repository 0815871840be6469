"""The documentation is checked: the README stays short and its Python example runs, every test that
docs/guarantees.md names exists, every relative link in README and docs/ (lab notes under docs/notes/ included)
points at a file."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 150
README_MAX_WORDS = 1500


def test_readme_is_short() -> None:
    text = (REPO / "README.md").read_text()
    lines, words = len(text.splitlines()), len(text.split())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}); move detail to docs/"
    assert words <= README_MAX_WORDS, f"README.md has {words} words (at most {README_MAX_WORDS}); move detail to docs/"


def _named_tests(doc: str) -> list[tuple[str, str | None]]:
    """(file, function pattern or None) for every test named in the table's test column; a ``::name``
    without a file continues the file named before it in the same cell."""
    out: list[tuple[str, str | None]] = []
    for row in doc.splitlines():
        if not row.startswith("|") or row.startswith("|---"):
            continue
        cell = row.rstrip().rstrip("|").rsplit("|", 1)[-1]
        current: str | None = None
        for ref in re.findall(r"`([^`]+)`", cell):
            path, _, func = ref.partition("::")
            if path:
                if not re.fullmatch(r"(tests/)?[\w/]*test_\w+\.py", path):
                    continue  # a script or another file, not a test
                current = path
            if current is None:
                continue
            out.append((current, func or None))
    return out


def _resolve(name: str) -> Path:
    if name.startswith("tests/"):
        return REPO / name
    hits = sorted((REPO / "tests").rglob(Path(name).name))
    assert len(hits) == 1, f"docs/guarantees.md names {name!r}: {len(hits)} files of that name under tests/"
    return hits[0]


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        n.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")
    }


def test_every_test_named_in_the_guarantees_exists() -> None:
    named = _named_tests((REPO / "docs" / "guarantees.md").read_text())
    assert len(named) >= 40, f"parsed only {len(named)} test references: the table's format changed?"
    missing = []
    for file, func in named:
        path = _resolve(file)
        if not path.is_file():
            missing.append(file)
        elif func is not None and not fnmatch.filter(_test_functions(path), func):
            missing.append(f"{file}::{func}")
    assert not missing, f"docs/guarantees.md names tests that do not exist: {missing}"


def test_the_guarantee_check_catches_a_renamed_test(tmp_path: Path) -> None:
    """The parser reads continuation cells, so a name that no longer exists is found."""
    doc = "| g | t |\n|---|---|\n| x | `tests/repo/test_docs.py::test_readme_is_short`, `::test_not_there` |\n"
    named = _named_tests(doc)
    assert named == [("tests/repo/test_docs.py", "test_readme_is_short"), ("tests/repo/test_docs.py", "test_not_there")]
    assert not fnmatch.filter(_test_functions(_resolve(named[1][0])), named[1][1])


@pytest.mark.parametrize(
    "doc", ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))]
)
def test_relative_links_point_at_files(doc: str) -> None:
    path = REPO / doc
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"{doc} links to files that do not exist: {broken}"


def _readme_python() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert len(blocks) == 1, "the README has one Python example"
    return blocks[0]


def test_the_readme_python_example_runs(tiny_store: Path) -> None:
    """The README's Python API block, run as written on a real store of the same shape (bf16 + fp32)."""
    code = _readme_python().replace('"out/tiny.zarr"', repr(str(tiny_store)))
    assert repr(str(tiny_store)) in code
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["batch"]["attention_mask"].shape == scope["batch"]["input_ids"].shape
    assert scope["evals"].provenance != scope["train"].provenance  # fp32 beside bf16, allowed by allow_drift


def test_the_readme_manifest_is_a_valid_manifest(tmp_path: Path) -> None:
    """The README's manifest, with its model and data pointed at the embedded default, loads and validates."""
    from hsstore.capture.inputs.manifest_file import load_manifest, validate

    blocks = re.findall(r"```toml\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert len(blocks) == 1 and len(blocks[0].splitlines()) <= 10, "the README has one manifest of ten lines"
    text = re.sub(r'^path = "/models/[^"]*"', 'path = "builtin:tiny-qwen3_5"', blocks[0], count=1, flags=re.M)
    text = text.replace('"chats.jsonl"', repr(str(REPO / "hsstore" / "data" / "conversations.jsonl")).replace("'", '"'))
    text = text.replace("aux = [1, 17, 32], target = [35]", "aux = [0, 1], target = [3]")  # the tiny model's 4 layers
    (tmp_path / "m.toml").write_text(text)
    m = validate(load_manifest(str(tmp_path / "m.toml")))
    assert m.store_path == str(tmp_path / "out" / "qwen3-8b.zarr") and m.dtypes == ["bf16"] and m.max_length == 4096


def test_every_command_is_in_the_guide() -> None:
    import typer

    from hsstore.cli.main import app

    guide = (REPO / "docs" / "guide.md").read_text()
    names = sorted(typer.main.get_command(app).commands)
    assert len(names) >= 10
    missing = [n for n in names if f"hsstore {n} " not in guide]
    assert not missing, f"docs/guide.md does not show {missing}"


def _layers() -> list[str]:
    """``LAYERS`` of the import-wall test (bottom to top), read from its source: the rule the page describes."""
    tree = ast.parse((REPO / "tests/repo/test_architecture.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYERS" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("tests/repo/test_architecture.py has no LAYERS")


def test_the_architecture_page_draws_the_layers_the_import_wall_enforces() -> None:
    """docs/architecture.md's diagram names exactly the packages of LAYERS, top to bottom, and no other
    (a layer the code no longer has, like the old ``build``, fails), and the page names every module."""
    text = (REPO / "docs" / "architecture.md").read_text()
    diagram = re.search(r"```\n(.*?)```", text, re.S)
    assert diagram, "docs/architecture.md has no layer diagram"
    drawn = re.findall(r"^\s*([a-z]+)\s{2,}\S", diagram.group(1), re.M)
    assert drawn == _layers()[::-1], f"the diagram draws {drawn}, the import wall has {_layers()[::-1]} (top to bottom)"
    modules = sorted(p.stem for p in (REPO / "hsstore").rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    missing = [m for m in modules if f"`{m}`" not in text]
    assert not missing, f"docs/architecture.md does not name the modules {missing}"


BENCHMARKS_MAX_LINES = 300  # the cap scripts/structure.py prints against


def test_benchmarks_is_the_current_table() -> None:
    """docs/benchmarks.md holds the current figures only (dated rounds live in docs/notes/benchmarks-history.md):
    at most 300 lines, and every benchmark block names its script and the date of its run, or says it is a
    place left for rows not yet measured."""
    text = (REPO / "docs" / "benchmarks.md").read_text()
    assert len(text.splitlines()) <= BENCHMARKS_MAX_LINES, (
        f"docs/benchmarks.md has {len(text.splitlines())} lines (at most {BENCHMARKS_MAX_LINES}): move rounds to docs/notes/"
    )
    blocks = re.split(r"^(?=##+ )", text, flags=re.M)[1:]
    assert len(blocks) >= 10, f"parsed only {len(blocks)} benchmark blocks: the page's format changed?"
    wrong = []
    for block in blocks:
        title = block.splitlines()[0]
        if title == "## Not measured" or "not yet filled" in block:
            continue
        if "scripts/" not in block or not re.search(r"\b20\d\d-\d\d-\d\d\b", block):
            wrong.append(title)
    assert not wrong, f"benchmark blocks without a scripts/ command or a date: {wrong}"
    assert (REPO / "docs" / "notes" / "benchmarks-history.md").is_file()
