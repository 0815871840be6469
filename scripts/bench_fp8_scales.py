"""Which FP8 scale: error per byte of e4m3 storage with scales of different granularity, one run.

    python scripts/bench_fp8_scales.py --sources synthetic,model-27b --tokens 2048 --json out.json

Sets of bf16 states (as a bf16 build stores them):
  synthetic   5 layers shaped like a residual stream: gaussian x per-channel scales exp(N(0, 1)), norms
              growing with depth (x1 .. x30), and massive activations after layer 1 (two channels at
              2,000-5,000 on the first token of each 512-token sample and 0.3 % of others);
  model-27b   layers 1 and 3 of a random-init hybrid with the 27B shape's widths cut to 4 layers;
  model-1.6b  layers 1, 8, 15, 22 of the seed experiment's 1.6 B hybrid (hidden 2048, 24 layers).
Schemes (each with power-of-two scales, as hsstore stores them, and with exact ``amax / 448``):
  per-tensor, per-token-all-layers (speculators' anchor: one scale per token over every stored layer),
  per-token (one per token and layer), per-block-128, per-block-32 (per token and 128/32 channels),
  per-token-and-channel (power-of-two channel scales over all tokens first, then per token: not a store
  format, it shows what the channel structure is worth in bytes).
For each: rel-L2 and min per-token cosine per layer, bytes per value with float32 scales, bytes after
zstd-1 on ~1 MiB chunks of codes (+ the scales, also zstd-1), and the order-0 entropy of the codes in bits
(the bound of any per-byte entropy coder), all from the same states.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from numcodecs import Zstd

from hsstore.core import quant

SCHEMES = ("per-tensor", "per-token-all-layers", "per-token", "per-block-128", "per-block-32", "per-token-and-channel")


def synthetic(tokens: int, hidden: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    channel = torch.exp(torch.randn(hidden, generator=g))
    massive = torch.randperm(hidden, generator=g)[:2]
    spikes = torch.rand(tokens, generator=g) < 0.003
    spikes[::512] = True  # the first token of each sample
    out = {}
    for depth, layer in zip((1.0, 4.0, 8.0, 16.0, 30.0), (1, 16, 31, 46, 61)):
        x = torch.randn(tokens, hidden, generator=g) * channel * depth
        if layer > 1:  # massive activations appear after the first layers and stay (as in real LLMs)
            size = 2000 + 3000 * torch.rand(int(spikes.sum()), 2, generator=g)
            x[spikes.nonzero()[:, 0][:, None], massive[None, :]] = size
        out[f"synthetic layer {layer}"] = x.to(torch.bfloat16)
    return out


def model_states(shape: str, tokens: int) -> dict[str, torch.Tensor]:
    from hsstore.capture.model.spec import ModelSpec
    from hsstore.capture.run.hooks import LayerCapture
    from hsstore.testing.factories import SHAPES

    overrides, aux, target = SHAPES[shape]
    if shape == "27b":
        overrides, layers = {**overrides, "num_hidden_layers": 4}, [1, 3]
    else:
        layers = aux + target
    n = overrides["num_hidden_layers"]
    model = ModelSpec("builtin:tiny-qwen3_5", config_overrides=overrides).load(torch.bfloat16, "cpu", "sdpa")
    ids = torch.randint(0, 250, (1, tokens), generator=torch.Generator().manual_seed(0))
    cap = LayerCapture(model, n, layers)
    with torch.no_grad():
        out = cap.run(ids, torch.ones_like(ids))
    cap.close()
    return {f"{shape} layer {i}": out[i][0].contiguous() for i in layers}


def quantize_scheme(states: list[torch.Tensor], scheme: str, pow2: bool) -> list[quant.Quantized]:
    """Every layer of ``states`` ([T, H] each) quantized with ``scheme``."""
    T, H = states[0].shape
    if scheme == "per-tensor":  # scales [1, 1]
        flat = [_quantize_with(x.reshape(1, -1), pow2) for x in states]
        return [quant.Quantized(q.codes.reshape(T, H), q.scales) for q in flat]
    if scheme == "per-token-all-layers":
        q = _quantize_with(torch.cat(states, dim=1), pow2)
        return [quant.Quantized(q.codes[:, j * H : (j + 1) * H], q.scales) for j in range(len(states))]
    if scheme == "per-token-and-channel":  # scales [T, 1] x channel scales [H] (kept on the Quantized)
        out = []
        for x in states:
            col = quant.pow2_scales(x.float().abs().amax(dim=0))
            q = _quantize_with(x.float() / col, pow2)
            out.append(ChannelScaled(q.codes, q.scales, col))
        return out
    block = {"per-token": None, "per-block-128": 128, "per-block-32": 32}[scheme]
    return [_quantize_with(x, pow2, block) for x in states]


class ChannelScaled(quant.Quantized):
    """Codes with per-token scales and, beside them, per-channel scales (value = code * row * column)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, columns: torch.Tensor) -> None:
        super().__init__(codes, scales)
        object.__setattr__(self, "columns", columns)


def entropy_bits(codes: np.ndarray) -> float:
    p = np.bincount(codes.ravel(), minlength=256) / codes.size
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def _quantize_with(x: torch.Tensor, pow2: bool, block: int | None = None) -> quant.Quantized:
    if pow2:
        return quant.quantize(x, block)
    T, H = x.shape
    b = block or H
    blocks = x.float().reshape(T, H // b, b)
    scales = (blocks.abs().amax(-1) / quant.FP8_MAX).clamp_min(1e-30)
    codes = (blocks / scales[..., None]).to(quant.FP8).view(torch.uint8).reshape(T, H)
    return quant.Quantized(codes, scales)


def _dequant(q: quant.Quantized, shape: tuple[int, int]) -> torch.Tensor:
    T, H = shape
    if q.scales.shape[0] != T:  # per-tensor
        return q.fp8.float() * q.scales.reshape(())
    if isinstance(q, ChannelScaled):
        return q.fp8.float() * q.scales * q.columns
    G = q.scales.shape[1]
    return (q.fp8.float().reshape(T, G, H // G) * q.scales[..., None]).reshape(T, H)


def measure(named: dict[str, torch.Tensor], codec: Zstd) -> dict:
    names = list(named)
    states = [named[n] for n in names]
    T, H = states[0].shape
    rows = max(1, (1 << 20) // H)  # ~1 MiB chunks of uint8 codes, as the store cuts them
    out = {}
    for scheme in SCHEMES:
        for pow2 in (True, False):
            qs = quantize_scheme(states, scheme, pow2)
            layers, stored = {}, 0
            for name, x, q in zip(names, states, qs):
                y = _dequant(q, (T, H))
                layers[name] = quant.summary(
                    quant.from_error_tensor(quant.error_tensor(x.float(), y).tolist())
                ).to_dict()
                codes = q.codes.contiguous().numpy()
                stored += sum(len(codec.encode(np.ascontiguousarray(codes[i : i + rows]))) for i in range(0, T, rows))
            scales = (
                sum(q.scales.numel() for q in qs) * 4 if scheme != "per-token-all-layers" else qs[0].scales.numel() * 4
            )
            scales += sum(q.columns.numel() * 4 for q in qs if isinstance(q, ChannelScaled))
            bits = float(np.mean([entropy_bits(q.codes.contiguous().numpy()) for q in qs]))
            scales_z = len(codec.encode(np.ascontiguousarray(torch.cat([q.scales.reshape(-1) for q in qs]).numpy())))
            values = T * H * len(states)
            key = f"{scheme}{'' if pow2 else ' (exact amax/448)'}"
            out[key] = {
                "layers": layers,
                "bytes_per_value": (values + scales) / values,
                "bytes_per_value_zstd": (stored + scales_z) / values,
                "bf16_over_zstd": 2 * values / (stored + scales_z),
                "code_entropy_bits": bits,
            }
    return {"schemes": out, "tokens": T, "hidden": H}


def show(label: str, r: dict) -> None:
    names = list(next(iter(r["schemes"].values()))["layers"])
    print(f"\n{label}: {r['tokens']} tokens x hidden {r['hidden']}; rel-L2 per layer (min per-token cosine)")
    print(
        f"{'scheme':38s}{'B/value':>8}{'zstd B/v':>9}{'vs bf16':>8}{'bits':>6}  "
        + "  ".join(f"{n.split()[-1]:>17s}" for n in names)
    )
    for key, s in r["schemes"].items():
        cells = "  ".join(f"{s['layers'][n]['rel_l2']:.2e} ({s['layers'][n]['cos_min']:.5f})" for n in names)
        print(
            f"{key:38s}{s['bytes_per_value']:8.4f}{s['bytes_per_value_zstd']:9.4f}{s['bf16_over_zstd']:7.2f}x"
            f"{s['code_entropy_bits']:6.2f}  {cells}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", default="synthetic,model-27b")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=5120, help="synthetic states only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    codec = Zstd(level=1)
    report = {}
    for source in args.sources.split(","):
        if source == "synthetic":
            named = synthetic(args.tokens, args.hidden)
        elif source.startswith("model-"):
            named = model_states(source[len("model-") :], args.tokens)
        else:
            raise SystemExit(f"unknown source {source!r}")
        report[source] = measure(named, codec)
        show(source, report[source])
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": report}, indent=1))


if __name__ == "__main__":
    main()
