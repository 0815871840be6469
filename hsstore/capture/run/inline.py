"""Build workers run in the driver's own process: the worker process's code (hsstore.capture.run.worker.run) on
the same JSON plan and result file, without two interpreter starts. For tests and Python callers whose
process binds the backend's kernels (hsstore.capture.model.backends.bind_backend refuses any other)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from hsstore.core.schema.build import WorkerPlan

_INLINE: ContextVar[bool] = ContextVar("hsstore_inline_workers", default=False)


@contextmanager
def inline_workers() -> Iterator[None]:
    """Builds started inside run their workers inline (``driver.build``'s default becomes ``inline=True``)."""
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)


def inline_default() -> bool:
    """Whether a build that does not say runs its workers inline here."""
    return _INLINE.get()


def run_here(plan_path: str) -> int:
    """The worker of the plan at ``plan_path``, in this process: its exit code (its outcome is in the plan's
    result file, as from a worker process)."""
    from hsstore.capture.run.worker import run

    return run(WorkerPlan.from_json(Path(plan_path).read_bytes(), f"worker plan {plan_path}"))
