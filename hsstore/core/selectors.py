"""Selectors: ``STORE#SELECTOR`` names one variant by an id prefix or ``key=value`` pairs; never a guess —
an ambiguous selector is refused with the fields that tell its candidates apart, an unknown key with the
valid ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hsstore.core.distinguish import MAX_SHOWN, as_text, distinguishing, label
from hsstore.core.errors import SelectorError
from hsstore.core.provenance_match import flatten, is_informational

# Selector keys always accepted (they name fields a store may hold none of yet, e.g. no FP8 variant).
ALWAYS_KEYS = ("precision", "storage", "storage.precision")


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


def matches(provenance: Mapping[str, Any], pairs: Mapping[str, str]) -> bool:
    """True if every key (a dotted path, or its last segments) has the given value."""
    flat = flatten(provenance)
    for key, want in pairs.items():
        hits = [v for path, v in flat.items() if path == key or path.endswith("." + key)]
        if not hits or not any(as_text(v) == want for v in hits):
            return False
    return True


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


def _values_held(pairs: Mapping[str, str], variants: Mapping[str, Mapping[str, Any]]) -> str:
    """`` (dtype here: bf16, fp32)`` for each key whose value no variant holds (a typo in a value)."""
    said = []
    for key, want in pairs.items():
        held = sorted({as_text(v) for p in variants.values() for path, v in flatten(p).items()
                       if path == key or path.endswith("." + key)})
        if want not in held:
            said.append(f"{key} here: {', '.join(held[:8]) or '(none)'}{' …' if len(held) > 8 else ''}")
    return f" ({'; '.join(said)})" if said else ""


def _example(variants: Mapping[str, Mapping[str, Any]]) -> str:
    """A selector naming the first variant alone: its backend and dtype, then the fields that tell it apart
    one by one until it does; else its id prefix."""
    vid = min(variants)
    env = variants[vid].get("environment", {})
    pairs = [(k, as_text(env[k])) for k in ("backend", "dtype") if env.get(k) is not None]
    pairs += [(k, v) for k, v in distinguishing(variants, by_line=False)[vid].items()
              if k not in ("backend", "dtype") and v != "(absent)" and not v.endswith("…")]
    for n in range(1, len(pairs) + 1):
        text = ",".join(f"{k}={v}" for k, v in pairs[:n])
        try:
            if select(variants, text) == vid:
                return f"#{text}"
        except SelectorError:
            continue
    return f"#{vid[:8]}"


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
            f"e.g. {_example(variants)} or an id prefix. Choices: {_choices(variants)}"
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
        held = "" if isinstance(parsed, str) else _values_held(parsed, variants)
        raise SelectorError(f"selector {selector!r} matches no variant in {where}{held}. Choices: {_choices(variants)}")
    among = {vid: variants[vid] for vid in sorted(hits)}
    apart = distinguishing(among, by_line=False)
    keys = list(next(iter(apart.values())))
    usable = [(k, f[k]) for f in apart.values() for k in keys if f[k] != "(absent)" and not f[k].endswith("…")]
    hint = f"; they differ in {', '.join(keys[:MAX_SHOWN])}{' …' if len(keys) > MAX_SHOWN else ''}" if keys else ""
    hint += f": add one to the selector, e.g. #{selector},{usable[0][0]}={usable[0][1]}" if usable else ""
    raise SelectorError(f"selector {selector!r} matches {len(hits)} variants in {where}{hint}. "
                        f"Choices: {'; '.join(label(v, p, apart[v]) for v, p in among.items())}")
