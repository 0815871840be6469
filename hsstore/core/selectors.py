"""Selectors: ``STORE#SELECTOR`` names one variant by an id prefix, its label, or ``key=value`` pairs
(a hash's value by a prefix of at least 8 characters); never a guess — an ambiguous selector is refused
with a selector for each candidate that names it alone, an unknown key with the valid ones."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import combinations
from typing import Any

from hsstore.core.errors import SelectorError
from hsstore.core.provenance_match import flatten, is_informational, numeric_fields

# --- Telling variants apart: the one-line description of a variant, the FEWEST fields that name each variant

LABEL_KEY = "label"  # the selector key of a variant's human label (kept beside the provenance, not in it)
VARIANT_KEY = "variant"  # the selector key of a variant's own id (a prefix), never a provenance field
PRECISION_KEYS = ("precision", "storage", "storage.precision")  # keys that name a storage precision
_RESERVED = (LABEL_KEY, VARIANT_KEY, "storage")  # never a provenance field's key: they mean the above


def field_key(key: str) -> str:
    """The provenance key a selector key names: ``storage`` is the storage precision, as ``precision``."""
    return "storage.precision" if key == "storage" else key


def as_text(value: Any) -> str:
    """A provenance value as a selector spells it (``true``, ``0,1``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(as_text(v) for v in value)
    return str(value)


HASH_MIN = 16  # a hex string at least this long is a hash: a selector may give a prefix of it
PREFIX_MIN = 8  # the shortest hash prefix a selector may give (and the shortest one suggested)


def is_hash(value: Any) -> bool:
    return isinstance(value, str) and len(value) >= HASH_MIN and all(c in "0123456789abcdef" for c in value)


def value_matches(value: Any, want: str) -> bool:
    """Whether a selector's ``want`` names ``value``: as spelled, or a prefix (>= PREFIX_MIN) of a hash."""
    return as_text(value) == want or (is_hash(value) and len(want) >= PREFIX_MIN and value.startswith(want))


def describe(provenance: Mapping[str, Any]) -> str:
    """One short line: backend, dtype, device, attention (and a storage precision)."""
    env = provenance.get("environment", {})
    precision = env.get("storage", {}).get("precision") if isinstance(env.get("storage"), Mapping) else None
    return "backend={} dtype={} device={} attention={}{}".format(
        env.get("backend"),
        env.get("dtype"),
        env.get("device"),
        env.get("kernels", {}).get("attention"),
        f" precision={precision}" if precision else "",
    )


# Fields tried first when naming a variant: those the description line shows, then the settings a person
# changes between builds; among equally few fields the earlier ones are chosen.
_FIRST = (
    "environment.dtype",
    "environment.kernels.attention",
    "environment.storage.precision",
    "environment.backend",
    "environment.device",
    "environment.batching",
    "recipe.max_length",
    "recipe.truncation",
    "environment.storage",
    "environment.kernels",
    "environment.flags",
    "environment.versions",
    "environment.device_name",
    "recipe.layers",
    "recipe.capture",
    "recipe.final_norm",
    "recipe.tokenizer",
    "recipe.model",
    "source",
)
MAX_SHOWN = 4  # differing fields shown per variant by a build's note; the rest are counted
MAX_EXACT = 4  # the most fields the exact search tries together; beyond, fields are added greedily


def _rank(path: str) -> tuple[int, str]:
    return next((i for i, p in enumerate(_FIRST) if path == p or path.startswith(p + ".")), len(_FIRST)), path


def selector_key(path: str, paths: Iterable[str]) -> str:
    """The shortest dotted suffix of ``path`` that names it alone among ``paths`` (a selector key)."""
    parts, others = path.split("."), [p for p in paths if p != path]
    for n in range(1, len(parts) + 1):
        key = ".".join(parts[-n:])
        if key not in _RESERVED and not any(o == key or o.endswith("." + key) for o in others):
            return key
    return path


def _short(value: Any) -> str:
    text = "(absent)" if value is _ABSENT else as_text(value)
    return text if len(text) <= 20 else text[:16] + "…"


_ABSENT = object()


def _spelled(value: Any, others: Iterable[Any]) -> str | None:
    """``value`` as a selector can give it (a hash: its shortest prefix of at least PREFIX_MIN characters
    that no other value starts with); None when a selector cannot (absent, or holding ``,`` ``=`` ``#``)."""
    if value is _ABSENT:
        return None
    text = as_text(value)
    if is_hash(value):
        rest = [as_text(o) for o in others if o is not _ABSENT and as_text(o) != text]
        n = next((n for n in range(PREFIX_MIN, len(text)) if not any(o.startswith(text[:n]) for o in rest)), len(text))
        return text[:n]
    if not text or any(c in text for c in ",=#") or text != text.strip():
        return None
    return text


def _stored(provenance: Mapping[str, Any]) -> bool:
    """Whether the states are stored in another precision than computed (an FP8 variant)."""
    return "storage" in provenance.get("environment", {})


class Apart:
    """The store's variants as a table of the fields that can change numbers, for naming each one alone."""

    def __init__(self, variants: Mapping[str, Mapping[str, Any]]) -> None:
        self.variants = variants
        self.fields = {vid: numeric_fields(p) for vid, p in variants.items()}
        every = self.every = {k for p in variants.values() for k in flatten(p)}
        paths = sorted({k for f in self.fields.values() for k in f}, key=_rank)
        differing = [k for k in paths if len({repr(f.get(k, _ABSENT)) for f in self.fields.values()}) > 1]
        self.keys = {k: selector_key(k, every) for k in differing}

    def fewest(self, vid: str) -> list[tuple[str, str]] | None:
        """The fewest ``(key, value)`` pairs that name ``vid`` alone (``[]``: it is the only variant), most
        telling first; None when no selector of fields can (then only its id names it). A selector naming no
        storage precision names only variants stored as computed, so an FP8 variant's always names its precision
        and is told apart from the other FP8 ones only."""
        if len(self.variants) == 1:
            return []
        mine, stored = self.fields[vid], _stored(self.variants[vid])
        others = {u for u in self.variants if u != vid and _stored(self.variants[u]) == stored}
        pairs = self._cover(vid, others)
        if pairs is None or any(k in PRECISION_KEYS for k, _ in pairs):
            return pairs
        if stored:
            return [("precision", as_text(self.variants[vid]["environment"]["storage"]["precision"])), *pairs]
        # as computed, alone among those: any of its fields names it (FP8 ones are left out without precision=)
        dtype = "environment.dtype"
        return pairs or ([(selector_key(dtype, self.every), as_text(mine[dtype]))] if dtype in mine else [])

    def _cover(self, vid: str, others: set[str]) -> list[tuple[str, str]] | None:
        """The fewest pairs of ``vid``'s fields that exclude every one of ``others`` (``[]`` for none)."""
        mine = self.fields[vid]
        if not others:
            return []
        columns: dict[frozenset[str], tuple[str, str]] = {}
        for path, key in self.keys.items():
            spelled = _spelled(mine.get(path, _ABSENT), (f.get(path, _ABSENT) for f in self.fields.values()))
            if spelled is None:
                continue
            out = frozenset(
                u
                for u in others
                if not value_matches(self.fields[u].get(path, _ABSENT), spelled) or path not in self.fields[u]
            )
            if out and out not in columns:  # keep the most telling of fields that exclude the same variants
                columns[out] = (key, spelled)
        return _cover(others, columns)

    def selector(self, vid: str, labels: Mapping[str, str] | None = None) -> str:
        """The shortest selector naming ``vid`` alone: its label, else its fewest fields, else its id."""
        lab = (labels or {}).get(vid)
        if lab:
            return label_selector(lab)
        pairs = self.fewest(vid)
        return ",".join(f"{k}={v}" for k, v in pairs) if pairs else vid


def _cover(others: set[str], columns: Mapping[frozenset[str], tuple[str, str]]) -> list[tuple[str, str]] | None:
    """The fewest columns whose excluded variants together are ``others``: exact up to MAX_EXACT columns
    (fewer tried together when there are many), then greedy."""
    cols = list(columns.items())
    if not cols or frozenset().union(*columns) != others:
        return None
    limit = MAX_EXACT if len(cols) <= 40 else 2
    for n in range(1, min(limit, len(cols)) + 1):
        for combo in combinations(cols, n):
            if frozenset().union(*(c[0] for c in combo)) == others:
                return [c[1] for c in combo]
    left, chosen = set(others), []
    while left:
        best = max(cols, key=lambda c: len(c[0] & left))
        chosen.append(best[1])
        left -= best[0]
    return chosen


def label_selector(label: str) -> str:
    """How a selector names a labelled variant: the bare label, or ``label=L`` where it reads as an id prefix."""
    return f"{LABEL_KEY}={label}" if all(c in "0123456789abcdef" for c in label) else label


def distinguishing(variants: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Variant id -> {selector key: value}: the fewest fields that tell it from every other variant of
    ``variants`` (as a selector they name it alone); empty when it is the only one or no fields can."""
    apart = Apart(variants)
    return {vid: dict(apart.fewest(vid) or []) for vid in variants}


_SHOWN = ("backend", "dtype", "device", "attention", "precision")  # keys the description line shows


def choice(vid: str, provenance: Mapping[str, Any], fields: Mapping[str, str]) -> str:
    """``vid (describe line + the fields that tell it apart)``, e.g. ``3f2a… (backend=torch … token_budget=2048)``;
    a field the line shows already is not said twice."""
    line = describe(provenance)
    extra = [f"{k}={v}" for k, v in fields.items() if not (k in _SHOWN and f"{k}={v}" in line.split())]
    return f"{vid} ({' '.join([line, *extra])})"


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
    return next(
        (w for p, w in WHY if path == p or path.startswith(p + ".")), "it is part of how the states were computed"
    )


def fork_note(
    vid: str,
    provenance: Mapping[str, Any],
    existing: Mapping[str, Mapping[str, Any]],
    labels: Mapping[str, str] | None = None,
    every: Mapping[str, Mapping[str, Any]] | None = None,
) -> str | None:
    """What a build says when it makes a new variant beside others: the fields that tell it from the
    closest one, their values on both sides, why each can change numbers, and the selector that names it
    alone among ``every`` (default: ``existing`` and it; ``labels``: variant id -> label); None when
    ``existing`` (id -> provenance) holds it already or holds nothing else."""
    others = {v: p for v, p in existing.items() if v != vid}
    if vid in existing or not others:
        return None
    mine = numeric_fields(provenance)

    def diffs(other: Mapping[str, Any]) -> list[str]:
        theirs = numeric_fields(other)
        return sorted((k for k in set(mine) | set(theirs) if mine.get(k, _ABSENT) != theirs.get(k, _ABSENT)), key=_rank)

    other = min(others, key=lambda v: (len(diffs(others[v])), v))
    fields = diffs(others[other])
    paths = {k for p in [provenance, *others.values()] for k in flatten(p)}
    theirs = numeric_fields(others[other])
    said = "; ".join(
        f"{selector_key(k, paths)} {_short(mine.get(k, _ABSENT))} (was {_short(theirs.get(k, _ABSENT))}): {why(k)}"
        for k in fields[:MAX_SHOWN]
    )
    more = f"; +{len(fields) - MAX_SHOWN} more" if len(fields) > MAX_SHOWN else ""
    name = Apart(every if every is not None else {**others, vid: provenance}).selector(vid, labels)
    return (
        f"new variant {vid} beside {other} ({describe(provenance)}): it differs in {said}{more}. Each of these "
        f"can change numbers, so the states are kept apart; name this one with #{name}"
    )


# Selector keys always accepted (they name fields a store may hold none of yet, e.g. no FP8 variant).
ALWAYS_KEYS = (*PRECISION_KEYS, LABEL_KEY, VARIANT_KEY)
_HEX = set("0123456789abcdef")


def parse_selector(selector: str) -> dict[str, str] | str:
    """``"backend=torch,dtype=bf16"`` -> dict; anything without ``=`` is one word: an id prefix or a label."""
    from hsstore.core.schema.store_records import LABEL_PATTERN

    selector = selector.strip()
    if "=" not in selector:
        if not LABEL_PATTERN.match(selector):  # (ids are hex: a label's pattern holds them too)
            raise SelectorError(
                f"selector {selector!r} is neither a variant id prefix, a label nor key=value pairs "
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


def matches(
    provenance: Mapping[str, Any], pairs: Mapping[str, str], label: str | None = None, vid: str | None = None
) -> bool:
    """True if every key (a dotted path, or its last segments; ``label``: the variant's label, ``variant``: a
    prefix of its id ``vid``) has the given value (a hash: or a prefix of it)."""
    flat = flatten(provenance)
    for key, want in pairs.items():
        if key == LABEL_KEY:
            if label != want:
                return False
            continue
        if key == VARIANT_KEY:
            if not (vid and want and set(want) <= _HEX and vid.startswith(want)):
                return False
            continue
        key = field_key(key)
        hits = [v for path, v in flat.items() if path == key or path.endswith("." + key)]
        if not hits or not any(value_matches(v, want) for v in hits):
            return False
    return True


def _choices(variants: Mapping[str, Mapping[str, Any]], among: list[str], labels: Mapping[str, str]) -> str:
    """Each of ``among`` with its description and the selector that names it alone in ``variants``."""
    apart = Apart(variants)
    out = []
    for vid in sorted(among):
        lab = f" labelled {labels[vid]!r}" if vid in labels else ""
        out.append(
            f"{choice(vid, variants[vid], dict(apart.fewest(vid) or []))}{lab} as #{apart.selector(vid, labels)}"
        )
    return "; ".join(out) or "(none)"


def _stored_as_computed(provenance: Mapping[str, Any]) -> bool:
    return "storage" not in provenance.get("environment", {})


def _check_keys(selector: str, pairs: Mapping[str, str], variants: Mapping[str, Mapping[str, Any]]) -> None:
    """SelectorError for a key that names no provenance field of any variant, with the valid keys."""
    import difflib

    paths = {k for p in variants.values() for k in flatten(p)}

    def known(key: str) -> bool:
        return key in ALWAYS_KEYS or any(p == key or p.endswith("." + key) for p in paths)

    for key in pairs:
        if not known(key):
            leaves = sorted(
                {
                    p.rsplit(".", 1)[-1]
                    for p in paths
                    if not is_informational(p) and not p.startswith("recipe.model.weights.")
                }
                | {"precision", LABEL_KEY, VARIANT_KEY}
            )
            close = difflib.get_close_matches(key, leaves + sorted(paths), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SelectorError(
                f"selector {selector!r}: unknown key {key!r}; {hint}valid keys: {', '.join(leaves)} "
                "(or any dotted provenance path, e.g. environment.batching.token_budget)"
            )


def _values_held(pairs: Mapping[str, str], variants: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str]) -> str:
    """`` (dtype here: bf16, fp32)`` for each key whose value no variant holds (a typo in a value)."""
    said = []
    for key, want in pairs.items():
        field = field_key(key)
        values = (
            list(labels.values())
            if key == LABEL_KEY
            else list(variants)
            if key == VARIANT_KEY
            else [
                v
                for p in variants.values()
                for path, v in flatten(p).items()
                if path == field or path.endswith("." + field)
            ]
        )
        held = sorted({as_text(v) for v in values})
        if not any(value_matches(v, want) for v in values):
            said.append(f"{key} here: {', '.join(held[:8]) or '(none)'}{' …' if len(held) > 8 else ''}")
    return f" ({'; '.join(said)})" if said else ""


def _word(word: str, variants: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str]) -> list[str]:
    """The variants one word names: the variant labelled so and every id it prefixes (a hex word may be both:
    then two variants, refused as ambiguous, never one of them by a rule the user cannot see)."""
    labelled = [vid for vid, lab in labels.items() if lab == word and vid in variants]
    prefixed = [vid for vid in variants if vid.startswith(word)] if set(word) <= _HEX else []
    return labelled + [vid for vid in prefixed if vid not in labelled]


def _hits(variants: Mapping[str, Mapping[str, Any]], selector: str, labels: Mapping[str, str]) -> list[str]:
    parsed = parse_selector(selector)
    if isinstance(parsed, str):
        return _word(parsed, variants, labels)
    _check_keys(selector, parsed, variants)
    hits = [vid for vid, p in variants.items() if matches(p, parsed, labels.get(vid), vid)]
    if not names_storage(parsed, variants):
        # a selector that names no storage precision means the states as computed, whatever the store holds
        # or comes to hold: #dtype=bf16 never names an FP8 variant, so a variant built later cannot silently
        # take its place (it is named alone, or the selector becomes ambiguous); FP8 ones by precision=
        hits = [vid for vid in hits if _stored_as_computed(variants[vid])]
    return hits


def names_storage(pairs: Mapping[str, str], variants: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether a selector's pairs may name a variant stored in another precision than computed: a precision
    key, a field under ``environment.storage``, or the variant's id or label (which name one variant as it is)."""

    def under_storage(key: str) -> bool:
        paths = {p for v in variants.values() for p in flatten(v) if p == key or p.endswith("." + key)}
        return bool(paths) and all(p.startswith("environment.storage.") for p in paths)

    return any(k in (*PRECISION_KEYS, LABEL_KEY, VARIANT_KEY) or under_storage(field_key(k)) for k in pairs)


def _why_none(variants: Mapping[str, Mapping[str, Any]], selector: str, labels: Mapping[str, str]) -> str:
    """Why a selector that names no variant names none: the labels held (a word), the values held of the keys
    no variant has as asked (pairs), or the variants stored in another precision that it would name."""
    parsed = parse_selector(selector)
    if isinstance(parsed, str):
        return f" (labels here: {', '.join(sorted(labels.values())) or '(none)'})"
    stored = [
        vid for vid, p in variants.items() if not _stored_as_computed(p) and matches(p, parsed, labels.get(vid), vid)
    ]
    if stored:  # FP8 ones match: a selector naming no precision means the states as computed
        precisions = sorted({variants[v]["environment"]["storage"].get("precision") for v in stored})
        return (
            f" among those stored as computed ({len(stored)} stored in {', '.join(map(str, precisions))} "
            f"match: name one with precision=, e.g. #{selector.strip()},precision={precisions[0]})"
        )
    return _values_held(parsed, variants, labels)


def select(
    variants: Mapping[str, Mapping[str, Any]],
    selector: str | None,
    where: str = "store",
    labels: Mapping[str, str] | None = None,
) -> str:
    """The one variant id in ``variants`` (id -> provenance) that ``selector`` names (``labels``: id ->
    label); never a guess: an ambiguous selector is refused with a selector for each candidate."""
    labels = dict(labels or {})
    if not variants:
        raise SelectorError(f"{where} holds no committed variant; build one with `hsstore build MANIFEST`")
    if selector is None or selector == "":
        if len(variants) == 1:
            return next(iter(variants))
        first = min(variants)
        raise SelectorError(
            f"{where} holds {len(variants)} variants; name one as {where}#SELECTOR, e.g. "
            f"#{Apart(variants).selector(first, labels)} for {first}. Choices: {_choices(variants, list(variants), labels)}"
        )
    hits = _hits(variants, selector, labels)
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise SelectorError(
            f"selector {selector!r} matches no variant in {where}{_why_none(variants, selector, labels)}. "
            f"Choices: {_choices(variants, list(variants), labels)}"
        )
    raise SelectorError(
        f"selector {selector!r} matches {len(hits)} variants in {where}{_differ(variants, hits, labels)}. "
        f"Choices: {_choices(variants, hits, labels)}"
    )


def _differ(variants: Mapping[str, Mapping[str, Any]], hits: list[str], labels: Mapping[str, str]) -> str:
    """``; they differ in token_budget, attention: name one, e.g. #…``: the keys of the candidates' naming
    selectors whose values are not the same for all of them (each key once), and the first one's selector."""
    apart = Apart(variants)
    path_of = {key: path for path, key in apart.keys.items()}
    keys = list(dict.fromkeys(k for vid in hits for k, _ in apart.fewest(vid) or []))
    differ = [k for k in keys if len({repr(apart.fields[v].get(path_of[k])) for v in hits}) > 1]
    example = f"name one, e.g. #{apart.selector(min(hits), labels)} for {min(hits)}"
    return f"; they differ in {', '.join(differ)}: {example}" if differ else f"; {example}"


__all__ = ["ALWAYS_KEYS", "describe", "matches", "parse_selector", "select"]
