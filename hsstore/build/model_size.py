"""A model's config checked before the model is built: against its weight files (safetensors headers and
the shard index: decoder layers and hidden size must be what the weights hold) and, for builtins whose
weights are drawn in memory, against the memory budget — a config.json that says 1,000,000 layers over a
4-layer checkpoint, or ``hidden_size = 1e9``, is one line, not a worker growing for minutes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hsstore.core.budget import check_fits
from hsstore.core.errors import BadInput

LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
MAX_HEADER_BYTES = 100 << 20


def _safetensors_header(path: Path) -> dict[str, Any]:
    """Tensor name -> {"shape", "dtype"} from a safetensors file's header (nothing else is read)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n <= MAX_HEADER_BYTES:
            return {}
        header = json.loads(f.read(n))
    return {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)} if isinstance(header, dict) else {}


def weight_shapes(files: list[Path]) -> tuple[set[str], dict[str, list[int]]]:
    """(every tensor name the weight files or their index name, shapes of those in safetensors headers)."""
    names: set[str] = set()
    shapes: dict[str, list[int]] = {}
    for p in files:
        try:
            if p.name.endswith(".safetensors"):
                for k, v in _safetensors_header(p).items():
                    names.add(k)
                    if isinstance(v.get("shape"), list):
                        shapes[k] = v["shape"]
            elif p.name.endswith(".index.json"):
                wmap = json.loads(p.read_bytes()[:MAX_HEADER_BYTES]).get("weight_map", {})
                names |= set(wmap) if isinstance(wmap, dict) else set()
        except (OSError, ValueError, AttributeError):
            continue  # a damaged file is named by ModelSpec.weight_files' own checks
    return names, shapes


def check_config_matches_weights(tc: Any, files: list[Path], model: str) -> None:
    """BadInput when the config's decoder layers or hidden size differ from what the weight files hold."""
    names, shapes = weight_shapes(files)
    layer_ids = {int(m.group(1)) for n in names for m in [LAYER_RE.search(n)] if m}
    want = getattr(tc, "num_hidden_layers", None)
    if layer_ids and isinstance(want, int) and want != max(layer_ids) + 1:
        raise BadInput(f"{model}: config.json says num_hidden_layers = {want}, but the weight files hold "
                       f"{max(layer_ids) + 1} decoder layers (layers.0 .. layers.{max(layer_ids)}); fix config.json "
                       "or use the checkpoint it belongs to")
    hidden = getattr(tc, "hidden_size", None)
    embed = next((s for n, s in sorted(shapes.items()) if n.endswith("embed_tokens.weight") and len(s) == 2), None)
    if embed is not None and isinstance(hidden, int) and hidden != embed[1]:
        raise BadInput(f"{model}: config.json says hidden_size = {hidden}, but the embedding in the weight files is "
                       f"{embed[0]} x {embed[1]}; fix config.json or use the checkpoint it belongs to")


def min_parameters(tc: Any) -> int:
    """A lower bound on a decoder-only model's parameters: its embedding and every layer's MLP."""
    def num(key: str) -> int:
        v = getattr(tc, key, 0)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    h, inter = num("hidden_size"), num("intermediate_size")
    return num("vocab_size") * h + num("num_hidden_layers") * 3 * h * inter


def check_builtin_fits(tc: Any, model: str) -> None:
    """ResourceLimit when a builtin's weights (drawn in fp32) cannot fit the memory budget."""
    check_fits(4 * min_parameters(tc), f"{model} with these config overrides ({min_parameters(tc):,} parameters "
               "at least, drawn in fp32)", "choose smaller [model] config overrides (hidden_size, num_hidden_layers, "
               "intermediate_size)")
