"""A local model's weight files, checked before any store is made: each file whole (a safetensors file ends
where its header says, a torch zip passes its CRCs, a shard index names files that exist) and the config
agreeing with them (decoder layers and hidden size read from safetensors headers and the shard index) — a
config.json that says 1,000,000 layers over a 4-layer checkpoint is one line, not a worker growing for
minutes."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hsstore.core.errors import BadInput
from hsstore.core.nesting import loads_bounded

MAX_HEADER_BYTES = 100 << 20


def index_shards(index: Path) -> list[str]:
    """The shard file names a sharded checkpoint's ``*.index.json`` maps its weights to."""
    try:
        wmap = loads_bounded(index.read_bytes()[: 64 << 20]).get("weight_map", {})
    except (OSError, ValueError, AttributeError) as e:
        raise BadInput(f"{index} is not a readable weight index ({type(e).__name__}); re-download the checkpoint") from None
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise BadInput(f"{index}: weight_map is not a table of tensor name -> shard file; re-download the checkpoint")
    return sorted(set(wmap.values()))


def check_safetensors(path: Path) -> None:
    """BadInput unless ``path`` is a whole safetensors file: its header parses and its tensors end exactly
    where the file does (a truncated download or a foreign file is named here, before any store is made)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            header = loads_bounded(f.read(n)) if 0 < n <= min(size - 8, 100 << 20) else None
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"] if isinstance(header, dict) else None
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        ends = None
    if ends is None or 8 + n + max(ends, default=0) != size:
        raise BadInput(f"weight file {str(path)!r} is not a whole safetensors file (truncated or damaged?); "
                       "re-download or re-save the checkpoint")


def check_torch_file(path: Path) -> None:
    """BadInput unless ``path`` is a whole torch checkpoint: the zip torch.save writes (since 1.6) with its
    pickle, every member's CRC checked (one read, like hashing it), or a legacy pickle (not checkable
    without loading it: accepted). Found here, before any store is made, not by the worker."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if head != b"PK\x03\x04":
            ok = head[:1] == b"\x80"  # a pickle of protocol 2 or later: the legacy format
        else:
            with zipfile.ZipFile(path) as z:
                ok = any(n.endswith("data.pkl") for n in z.namelist()) and z.testzip() is None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        ok = False
    if not ok:
        raise BadInput(f"weight file {str(path)!r} is not a whole torch checkpoint (truncated or damaged?); "
                       "re-download or re-save the checkpoint")


LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
MAX_HEADER_BYTES = 100 << 20


def _safetensors_header(path: Path) -> dict[str, Any]:
    """Tensor name -> {"shape", "dtype"} from a safetensors file's header (nothing else is read)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n <= MAX_HEADER_BYTES:
            return {}
        header = loads_bounded(f.read(n))
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
                wmap = loads_bounded(p.read_bytes()[:MAX_HEADER_BYTES]).get("weight_map", {})
                names |= set(wmap) if isinstance(wmap, dict) else set()
        except (OSError, ValueError, AttributeError):
            continue  # a damaged file is named by ModelSpec.weight_files' own checks
    return names, shapes


def raw_text_config(config_json: Path) -> Any:
    """The text model's fields of ``config.json`` as written (``text_config`` of a multimodal one), read without
    transformers (whose own checks would blame whatever loaded it first, e.g. the tokenizer); None if unreadable."""
    try:
        raw = loads_bounded(config_json.read_bytes()[:MAX_HEADER_BYTES])
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    return SimpleNamespace(**{k: int(v) if isinstance(v, float) and v.is_integer() else v
                              for k, v in text.items() if isinstance(k, str) and k.isidentifier()})


def check_config_matches_weights(tc: Any, files: list[Path], model: str) -> None:
    """BadInput when the config's decoder layers, hidden size, vocabulary or MLP width differ from what the weight
    files hold (each field named, with what the weights hold)."""
    names, shapes = weight_shapes(files)
    layer_ids = {int(m.group(1)) for n in names for m in [LAYER_RE.search(n)] if m}
    want = _count(getattr(tc, "num_hidden_layers", None))
    if layer_ids and want is not None and want != max(layer_ids) + 1:
        raise BadInput(f"{model}: config.json says num_hidden_layers = {want}, but the weight files hold "
                       f"{max(layer_ids) + 1} decoder layers (layers.0 .. layers.{max(layer_ids)}); fix config.json "
                       "or use the checkpoint it belongs to")
    hidden, vocab = _count(getattr(tc, "hidden_size", None)), _count(getattr(tc, "vocab_size", None))
    embed = next((s for n, s in sorted(shapes.items()) if n.endswith("embed_tokens.weight") and len(s) == 2), None)
    for field, value, held in (("hidden_size", hidden, 1), ("vocab_size", vocab, 0)):
        if embed is not None and value is not None and value != embed[held]:
            raise BadInput(f"{model}: config.json says {field} = {value}, but the embedding in the weight files is "
                           f"{embed[0]} x {embed[1]}; fix config.json or use the checkpoint it belongs to")
    inter = _count(getattr(tc, "intermediate_size", None))
    up = next(((n, s) for n, s in sorted(shapes.items()) if n.endswith(("mlp.up_proj.weight", "mlp.gate_proj.weight"))
               and len(s) == 2), None)
    if up is not None and inter is not None and inter != up[1][0]:
        raise BadInput(f"{model}: config.json says intermediate_size = {inter}, but the weight files hold an MLP "
                       f"{up[1][0]} wide ({up[0]} is {up[1][0]} x {up[1][1]}); fix config.json or use the checkpoint it "
                       "belongs to")


def _count(v: Any) -> int | None:
    """A config count as an int (1e6 written as a float counts too); None when it is no count."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v if isinstance(v, int) else None
