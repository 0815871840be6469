"""A baseline commit checked out beside this tree, for benchmarks that time both in the same run."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def baseline_tree(repo: Path, rev: str, parent: str) -> Iterator[Path]:
    """``rev`` of ``repo`` as a detached git worktree under ``parent``; removed on exit."""
    base = Path(parent) / "baseline"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(base), rev], check=True,
                   capture_output=True)
    try:
        yield base
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(base)], capture_output=True)
