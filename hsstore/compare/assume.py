"""How to recompute a variant's states: from its provenance where it says, from the user's options where
it says ``unknown`` (an imported cache), else from defaults a user would expect — and what was assumed.

Defaults: the device is the first GPU when one is visible, else the CPU; the backend is ``fla`` on a GPU
where the kernels are installed, else ``torch``; the dtype is the stored dtype (for an imported fp32 cache
whose values are all bf16 or fp16 values, that narrower dtype: computed there, saved upcast); attention is ``sdpa``;
batching is the recorded batch plan, else each sample alone (how SpecForge, Model-Optimizer and EAGLE
dump states: one conversation per forward). Each assumption is returned in words, so the report can say
what its verdict rests on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hsstore.core.errors import BadInput
from hsstore.core.schema.manifest import ATTENTION, BACKENDS
from hsstore.core.schema.record import or_none
from hsstore.core.schema.imported import ImportSource
from hsstore.core.schema.provenance import Batching
from hsstore.storage.store import VariantReader

UNKNOWN = "unknown"
DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class Recompute:
    """The settings of a recomputation; ``token_budget`` None = each sample alone (recorded plan: ``plan``)."""

    backend: str
    dtype: str
    device: str
    attention: str
    batching: str  # "recorded" | "alone" | "budget"
    token_budget: int | None = None
    assumed: dict[str, str] = field(default_factory=dict)  # field -> why this value (only what was not recorded)


def _known(value: object) -> str | None:
    v = or_none(value)
    return None if v in (None, UNKNOWN, "") else str(v)


def _pick(name: str, given: str | None, recorded: str | None, default: str, why_default: str,
          allowed: tuple[str, ...], assumed: dict[str, str]) -> str:
    if given is not None and given not in allowed:
        raise BadInput(f"--{name} {given!r}: choose one of {', '.join(allowed)}")
    if given is not None:
        if recorded is not None and recorded != given:
            assumed[name] = f"{given} (--{name}; the variant records {recorded})"
        return given
    if recorded is not None:
        return recorded
    assumed[name] = f"{default} ({why_default}; the variant records {name} unknown: pass --{name} to change)"
    return default


def _computed_narrower(reader: VariantReader, assumed: dict[str, str]) -> str | None:
    """'bf16' or 'fp16' when every stored value of the variant's first sample is a value of that type: an
    imported fp32 cache computed at that precision and saved upcast (judged at fp32 it would read as
    beyond noise everywhere)."""
    from hsstore.compare.transforms import narrower_values

    if not reader.keys:
        return None
    layers = reader.record.all_layers
    found = {narrower_values(x) for x in reader.read_layers(reader.refs[reader.keys[0]], layers)}
    narrow = found.pop() if len(found) == 1 else None
    if narrow is not None:
        assumed["dtype"] = (f"{narrow} (every stored value of the first sample is a {narrow} value: computed at "
                            f"{narrow} and saved as fp32; the import does not record it: pass --dtype fp32 to judge "
                            "the states at fp32)")
    return narrow


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def how_to_recompute(reader: VariantReader, backend: str | None = None, dtype: str | None = None,
                     device: str | None = None, attention: str | None = None,
                     token_budget: int | None = None) -> Recompute:
    """The recomputation settings for ``reader``'s variant, with every assumption named."""
    from hsstore.capture.model.backends import installed, require_attention

    env = reader.record.prov.environment
    assumed: dict[str, str] = {}
    rec_device = _known(env.device)
    dev = device or (rec_device.split(":")[0] if rec_device else None)
    if dev is None:
        dev = default_device()
        assumed["device"] = (f"{dev} ({'a GPU is visible' if dev == 'cuda' else 'no GPU is visible'}; the variant "
                             "records device unknown: pass --device to change)")
    on_gpu = dev.startswith("cuda")
    fla_default = "fla" if on_gpu and installed("fla") else "torch"
    why_backend = "the fla kernels are installed and it runs on a GPU" if fla_default == "fla" else (
        "transformers' reference kernels")
    be = _pick("backend", backend, _known(env.backend), fla_default, why_backend, BACKENDS, assumed)
    stored = reader.record.dtype if reader.record.dtype in DTYPES else _known(env.dtype)
    dt = _pick("dtype", dtype, stored, "bf16", "the usual training dtype", DTYPES, assumed)
    if dtype is None and dt == "fp32" and isinstance(reader.record.prov.source, ImportSource):
        dt = _computed_narrower(reader, assumed) or dt
    kernels = env.kernels.to_dict() if hasattr(env.kernels, "to_dict") else {}
    attn = _pick("attn", attention, _known(kernels.get("attention")), "sdpa", "transformers' default",
                 ATTENTION, assumed)
    require_attention(attn, "install it on a GPU host, or pass --attn sdpa")
    if token_budget is not None:
        if token_budget < 1:
            raise BadInput(f"--token-budget {token_budget}: must be 1 or more (padded tokens per batch), e.g. 2048")
        return Recompute(be, dt, dev, attn, "budget", token_budget, assumed)
    if isinstance(env.batching, Batching) and env.batching.token_budget >= 1:
        return Recompute(be, dt, dev, attn, "recorded", None, assumed)
    assumed["batching"] = ("each sample alone, unpadded (the variant records no batching; pass --token-budget N "
                           "to recompute in hsstore's token-budget batches instead)")
    return Recompute(be, dt, dev, attn, "alone", None, assumed)
