"""A progress display for long work: samples, tokens/s and ETA (rich on a terminal, plain lines otherwise);
``status(text)``: one line naming the phase a build is in where no bar moves (tokenizing, hashing, loading).

``note(text)`` says what the next step is doing when it is not the usual (e.g. "compiling kernels for
batch shape 8x2048": on a fresh host the first batch of each new shape compiles and autotunes GPU
kernels, which can take seconds and would otherwise look like a stall); it shows until the next advance.
"""

from __future__ import annotations

import sys
import time


def status(text: str, quiet: bool = False) -> None:
    """Say on stderr which phase the build is in (``--quiet``: nothing)."""
    if not quiet:
        print(f"hsstore build: {text}", file=sys.stderr, flush=True)


class Progress:
    def __init__(self, label: str, total_samples: int, total_tokens: int, quiet: bool = False) -> None:
        self.label, self.total_samples, self.total_tokens = label, total_samples, total_tokens
        self.samples = self.tokens = 0
        self.t0 = self.last = time.time()
        self.quiet = quiet or total_samples == 0
        self.current_note = ""
        self.notes = 0  # how many notes were shown (e.g. batch shapes compiled)
        self._rich = None
        if not self.quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} samples"),
                TextColumn("{task.fields[tps]:,.0f} tok/s"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[note]}"),
                transient=False,
                console=Console(stderr=True),  # on stderr, which is the terminal: stdout is the summary's
            )
            self._rich.start()
            self._task = self._rich.add_task(label, total=total_samples, tps=0.0, note="")

    def note(self, text: str) -> None:
        """Show ``text`` beside the bar (plain mode: one line, at most every 10 s) until the next advance."""
        self.current_note = text
        self.notes += 1
        if self._rich is not None:
            self._rich.update(self._task, note=text)
        elif not self.quiet and (self.notes == 1 or time.time() - self.last > 10):
            print(f"[{self.label}] {text}", file=sys.stderr, flush=True)
            self.last = time.time()

    def advance(self, samples: int, tokens: int) -> None:
        self.samples += samples
        self.tokens += tokens
        now = time.time()
        tps = self.tokens / max(1e-9, now - self.t0)
        if self.current_note and self._rich is not None:
            self._rich.update(self._task, note="")
        self.current_note = ""
        if self._rich is not None:
            self._rich.update(self._task, advance=samples, tps=tps)
        elif not self.quiet and (now - self.last > 10 or self.samples == self.total_samples):
            left = (self.total_tokens - self.tokens) / tps if tps > 0 else float("nan")
            shapes = f", {self.notes} new batch shape(s) compiled" if self.notes else ""
            print(
                f"[{self.label}] {self.samples}/{self.total_samples} samples, {tps:,.0f} tok/s, ETA {left:,.0f}s{shapes}",
                file=sys.stderr,
                flush=True,
            )
            self.last = now

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
