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
# Selector keys always accepted (they name fields a store may hold none of yet, e.g. no FP8 variant).
ALWAYS_KEYS = ("precision", "storage", "storage.precision")


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
    text = "(absent)" if value is _ABSENT else _as_text(value)
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


def _choices(variants: Mapping[str, Mapping[str, Any]]) -> str:
    apart = distinguishing(variants)
    return "; ".join(label(vid, p, apart[vid]) for vid, p in sorted(variants.items())) or "(none)"


def _stored_as_computed(provenance: Mapping[str, Any]) -> bool:
    return "storage" not in provenance.get("environment", {})


def _check_keys(selector: str, pairs: Mapping[str, str], variants: Mapping[str, Mapping[str, Any]]) -> None:
    """SelectorError for a key that names no provenance field of any variant, with the valid keys."""
    import difflib

    paths = {k for p in variants.values() for k in flatten(p)}
    known = lambda key: key in ALWAYS_KEYS or any(p == key or p.endswith("." + key) for p in paths)  # noqa: E731
    for key in pairs:
        if not known(key):
            leaves = sorted({p.rsplit(".", 1)[-1] for p in paths
                             if not is_informational(p) and not p.startswith("recipe.model.weights.")} | {"precision"})
            close = difflib.get_close_matches(key, leaves + sorted(paths), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SelectorError(
                f"selector {selector!r}: unknown key {key!r}; {hint}valid keys: {', '.join(leaves)} "
                "(or any dotted provenance path, e.g. environment.batching.token_budget)"
            )


def select(variants: Mapping[str, Mapping[str, Any]], selector: str | None, where: str = "store") -> str:
    """The one variant id in ``variants`` (id -> provenance) that ``selector`` names; never a guess: an
    ambiguous selector is refused with the fields that tell the candidates apart."""
    if not variants:
        raise SelectorError(f"{where} holds no committed variant; build one with `hsstore build MANIFEST`")
    if selector is None or selector == "":
        if len(variants) == 1:
            return next(iter(variants))
        raise SelectorError(
            f"{where} holds {len(variants)} variants; name one as {where}#SELECTOR, "
            f"e.g. #backend=torch,dtype=bf16 or an id prefix. Choices: {_choices(variants)}"
        )
    parsed = parse_selector(selector)
    if isinstance(parsed, str):
        hits = [vid for vid in variants if vid.startswith(parsed)]
    else:
        _check_keys(selector, parsed, variants)
        hits = [vid for vid, p in variants.items() if matches(p, parsed)]
        if len(hits) > 1 and not any(k == "precision" or k.endswith("storage.precision") or k == "storage"
                                     for k in parsed):
            # a selector that names no storage precision means the states as computed (#dtype=bf16 keeps
            # naming the bf16 variant when an FP8 one is derived from it); FP8 ones are named by precision=
            computed = [vid for vid in hits if _stored_as_computed(variants[vid])]
            hits = computed if len(computed) == 1 else hits
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise SelectorError(f"selector {selector!r} matches no variant in {where}. Choices: {_choices(variants)}")
    among = {vid: variants[vid] for vid in sorted(hits)}
    apart = distinguishing(among, by_line=False)
    keys = list(next(iter(apart.values())))
    usable = [(k, f[k]) for f in apart.values() for k in keys if f[k] != "(absent)" and not f[k].endswith("…")]
    hint = f"; they differ in {', '.join(keys[:MAX_SHOWN])}{' …' if len(keys) > MAX_SHOWN else ''}" if keys else ""
    hint += f": add one to the selector, e.g. #{selector},{usable[0][0]}={usable[0][1]}" if usable else ""
    raise SelectorError(f"selector {selector!r} matches {len(hits)} variants in {where}{hint}. "
                        f"Choices: {'; '.join(label(v, p, apart[v]) for v, p in among.items())}")


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
