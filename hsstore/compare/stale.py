"""Rows of another sample: a state slot holding a previous request's bytes (``stale_copy``; of the same sample
at other positions: a read from the wrong block) — or, when the copied rows are the source's states of this
sample's own tokens shifted by k positions and/or offset by d in value, token ids that do not belong to right
states (``token_shift``: a BOS dropped or added before the states were paired with them; ids written +1, a
vocabulary offset; the rows equal another sample's only because the two share the true tokens, e.g. a prompt).

Searched among the chosen samples and their NEIGHBOURS in commit order (``row_index``: where a stale slot's
bytes come from, the previous requests), and applied to findings the per-sample rules of the defect classifier
(``hsstore.compare.defects``) leave unexplained (``beyond_noise``, ``differs``) and to states of a suffix whose
leading rows are neither zero nor constant (a slot's stale bytes look like a prefix that was not written)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from hsstore.compare.defects import SHIFTS, LayerEvidence, health_rows, row_fields, row_hash, span_words
from hsstore.core.schema.reports import Finding
from hsstore.storage.reader import VariantReader

NEIGHBOURS = 4  # samples on each side (in commit order) searched for a stale slot's source rows


def row_index(
    reader: VariantReader, keys: list[str], labels: list[int]
) -> tuple[dict[tuple[int, int], list[tuple[str, int]]], dict[str, Any]]:
    """(layer, row hash) -> [(key, row)] over the chosen samples and their NEIGHBOURS in commit order (where a
    stale slot's bytes come from: the previous requests), zero and constant rows left out; and each
    candidate's token ids."""
    order = {k: i for i, k in enumerate(reader.keys)}
    cand = sorted(
        {
            reader.keys[j]
            for k in keys
            for j in range(max(0, order[k] - NEIGHBOURS), min(len(reader.keys), order[k] + NEIGHBOURS + 1))
        }
    )
    index: dict[tuple[int, int], list[tuple[str, int]]] = {}
    tokens = {k: reader.read_tokens(reader.refs[k])[0] for k in cand}
    for k in cand:
        for label, s in zip(labels, reader.read_layers(reader.refs[k], labels)):
            trivial = set(sum(health_rows(s)[2:], []))
            for r in range(s.shape[0]):
                if r not in trivial:
                    index.setdefault((label, row_hash(s[r])), []).append((k, r))
    return index, tokens


Hit = tuple[int, str, int]  # (row, source key, source row)
OFFSET_ROWS = 3  # copied rows that must agree on one id offset to call the ids offset


def stale_copies(
    findings: list[Finding],
    evidence: dict[str, list[LayerEvidence]],
    index: dict[tuple[int, int], list[tuple[str, int]]],
    tokens: dict[str, Sequence[int]],
    vocab: int | None = None,
) -> list[Finding]:
    """Findings of unexplained divergence whose beyond-noise rows are byte-for-byte rows of another sample
    (``index``: (layer, row hash) -> [(key, row)] over the candidates), rewritten as ``stale_copy`` (or
    ``token_shift``). Only rows whose token differs from the source row's count: two rows of one token with
    the same recent context are the same computation (samples share a system prompt; layers with short
    memory repeat bytes wherever a phrase repeats), a state under another token is a copy. ``vocab`` (the
    model's vocabulary size) lets an id offset wrap around, as ids written +1 past the last id do."""

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
        if ev is not None and f.layer is not None and _searched(f, ev):  # (_searched: False without a layer)
            hits[n] = [
                (r, whose(f.key, src, sr), sr)
                for r, h in ev.bad_row_hashes.items()
                for src, sr in index.get((f.layer, h), [])
                if copied(f.key, r, src, sr)
            ]
    votes: dict[str, Counter[str]] = {}
    for n, hs in hits.items():
        votes.setdefault(findings[n].key, Counter()).update(src for _, src, _ in hs)
    return [_named(f, hits[n], tokens, votes[f.key], vocab) if hits.get(n) else f for n, f in enumerate(findings)]


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


def _named(
    f: Finding, hits: list[Hit], tokens: dict[str, Sequence[int]], votes: Counter[str], vocab: int | None = None
) -> Finding:
    """The finding rewritten for the source that holds most of the sample's copied rows over all its layers
    (a layer with short memory repeats bytes in every sample ending alike; the layers that remember longer
    tell the one the rows came from; on a tie, the sample itself, then the first key)."""
    here = {src for _, src, _ in hits}
    source = min(here, key=lambda src: (-votes[src], src != f.key, src))  # on a tie: the sample itself
    mine = [(r, sr) for r, src, sr in hits if src == source]
    rows = sorted({r for r, _ in mine})
    misread = _misread_ids(mine, tokens[f.key], tokens[source], vocab)
    if misread is not None:
        return _token_ids(f, rows, source, *misread)
    if source == f.key:
        held = sorted({sr for _, sr in mine})
        return Finding(
            kind="stale_copy",
            key=f.key,
            layer=f.layer,
            source=source,
            **row_fields(rows),
            detail=f"layer {f.layer}: {span_words(rows)} are byte-for-byte this sample's own "
            f"{span_words(held)} (a read from the wrong block of the same request, or rows "
            "written in the wrong order)",
        )
    ties = sum(1 for src, n in votes.items() if src != source and src in here and n == votes[source])
    also = f"; {ties} other sample(s) hold the same bytes there (they share those tokens)" if ties else ""
    if f.kind == "suffix_states":
        also += "; the rows after them are this sample's: a prefix not written (a prefix-cache hit) over old bytes"
    return Finding(
        kind="stale_copy",
        key=f.key,
        layer=f.layer,
        source=source,
        **row_fields(rows),
        detail=f"layer {f.layer}: {span_words(rows)} are byte-for-byte rows of sample {source[:16]} "
        f"(a state slot holding a previous request's bytes){also}",
    )


def _token_ids(f: Finding, rows: list[int], source: str, k: int, d: int) -> Finding:
    """``token_shift``: right states (another sample's states of the true tokens) under ids shifted by ``k``
    positions and/or offset by ``d`` in value."""
    what = []
    if k:
        what.append(f"misaligned by {k:+d} (row t holds the state of token t{'-' if k > 0 else '+'}{abs(k)})")
    if d:
        what.append(f"offset by {d:+d} in value (each id is the true id {d:+d})")
    cause = (
        "a token dropped or added before the states were paired with them"
        if not d
        else "the states are right for the true tokens, the recorded ids are not"
    )
    return Finding(
        kind="token_shift",
        key=f.key,
        layer=f.layer,
        match=k,
        **row_fields(rows),
        detail=f"layer {f.layer}: token ids and states are {' and '.join(what)}: {span_words(rows)} are "
        f"byte-for-byte the states of sample {source[:16]} at tokens that are this sample's ids "
        f"{'shifted by ' + format(k, '+d') if k else ''}{' and ' if k and d else ''}"
        f"{'offset by ' + format(-d, '+d') if d else ''} ({cause}), not a stale slot",
    )


def _misread_ids(
    hits: list[tuple[int, int]], mine: Sequence[int], theirs: Sequence[int], vocab: int | None
) -> tuple[int, int] | None:
    """(k, d) when every copied row whose token r - k exists (two or more) is the source's state of the token
    this sample records at r - k, less d (mod ``vocab``): row r holds the state of the true token behind
    recorded id r - k, and the ids are the true ones + d. The copy is this sample's tokens misread against
    right states (shifted: a BOS dropped or added; offset: ids written +1), not a slot's stale bytes. A pure
    shift is tried first; a shift and an offset are each one consistent rule over every copied row, an offset
    over OFFSET_ROWS or more (two rows of unrelated text agree on some difference once in ~vocab/7 tries)."""
    found = []
    for k in (0,) + SHIFTS:
        seen = [(r, sr) for r, sr in hits if 0 <= r - k < len(mine)]
        diffs = {_signed(int(mine[r - k]) - int(theirs[sr]), vocab) for r, sr in seen}
        if len(diffs) == 1 and (k, d := diffs.pop()) != (0, 0) and len(seen) >= (OFFSET_ROWS if d else 2):
            found.append((d != 0, k != 0 and d != 0, k, d))  # a shift alone, then an offset alone, then both
    return min(found, key=lambda x: x[:2])[2:] if found else None


def _signed(d: int, vocab: int | None) -> int:
    """An id difference, wrapped into (-vocab/2, vocab/2] when the vocabulary size is known."""
    if not vocab:
        return d
    d %= vocab
    return d - vocab if d > vocab // 2 else d
