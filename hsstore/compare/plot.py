"""``hsstore diff --plot``: per-layer rel-L2 and 1 - cosine of A against B and against the floor C,
on log axes (a cosine of 0.999994 vs 0.999987 is unreadable; 6e-6 vs 1.3e-5 is not), legends naming
A, B and C by the selectors the user gave, sampled intervals as error bars (matplotlib)."""

from __future__ import annotations

import io
import os
from typing import Any

from hsstore.core.errors import BadInput
from hsstore.core.outputs import PLOT_SUFFIXES
from hsstore.core.schema.diff_report import DiffReport, LayerDiff
from hsstore.core.schema.record import or_none


def _name(target: str | None, variant: str | None, which: str) -> str:
    """How the legend names A, B or the floor: as the user named it (else its STORE#VARIANT_ID), shortened."""
    target = target or variant or which
    return target if len(target) <= 48 else "…" + target[-47:]


def _series(ax: Any, layers: list[int], rows: list[LayerDiff], key: str, label: str, style: str,
            color: str) -> None:
    values = [max(float(getattr(L, key) if key != "1-cos" else 1.0 - L.cos_mean), 1e-16) for L in rows]
    err = None
    ci_key = "cos_mean" if key == "1-cos" else key
    if all(L.ci and ci_key in L.ci for L in rows):
        bounds = [sorted(1.0 - x for x in L.ci[ci_key]) if key == "1-cos" else L.ci[ci_key] for L in rows]
        err = [[max(0.0, v - lo) for v, (lo, _) in zip(values, bounds)], [max(0.0, hi - v) for v, (_, hi) in zip(values, bounds)]]
    ax.errorbar(layers, values, yerr=err, fmt=style, label=label, capsize=3, color=color)


def plot_diff(report: DiffReport, path: str) -> bytes:
    """The plot's file, in the format ``path``'s suffix names (PNG when it names none, e.g. /dev/stdout)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInput("--plot needs matplotlib: pip install matplotlib") from None
    layers = [L.layer for L in report.layers]
    a, b = _name(report.a_target, report.a, "a"), _name(report.b_target, report.b, "b")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    _series(ax1, layers, report.layers, "rel_l2", f"A vs B\nA = {a}\nB = {b}", "o-", "C0")
    _series(ax2, layers, report.layers, "1-cos", "A vs B (mean over tokens)", "o-", "C0")
    ax2.plot(layers, [max(1.0 - L.cos_p01, 1e-16) for L in report.layers], "x:", color="C0",
             label="A vs B (99th percentile)")
    if report.floor_layers:
        c = _name(or_none(report.floor_target), or_none(report.floor), "floor")
        _series(ax1, layers, report.floor_layers, "rel_l2", f"floor: A vs C\nC = {c}", "s--", "C1")
        _series(ax2, layers, report.floor_layers, "1-cos", "floor: A vs C (mean)", "s--", "C1")
    for ax, label in ((ax1, "relative L2  ‖A−B‖ / ‖B‖"), (ax2, "1 − cosine(A, B) per token")):
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.set_xticks(layers)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    title = report.verdict[:140]
    s = report.sampling
    if s:
        title += f"\nsampled {s.samples} of {s.population} samples (seed {s.seed}); bars: {s.confidence:.0%} intervals"
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    suffix = os.path.splitext(path)[1].lower()
    buf = io.BytesIO()
    fig.savefig(buf, format=suffix[1:] if suffix in PLOT_SUFFIXES else "png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
