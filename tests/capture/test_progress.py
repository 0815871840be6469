"""The build's progress display: on a terminal a bar, on stderr; stdout carries the summary alone."""

from __future__ import annotations

import io
import sys

import pytest

from hsstore.capture.run.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_draws_on_stderr_never_on_stdout(monkeypatch: pytest.MonkeyPatch):
    """``hsstore build M > summary.txt`` on a terminal: the bar is for the person, the file gets the summary."""
    out, err = io.StringIO(), _Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    p = Progress("abc123 torch/bf16/cpu", total_samples=3, total_tokens=30)
    assert p._rich is not None  # stderr is a terminal: the rich bar, not plain lines
    p.advance(3, 30)
    p.close()
    assert out.getvalue() == ""
    assert "abc123 torch/bf16/cpu" in err.getvalue() and "3/3 samples" in err.getvalue()
