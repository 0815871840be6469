"""``hsstore diff --plot``: per-layer rel-L2 and cosine for A<->B and the floor, as a PNG (matplotlib)."""

from __future__ import annotations

from typing import Any

from hsstore.core.errors import BadInput


def plot_diff(report: dict[str, Any], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInput("--plot needs matplotlib: pip install matplotlib") from None
    layers = [L["layer"] for L in report["layers"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(layers, [L["rel_l2"] for L in report["layers"]], "o-", label="A vs B")
    ax2.plot(layers, [L["cos_mean"] for L in report["layers"]], "o-", label="A vs B (mean)")
    ax2.plot(layers, [L["cos_p01"] for L in report["layers"]], "x--", label="A vs B (1st pct)")
    if report.get("floor_layers"):
        ax1.plot(layers, [L["rel_l2"] for L in report["floor_layers"]], "s--", label="floor (A vs C)")
        ax2.plot(layers, [L["cos_mean"] for L in report["floor_layers"]], "s--", label="floor (mean)")
    ax1.set_xlabel("layer")
    ax1.set_ylabel("relative L2")
    values = [L["rel_l2"] for L in report["layers"]] + [L["rel_l2"] for L in report.get("floor_layers", [])]
    if values and min(values) > 0:
        ax1.set_yscale("log")
    ax1.legend()
    ax2.set_xlabel("layer")
    ax2.set_ylabel("cosine similarity")
    ax2.legend()
    fig.suptitle(report["verdict"][:110], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
