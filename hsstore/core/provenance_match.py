"""Provenance: variant ids, flattening and comparison — pure functions over dicts (selectors: core.selectors)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hsstore.core.errors import BadInput, ProvenanceMismatch
from hsstore.core.keys import fingerprint

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
    # the tool that generated regenerated replies: the sample keys cover the tokens it generated
    "recipe.generation.engine_version",
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


def drift_names(allow_drift: Iterable[str] | str | None) -> tuple[str, ...]:
    """``allow_drift`` as field names: None allows none, one string is one name (not its letters)."""
    if allow_drift is None:
        return ()
    names = (allow_drift,) if isinstance(allow_drift, str) else tuple(allow_drift)
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        raise BadInput(f"allow_drift takes provenance field names (e.g. ['kernels', 'versions']), not {bad[0]!r}")
    return names


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
    have: Mapping[str, Any], want: Mapping[str, Any], allow_drift: Iterable[str] | str | None = ()
) -> list[tuple[str, Any, Any]]:
    """Every numeric field where ``have`` and ``want`` differ, as (field, have, want), sorted."""
    allow = drift_names(allow_drift)
    a, b = numeric_fields(have), numeric_fields(want)
    out = []
    for field in sorted(set(a) | set(b)):
        va, vb = a.get(field, "<absent>"), b.get(field, "<absent>")
        if va != vb and not _allowed(field, allow):
            out.append((field, va, vb))
    return out


def require_match(
    have: Mapping[str, Any], want: Mapping[str, Any], allow_drift: Iterable[str] | str | None = (), what: str = "store"
) -> None:
    """Raise ProvenanceMismatch listing every differing numeric field."""
    diffs = differences(have, want, allow_drift)
    if diffs:
        raise ProvenanceMismatch(diffs, what=what)


def _model(provenance: Mapping[str, Any]) -> Mapping[str, Any]:
    model = provenance.get("recipe", {}).get("model", {})
    return model if isinstance(model, Mapping) else {}


def model_fingerprint(provenance: Mapping[str, Any]) -> str | None:
    """The weights' fingerprint of the model a variant is of (None: not known, e.g. an import without weights)."""
    fp = _model(provenance).get("fingerprint")
    return fp if isinstance(fp, str) and fp and fp != "unknown" else None


def identified(provenance: Mapping[str, Any]) -> bool:
    """Whether the model of a variant is known by more than its shape (an import given no model is not)."""
    return model_fingerprint(provenance) is not None or _model(provenance).get("config_fingerprint") != "unknown"


def model_name(provenance: Mapping[str, Any]) -> str:
    """The model's name and fingerprint prefix (or, for a model known by its shape only, that shape), as a
    one-line error or ``info`` names it."""
    m = _model(provenance)
    if not identified(provenance):
        return (
            f"{m.get('name', '?')} (shape only: {m.get('num_layers', '?')} layers, hidden {m.get('hidden_size', '?')})"
        )
    fp = model_fingerprint(provenance)
    return f"{m.get('name', '?')} ({fp[:12] if fp else 'config ' + str(m.get('config_fingerprint'))[:12]})"


def same_model(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two variants are states of one model: the same weights' fingerprint, or where one is not
    known (an import without weights), the same config fingerprint and architecture, or where not even the
    config is (an import given no model), the same shape."""
    fa, fb = model_fingerprint(a), model_fingerprint(b)
    if fa is not None and fb is not None:
        return fa == fb
    ma, mb = _model(a), _model(b)
    if "unknown" in (ma.get("config_fingerprint"), mb.get("config_fingerprint")):  # an import given no model:
        return all(ma.get(k) == mb.get(k) for k in ("num_layers", "hidden_size"))  # only its shape is known
    if ma.get("config_fingerprint") is None or mb.get("config_fingerprint") is None:  # older records: all of it
        return {k: v for k, v in ma.items() if k != "path"} == {k: v for k, v in mb.items() if k != "path"}
    keys = ("config_fingerprint", "model_type", "num_layers", "hidden_size")
    return all(ma.get(k) == mb.get(k) for k in keys)
