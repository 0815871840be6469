"""Selectors: ``STORE#SELECTOR`` names one variant by an id prefix, its label, or ``key=value`` pairs
(a hash's value by a prefix of at least 8 characters); never a guess — an ambiguous selector is refused
with a selector for each candidate that names it alone, an unknown key with the valid ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hsstore.core.distinguish import (LABEL_KEY, PRECISION_KEYS, Apart, as_text, choice, describe, value_matches)
from hsstore.core.errors import SelectorError
from hsstore.core.provenance_match import flatten, is_informational

# Selector keys always accepted (they name fields a store may hold none of yet, e.g. no FP8 variant).
ALWAYS_KEYS = (*PRECISION_KEYS, LABEL_KEY)
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


def matches(provenance: Mapping[str, Any], pairs: Mapping[str, str], label: str | None = None) -> bool:
    """True if every key (a dotted path, or its last segments; ``label``: the variant's label) has the given
    value (a hash: or a prefix of it)."""
    flat = flatten(provenance)
    for key, want in pairs.items():
        if key == LABEL_KEY:
            if label != want:
                return False
            continue
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
        out.append(f"{choice(vid, variants[vid], dict(apart.fewest(vid) or []))}{lab} as #{apart.selector(vid, labels)}")
    return "; ".join(out) or "(none)"


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
                             if not is_informational(p) and not p.startswith("recipe.model.weights.")}
                            | {"precision", LABEL_KEY})
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
        values = list(labels.values()) if key == LABEL_KEY else [
            v for p in variants.values() for path, v in flatten(p).items() if path == key or path.endswith("." + key)]
        held = sorted({as_text(v) for v in values})
        if not any(value_matches(v, want) for v in values):
            said.append(f"{key} here: {', '.join(held[:8]) or '(none)'}{' …' if len(held) > 8 else ''}")
    return f" ({'; '.join(said)})" if said else ""


def _word(word: str, variants: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str]) -> list[str]:
    """The variants one word names: ids it prefixes (if it is hex), else the variant labelled so."""
    if set(word) <= _HEX:
        hits = [vid for vid in variants if vid.startswith(word)]
        if hits:
            return hits
    return [vid for vid, lab in labels.items() if lab == word and vid in variants]


def _hits(variants: Mapping[str, Mapping[str, Any]], selector: str, labels: Mapping[str, str]) -> list[str]:
    parsed = parse_selector(selector)
    if isinstance(parsed, str):
        return _word(parsed, variants, labels)
    _check_keys(selector, parsed, variants)
    hits = [vid for vid, p in variants.items() if matches(p, parsed, labels.get(vid))]
    if len(hits) > 1 and not any(k in PRECISION_KEYS or k.endswith("storage.precision") for k in parsed):
        # a selector that names no storage precision means the states as computed (#dtype=bf16 keeps
        # naming the bf16 variant when an FP8 one is derived from it); FP8 ones are named by precision=
        computed = [vid for vid in hits if _stored_as_computed(variants[vid])]
        hits = computed if len(computed) == 1 else hits
    return hits


def select(variants: Mapping[str, Mapping[str, Any]], selector: str | None, where: str = "store",
           labels: Mapping[str, str] | None = None) -> str:
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
        parsed = parse_selector(selector)
        held = f" (labels here: {', '.join(sorted(labels.values())) or '(none)'})" if isinstance(parsed, str) else \
            _values_held(parsed, variants, labels)
        raise SelectorError(f"selector {selector!r} matches no variant in {where}{held}. "
                            f"Choices: {_choices(variants, list(variants), labels)}")
    raise SelectorError(f"selector {selector!r} matches {len(hits)} variants in {where}{_differ(variants, hits, labels)}. "
                        f"Choices: {_choices(variants, hits, labels)}")


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
