"""Provenance: variant ids, flattening, comparison and selectors — pure functions over dicts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hsstore.core.canonical import fingerprint
from hsstore.core.errors import ProvenanceMismatch, SelectorError

# Fields recorded for people but never matched and never part of a variant id:
# they cannot change a single number (where a model lives, which host ran it, tool versions).
INFORMATIONAL = (
    "recipe.model.path",
    "environment.host",
    "environment.device_index",
    "environment.model_parallel",  # a layer runs whole on one GPU of the group: same numbers as on one
    "environment.versions.python",
    "environment.versions.hsstore",
    "environment.created",
    "source.path",  # an imported cache moved to another folder is the same cache
    # the variant a converted one was derived from: quantizing it gives the same codes as quantizing
    # at build time (the precision and scale, which change numbers, are matched)
    "environment.storage.source",
)
VARIANT_ID_LENGTH = 12


def is_informational(field: str) -> bool:
    return any(field == p or field.startswith(p + ".") for p in INFORMATIONAL)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, path + "."))
        else:
            out[path] = v
    return out


def numeric_fields(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened fields that can change numbers (everything but INFORMATIONAL)."""
    return {k: v for k, v in flatten(provenance).items() if not is_informational(k)}


def variant_id(provenance: Mapping[str, Any]) -> str:
    """Short hash of the canonical JSON of the fields that can change numbers."""
    return fingerprint(numeric_fields(provenance))[:VARIANT_ID_LENGTH]


def _allowed(field: str, allow_drift: Iterable[str]) -> bool:
    """An allowed name matches a field when its dotted segments occur in the field's, in a row
    (``"dtype"``, ``"kernels"`` and ``"environment.versions.torch"`` all name fields)."""
    f = field.split(".")
    for a in allow_drift:
        s = a.split(".")
        if any(f[i : i + len(s)] == s for i in range(len(f) - len(s) + 1)):
            return True
    return False


def differences(
    have: Mapping[str, Any], want: Mapping[str, Any], allow_drift: Iterable[str] = ()
) -> list[tuple[str, Any, Any]]:
    """Every numeric field where ``have`` and ``want`` differ, as (field, have, want), sorted."""
    allow = tuple(allow_drift)
    a, b = numeric_fields(have), numeric_fields(want)
    out = []
    for field in sorted(set(a) | set(b)):
        va, vb = a.get(field, "<absent>"), b.get(field, "<absent>")
        if va != vb and not _allowed(field, allow):
            out.append((field, va, vb))
    return out


def require_match(
    have: Mapping[str, Any], want: Mapping[str, Any], allow_drift: Iterable[str] = (), what: str = "store"
) -> None:
    """Raise ProvenanceMismatch listing every differing numeric field."""
    diffs = differences(have, want, allow_drift)
    if diffs:
        raise ProvenanceMismatch(diffs, what=what)


def parse_selector(selector: str) -> dict[str, str] | str:
    """``"backend=torch,dtype=bf16"`` -> dict; anything without ``=`` is an id prefix."""
    selector = selector.strip()
    if "=" not in selector:
        if not selector or not all(c in "0123456789abcdef" for c in selector):
            raise SelectorError(
                f"selector {selector!r} is neither a variant id prefix (hex) nor key=value pairs "
                "(e.g. 'backend=torch,dtype=bf16')"
            )
        return selector
    pairs: dict[str, str] = {}
    for part in selector.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise SelectorError(f"selector part {part!r} is not key=value (e.g. 'dtype=bf16')")
        if key.strip() in pairs:  # the last would silently win: 'dtype=bf16,dtype=fp32' names fp32
            raise SelectorError(f"selector {selector!r} names {key.strip()!r} twice; give each key once")
        pairs[key.strip()] = value.strip()
    return pairs


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(_as_text(v) for v in value)
    return str(value)


def matches(provenance: Mapping[str, Any], pairs: Mapping[str, str]) -> bool:
    """True if every key (a dotted path, or its last segments) has the given value."""
    flat = flatten(provenance)
    for key, want in pairs.items():
        hits = [v for path, v in flat.items() if path == key or path.endswith("." + key)]
        if not hits or not any(_as_text(v) == want for v in hits):
            return False
    return True


def describe(provenance: Mapping[str, Any]) -> str:
    """One short line: backend, dtype, device, attention."""
    env = provenance.get("environment", {})
    precision = env.get("storage", {}).get("precision") if isinstance(env.get("storage"), Mapping) else None
    return "backend={} dtype={} device={} attention={}{}".format(
        env.get("backend"), env.get("dtype"), env.get("device"), env.get("kernels", {}).get("attention"),
        f" precision={precision}" if precision else "",
    )


def _stored_as_computed(provenance: Mapping[str, Any]) -> bool:
    return "storage" not in provenance.get("environment", {})


def select(variants: Mapping[str, Mapping[str, Any]], selector: str | None, where: str = "store") -> str:
    """The one variant id in ``variants`` (id -> provenance) that ``selector`` names."""
    choices = "; ".join(f"{vid} ({describe(p)})" for vid, p in sorted(variants.items())) or "(none)"
    if not variants:
        raise SelectorError(f"{where} holds no committed variant; build one with `hsstore build MANIFEST`")
    if selector is None or selector == "":
        if len(variants) == 1:
            return next(iter(variants))
        raise SelectorError(
            f"{where} holds {len(variants)} variants; name one as {where}#SELECTOR, "
            f"e.g. #backend=torch,dtype=bf16 or an id prefix. Choices: {choices}"
        )
    parsed = parse_selector(selector)
    if isinstance(parsed, str):
        hits = [vid for vid in variants if vid.startswith(parsed)]
    else:
        hits = [vid for vid, p in variants.items() if matches(p, parsed)]
        if len(hits) > 1 and not any(k == "precision" or k.endswith("storage.precision") or k == "storage"
                                     for k in parsed):
            # a selector that names no storage precision means the states as computed (#dtype=bf16 keeps
            # naming the bf16 variant when an FP8 one is derived from it); FP8 ones are named by precision=
            computed = [vid for vid in hits if _stored_as_computed(variants[vid])]
            hits = computed if len(computed) == 1 else hits
    if len(hits) == 1:
        return hits[0]
    what = "no variant" if not hits else f"{len(hits)} variants"
    raise SelectorError(f"selector {selector!r} matches {what} in {where}. Choices: {choices}")
