from __future__ import annotations

import numpy as np
import pytest
import xxhash
from helpers import provenance

from hsstore.core.errors import ProvenanceMismatch, SelectorError
from hsstore.core.keys import canonical_json, fingerprint, sample_key
from hsstore.core.provenance_match import differences, require_match, variant_id
from hsstore.core.selectors import parse_selector, select


def test_sample_key_is_xxh3_128_of_the_documented_bytes():
    ids = np.array([1, 2, 300], dtype=np.int64)
    mask = np.array([0, 1, 1], dtype=bool)
    expected = xxhash.xxh3_128_hexdigest(b"fp" + np.array([1, 2, 300], "<i4").tobytes() + bytes([0, 1, 1]))
    assert sample_key("fp", ids, mask) == expected


def test_sample_key_changes_with_tokens_mask_and_tokenizer():
    ids, mask = np.arange(5), np.ones(5)
    base = sample_key("a", ids, mask)
    assert sample_key("b", ids, mask) != base
    assert sample_key("a", ids[::-1], mask) != base
    assert sample_key("a", ids, np.array([1, 1, 1, 1, 0])) != base


def test_canonical_json_is_order_and_float_stable():
    assert canonical_json({"b": 1.0, "a": [1, 2.5]}) == canonical_json({"a": (1, 2.5), "b": 1})
    assert fingerprint({"x": 1}) != fingerprint({"x": 2})
    with pytest.raises(ValueError, match="canonical JSON refuses non-finite float nan"):
        canonical_json({"x": float("nan")})


def test_variant_id_ignores_informational_fields_only():
    p = provenance()
    q = provenance()
    q["environment"]["host"] = "another-host"
    q["recipe"]["model"]["path"] = "/elsewhere"
    assert variant_id(p) == variant_id(q)
    q["environment"]["dtype"] = "fp32"
    assert variant_id(p) != variant_id(q)


def test_mismatch_lists_every_field_with_both_values():
    store, required = provenance("fp32", "torch"), provenance("bf16", "fla")
    with pytest.raises(ProvenanceMismatch) as e:
        require_match(store, required)
    msg = str(e.value)
    assert "environment.dtype: 'fp32' (store) != 'bf16' (required)" in msg
    assert "environment.kernels.chunk_gated_delta_rule: 'torch' (store) != 'fla' (required)" in msg
    assert {f for f, _, _ in e.value.differences} >= {"environment.dtype", "environment.backend"}
    assert differences(store, required, allow_drift=["dtype", "backend", "kernels"]) == []
    require_match(store, store)


def test_selectors():
    variants = {"aaa111": provenance("bf16"), "bbb222": provenance("fp32"), "abc333": provenance("fp32", "fla")}
    assert select(variants, "dtype=bf16") == "aaa111"
    assert select(variants, "backend=fla,dtype=fp32") == "abc333"
    assert select(variants, "bb") == "bbb222"
    with pytest.raises(SelectorError, match="matches 2 variants"):
        select(variants, "dtype=fp32")
    with pytest.raises(SelectorError, match="matches no variant"):
        select(variants, "dtype=fp16")
    with pytest.raises(SelectorError, match="holds 3 variants"):
        select(variants, None)
    assert select({"aaa111": provenance()}, None) == "aaa111"
    with pytest.raises(SelectorError, match="'../etc' is neither a variant id prefix"):
        parse_selector("../etc")
