"""Which samples an audit checks, and what they say of the variant: a seeded, length-stratified draw
(``--samples``/``--fraction``: each sample's chance about n/N, so k defective of n bound the defect rate),
every sample (the rate itself), or samples the user names by key (``--keys``: not a draw, no bound)."""

from __future__ import annotations

import math

from hsstore.compare.defects import upper_bound
from hsstore.compare.sampling import choose
from hsstore.core.errors import BadInput
from hsstore.storage.store import VariantReader

CONFIDENCE = 0.95
DEFAULT_SAMPLES = 8


def choose_keys(reader: VariantReader, samples: int | None, fraction: float | None, seed: int,
                named: list[str] | None = None) -> list[str]:
    """The samples named by key prefix (``--keys``), else a seeded, length-stratified choice of ``samples`` (or
    a ``fraction``; default 8; ``hsstore.compare.sampling``), in commit order."""
    keys = reader.keys
    if named is not None:
        if samples is not None or fraction is not None:
            raise BadInput("--keys names the samples: leave out --samples and --fraction")
        return named_keys(reader, named)
    N = len(keys)
    n = min(N, samples) if samples is not None else max(1, math.ceil(fraction * N)) if fraction else min(N, DEFAULT_SAMPLES)
    choice = choose([reader.refs[k].length for k in keys], keys, n, seed)
    return [keys[int(i)] for i in choice.indices]


def named_keys(reader: VariantReader, prefixes: list[str]) -> list[str]:
    """The stored keys the prefixes name (each exactly one), in commit order; BadInput for one that names
    none or several."""
    prefixes = [p.strip().lower() for p in prefixes if p.strip()]
    if not prefixes:
        raise BadInput("--keys is empty: name samples by their keys (or unique prefixes), comma-separated")
    out = set()
    for p in prefixes:
        hits = [k for k in reader.keys if k.startswith(p)]
        if not hits:
            raise BadInput(f"no sample of variant {reader.id} has a key starting with {p!r} (hsstore verify and "
                           "hsstore check --json name samples by key)")
        if len(hits) > 1:
            raise BadInput(f"key prefix {p!r} matches {len(hits)} samples of variant {reader.id} ({hits[0][:16]}, "
                           f"{hits[1][:16]}, ...): give more characters")
        out.add(hits[0])
    return [k for k in reader.keys if k in out]


def rate_bound(k: int, n: int, N: int, named: bool) -> tuple[float | None, str]:
    """What k defective of n checked samples (of N) say of the variant's defect rate: (upper bound or the rate
    itself, in words); None for samples named by the user (not a random draw: they bound nothing)."""
    if named:
        return None, (f"{k} defective of the {n} sample(s) named (--keys), not drawn at random: they bound no rate "
                      "(drop --keys for a seeded random choice that does)")
    if n >= N:
        return k / N, f"every one of the {N} samples checked: {k} defective, a defect rate of {k / N:.3g} exactly"
    if k == n:
        return 1.0, (f"all {n} samples chosen at random (seeded, length-stratified) from {N} are defective: the "
                     "defect rate may be anywhere up to 1")
    upper = upper_bound(k, n, CONFIDENCE)
    return upper, (f"{k} defective of {n} samples chosen at random (seeded, length-stratified) from {N}: the "
                   f"variant's defect rate is below {upper:.3g} at {CONFIDENCE:.0%} confidence"
                   + (" (about 3/n: check more samples to bound it lower)" if not k else ""))
