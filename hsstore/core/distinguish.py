"""Telling variants apart: the one-line description of a variant, the fields that differ between variants
sharing that line (written as selector keys), and what a build says when it starts such a variant."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hsstore.core.provenance_match import flatten, numeric_fields


def as_text(value: Any) -> str:
    """A provenance value as a selector spells it (``true``, ``0,1``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(as_text(v) for v in value)
    return str(value)


def describe(provenance: Mapping[str, Any]) -> str:
    """One short line: backend, dtype, device, attention (and a storage precision)."""
    env = provenance.get("environment", {})
    precision = env.get("storage", {}).get("precision") if isinstance(env.get("storage"), Mapping) else None
    return "backend={} dtype={} device={} attention={}{}".format(
        env.get("backend"), env.get("dtype"), env.get("device"), env.get("kernels", {}).get("attention"),
        f" precision={precision}" if precision else "",
    )


# Fields shown first when they tell variants apart: the settings a person changes between builds.
_FIRST = ("environment.batching", "recipe.max_length", "recipe.truncation", "environment.storage",
          "environment.kernels", "environment.flags", "environment.versions", "environment.device_name",
          "recipe.layers", "recipe.capture", "recipe.final_norm", "recipe.tokenizer", "recipe.model")
MAX_SHOWN = 4  # differing fields shown per variant; the rest are counted


def _rank(path: str) -> tuple[int, str]:
    return next((i for i, p in enumerate(_FIRST) if path == p or path.startswith(p + ".")), len(_FIRST)), path


def selector_key(path: str, paths: Iterable[str]) -> str:
    """The shortest dotted suffix of ``path`` that names it alone among ``paths`` (a selector key)."""
    parts, others = path.split("."), [p for p in paths if p != path]
    for n in range(1, len(parts) + 1):
        key = ".".join(parts[-n:])
        if not any(o == key or o.endswith("." + key) for o in others):
            return key
    return path


def _short(value: Any) -> str:
    text = "(absent)" if value is _ABSENT else as_text(value)
    return text if len(text) <= 20 else text[:16] + "…"


_ABSENT = object()


def distinguishing(variants: Mapping[str, Mapping[str, Any]], by_line: bool = True) -> dict[str, dict[str, str]]:
    """Variant id -> {selector key: value} of the fields that can change numbers and differ among the
    variants sharing its ``describe`` line (``by_line=False``: among all of them); empty for a variant
    nothing shares its line with. Most telling fields first."""
    groups: dict[str, list[str]] = {}
    for vid, prov in variants.items():
        groups.setdefault(describe(prov) if by_line else "", []).append(vid)
    out: dict[str, dict[str, str]] = {vid: {} for vid in variants}
    every_path = {k for p in variants.values() for k in flatten(p)}
    for vids in groups.values():
        if len(vids) < 2:
            continue
        fields = {vid: numeric_fields(variants[vid]) for vid in vids}
        paths = sorted({k for f in fields.values() for k in f}, key=_rank)
        differing = [k for k in paths if len({repr(f.get(k, _ABSENT)) for f in fields.values()}) > 1]
        for vid in vids:
            out[vid] = {selector_key(k, every_path): _short(fields[vid].get(k, _ABSENT)) for k in differing}
    return out


def label(vid: str, provenance: Mapping[str, Any], fields: Mapping[str, str]) -> str:
    """``vid (describe line + the fields that tell it apart)``, e.g. ``3f2a… (backend=torch … token_budget=2048)``."""
    shown = [f"{k}={v}" for k, v in list(fields.items())[:MAX_SHOWN]]
    more = f" +{len(fields) - MAX_SHOWN} more differing field(s)" if len(fields) > MAX_SHOWN else ""
    return f"{vid} ({' '.join([describe(provenance), *shown])}{more})"


# Why a field of the variant id can change a stored number (the fields that cannot are INFORMATIONAL and
# never fork a variant; nor do the codec, the unit size or where the store lives, which are not provenance).
WHY = (
    ("environment.batching", "batch shapes decide which kernels run and how sums round"),
    ("recipe.max_length", "it decides where long rows are cut, and so the batches"),
    ("recipe.truncation", "it decides which long rows are kept, and so the batches"),
    ("environment.versions", "another version can bind other kernels"),
    ("environment.kernels", "another kernel sums in another order"),
    ("environment.flags", "TF32 and determinism flags change the arithmetic"),
    ("environment.storage", "it is the stored precision"),
    ("recipe.model", "other weights or config"),
    ("recipe.tokenizer", "other tokens"),
)


def why(path: str) -> str:
    """A short reason why the field at ``path`` (part of a variant id) can change a number."""
    return next((w for p, w in WHY if path == p or path.startswith(p + ".")),
                "it is part of how the states were computed")


def fork_note(vid: str, provenance: Mapping[str, Any], existing: Mapping[str, Mapping[str, Any]]) -> str | None:
    """What a build says when it starts a new variant beside one with the same backend/dtype/device line:
    the fields that made it new, their values on both sides, and why each can change numbers; None when
    no variant in ``existing`` (id -> provenance) shares its line."""
    line = describe(provenance)
    twins = {v: p for v, p in existing.items() if v != vid and describe(p) == line}
    if vid in existing or not twins:
        return None
    mine = numeric_fields(provenance)

    def diffs(other: Mapping[str, Any]) -> list[str]:
        theirs = numeric_fields(other)
        return sorted((k for k in set(mine) | set(theirs) if mine.get(k, _ABSENT) != theirs.get(k, _ABSENT)), key=_rank)

    other = min(twins, key=lambda v: (len(diffs(twins[v])), v))
    fields = diffs(twins[other])
    paths = {k for p in [provenance, *twins.values()] for k in flatten(p)}
    theirs = numeric_fields(twins[other])
    said = "; ".join(f"{selector_key(k, paths)} {_short(mine.get(k, _ABSENT))} (was {_short(theirs.get(k, _ABSENT))}): "
                     f"{why(k)}" for k in fields[:MAX_SHOWN])
    more = f"; +{len(fields) - MAX_SHOWN} more" if len(fields) > MAX_SHOWN else ""
    key = selector_key(fields[0], paths)
    return (f"new variant {vid} beside {other} ({line}): it differs in {said}{more}. Each of these can change "
            f"numbers, so the states are kept apart; name this one with #{key}={_short(mine.get(fields[0], _ABSENT))}")
