"""FLOPs of a capture forward and the time they take at a given model FLOPs utilization (pure).

A capture runs the decoder layers up to the deepest captured one (no LM head) over padded batches, so
its cost is what those layers execute on every padded position: two FLOPs per weight per token for the
matmuls, plus, per full-attention layer, the causal score and value products (2 x 2 x width x
positions attended) and, per Gated-DeltaNet layer, the recurrent state's update and read-out (about
4 x heads x key dim x value dim per token). Norms, activations and the short convolution are left out
(well under 1 % at real sizes). MFU here is executed FLOPs / (seconds x peak).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# dense peak TFLOP/s by GPU name fragment and compute dtype (vendor data sheets; fp32 without tensor cores)
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
}
# without a calibration run: the MFU of the bare forward of the 27B-shaped hybrid on an H200 (bf16, fla,
# 2,048-token rows: 9,230 tokens/s, docs/benchmarks.md "Build on an H200"; its FLOPs by this module)
ASSUMED_MFU = 0.46


@dataclass(frozen=True)
class ForwardShape:
    """What the layers a capture runs cost: matmul weights, and the sizes of their token mixers."""

    layer_params: int  # weights of the decoder layers run (0..deepest captured), embeddings and head excluded
    attention_layers: int  # full-attention layers among them
    attention_width: int  # query heads x head dim
    linear_layers: int  # Gated-DeltaNet (linear-attention) layers among them
    linear_state: int  # value heads x key head dim x value head dim: one layer's recurrent state

    def sequence_flops(self, length: int) -> float:
        """FLOPs of one sequence of ``length`` positions."""
        t = float(length)
        dense = 2.0 * self.layer_params * t
        attention = self.attention_layers * 4.0 * self.attention_width * t * (t + 1) / 2
        linear = self.linear_layers * 4.0 * self.linear_state * t
        return dense + attention + linear


def batch_flops(shape: ForwardShape, batches: Sequence[tuple[int, int]]) -> float:
    """FLOPs executed by batches of ``(rows, padded width)``."""
    return sum(rows * shape.sequence_flops(width) for rows, width in batches)


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of a GPU named ``device_name`` computing in ``dtype``; None if not in the table."""
    for key, peaks in PEAK_TFLOPS.items():
        if key.lower() in device_name.lower():
            return peaks[dtype] * 1e12
    return None


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilization of ``flops`` executed in ``seconds`` on a device of ``peak`` FLOP/s."""
    return flops / (seconds * peak)


def seconds_at(flops: float, peak: float, utilization: float) -> float:
    """Seconds to execute ``flops`` on a device of ``peak`` FLOP/s at ``utilization``."""
    return flops / (peak * utilization)


# --- A population total from a simple random sample, with its normal-approximation interval (pure).

Z95 = 1.959964  # two-sided 95 %


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    confidence: float


def total_from_sample(values: Sequence[float], population: int, z: float = Z95, confidence: float = 0.95) -> Interval:
    """The total of ``values`` over a population of ``population`` items, ``values`` a random sample of it."""
    n = len(values)
    if n == 0:
        raise ValueError("an empty sample estimates nothing")
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    fpc = (population - n) / (population - 1) if population > 1 else 0.0
    half = z * population * math.sqrt(var / n * max(0.0, fpc))
    est = population * mean
    return Interval(est, max(0.0, est - half), est + half, confidence)


def sample_indices(population: int, n: int, seed: int) -> list[int]:
    """``n`` distinct indices of ``range(population)`` drawn with ``seed``, ascending (all if n >= population)."""
    import random

    if n >= population:
        return list(range(population))
    return sorted(random.Random(seed).sample(range(population), n))
