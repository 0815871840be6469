"""Rows of another sample: a state slot holding a previous request's bytes (``stale_copy``; of the same sample
at other positions: a read from the wrong block) — or, when the
copied rows are this sample's own tokens shifted by k, token ids misaligned with the states
(``token_shift``: a BOS dropped or added before the states were paired with them; the rows equal another
sample's only because the two share those tokens).

Applied to findings the per-sample rules leave unexplained (``beyond_noise``, ``differs``) and to states of
a suffix whose leading rows are neither zero nor constant (a slot's stale bytes look like a prefix that
was not written)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hsstore.compare.defects import row_fields, span_words
from hsstore.compare.evidence import SHIFTS, LayerEvidence
from hsstore.core.schema.diff_report import Finding

Hit = tuple[int, str, int]  # (row, source key, source row)


def stale_copies(findings: list[Finding], evidence: dict[str, list[LayerEvidence]],
                 index: dict[tuple[int, int], list[tuple[str, int]]], tokens: dict[str, Sequence[int]]) -> list[Finding]:
    """Findings of unexplained divergence whose beyond-noise rows are byte-for-byte rows of another sample
    (``index``: (layer, row hash) -> [(key, row)] over the candidates), rewritten as ``stale_copy`` (or
    ``token_shift``). Only rows whose token differs from the source row's count: two rows of one token with
    the same recent context are the same computation (samples share a system prompt; layers with short
    memory repeat bytes wherever a phrase repeats), a state under another token is a copy."""

    def copied(key: str, r: int, src: str, sr: int) -> bool:
        a, b = tokens.get(key), tokens.get(src)
        return (src != key or sr != r) and a is not None and b is not None and int(a[r]) != int(b[sr])

    shared: dict[tuple[str, str], int] = {}

    def whose(key: str, src: str, sr: int) -> str:
        """The source row's sample — this one's own when the two share every token up to it (a shared prompt:
        the bytes are this sample's own row ``sr`` too)."""
        if (key, src) not in shared:
            shared[(key, src)] = common_prefix(tokens[key], tokens[src])
        return key if sr < shared[(key, src)] else src

    hits: dict[int, list[Hit]] = {}
    for n, f in enumerate(findings):
        ev = next((e for e in evidence.get(f.key, []) if e.label == f.layer), None)
        if ev is not None and _searched(f, ev):
            hits[n] = [(r, whose(f.key, src, sr), sr) for r, h in ev.bad_row_hashes.items()
                       for src, sr in index.get((f.layer, h), []) if copied(f.key, r, src, sr)]
    votes: dict[str, Counter] = {}
    for n, hs in hits.items():
        votes.setdefault(findings[n].key, Counter()).update(src for _, src, _ in hs)
    return [_named(f, hits[n], tokens, votes[f.key]) if hits.get(n) else f for n, f in enumerate(findings)]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = [i for i in range(n) if int(a[i]) != int(b[i])][:1]
    return differ[0] if differ else n


def _searched(f: Finding, ev: LayerEvidence) -> bool:
    """Whether the finding's rows may be another sample's: unexplained, or a "suffix" of non-blank rows."""
    if f.layer is None:
        return False
    if f.kind in ("beyond_noise", "differs"):  # (other_weights is named after the search)
        return True
    blank = set(ev.zero_rows) | set(ev.const_rows)
    return f.kind == "suffix_states" and not isinstance(f.match, int) and not blank and bool(ev.bad_rows)


def _named(f: Finding, hits: list[Hit], tokens: dict[str, Sequence[int]], votes: Counter) -> Finding:
    """The finding rewritten for the source that holds most of the sample's copied rows over all its layers
    (a layer with short memory repeats bytes in every sample ending alike; the layers that remember longer
    tell the one the rows came from; on a tie, the sample itself, then the first key)."""
    here = {src for _, src, _ in hits}
    source = min(here, key=lambda src: (-votes[src], src != f.key, src))  # on a tie: the sample itself
    mine = [(r, sr) for r, src, sr in hits if src == source]
    rows = sorted({r for r, _ in mine})
    k = _shifted_tokens(mine, tokens[f.key], tokens[source])
    if k is not None:
        way = f"row t holds the state of token t{'-' if k > 0 else '+'}{abs(k)}"
        return Finding(kind="token_shift", key=f.key, layer=f.layer, match=k, **row_fields(rows),
                       detail=f"layer {f.layer}: token ids and states are misaligned by {k:+d} ({way}): {span_words(rows)} "
                              f"are byte-for-byte the states of sample {source[:16]}, whose tokens are this sample's "
                              f"shifted by {k:+d} (a token dropped or added before the states were paired with them)")
    if source == f.key:
        held = sorted({sr for _, sr in mine})
        return Finding(kind="stale_copy", key=f.key, layer=f.layer, source=source, **row_fields(rows),
                       detail=f"layer {f.layer}: {span_words(rows)} are byte-for-byte this sample's own "
                              f"{span_words(held)} (a read from the wrong block of the same request, or rows "
                              "written in the wrong order)")
    ties = sum(1 for src, n in votes.items() if src != source and src in here and n == votes[source])
    also = f"; {ties} other sample(s) hold the same bytes there (they share those tokens)" if ties else ""
    if f.kind == "suffix_states":
        also += "; the rows after them are this sample's: a prefix not written (a prefix-cache hit) over old bytes"
    return Finding(kind="stale_copy", key=f.key, layer=f.layer, source=source, **row_fields(rows),
                   detail=f"layer {f.layer}: {span_words(rows)} are byte-for-byte rows of sample {source[:16]} "
                          f"(a state slot holding a previous request's bytes){also}")


def _shifted_tokens(hits: list[tuple[int, int]], mine: Sequence[int], theirs: Sequence[int]) -> int | None:
    """The shift k (row r holds the state of this sample's token r - k) under which every copied row whose
    token r - k exists (two or more) is the source's state of that same token: the copy is this sample's
    tokens misaligned with its states, not a slot's stale bytes."""
    for k in SHIFTS:
        seen = [(r, sr) for r, sr in hits if 0 <= r - k < len(mine)]
        if len(seen) >= 2 and all(int(mine[r - k]) == int(theirs[sr]) for r, sr in seen):
            return k
    return None
