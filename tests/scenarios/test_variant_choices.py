"""Variants a person can tell apart: selectors, `info` and builds name the fields that differ between
variants sharing a backend/dtype/device line; ambiguous selectors are still refused, unknown keys named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import run_cli, write_manifest

from hsstore import HiddenStateDataset, SelectorError
from hsstore.core.selectors import distinguishing, fork_note, select
from hsstore.storage.store import Store
from hsstore.testing.factories import LAYERS, provenance, write_unit


def _with_budget(budget: int, dtype: str = "bf16", max_length: int = 256) -> dict:
    p = provenance(dtype)
    p["environment"]["batching"] = {
        "padding_side": "right",
        "token_budget": budget,
        "attention_mask": True,
        "order": "length-descending",
    }
    p["recipe"]["max_length"] = max_length
    return p


def test_variants_are_told_apart_by_the_fewest_fields_that_name_each_alone():
    variants = {
        "aaa": _with_budget(4096),
        "bbb": _with_budget(2048),
        "ccc": _with_budget(2048, max_length=512),
        "ddd": _with_budget(4096, dtype="fp32"),
    }
    apart = distinguishing(variants)
    assert apart["aaa"] == {"dtype": "bf16", "token_budget": "4096"}  # token_budget alone also names ddd
    assert apart["ccc"] == {"max_length": "512"}
    assert apart["ddd"] == {"dtype": "fp32"}
    for vid in variants:  # the shown fields, as written, are a selector naming that variant
        assert select(variants, ",".join(f"{k}={v}" for k, v in apart[vid].items())) == vid


def test_an_ambiguous_selector_is_refused_with_what_tells_the_candidates_apart():
    variants = {"aaa": _with_budget(4096), "bbb": _with_budget(2048), "ddd": _with_budget(4096, dtype="fp32")}
    with pytest.raises(SelectorError) as e:
        select(variants, "dtype=bf16")
    msg = str(e.value)
    assert "matches 2 variants" in msg and "they differ in token_budget" in msg
    assert "aaa (backend=torch dtype=bf16 device=cpu attention=sdpa token_budget=4096)" in msg
    assert "bbb (backend=torch dtype=bf16 device=cpu attention=sdpa token_budget=2048)" in msg
    suggested = msg.split("e.g. #", 1)[1].split(" ", 1)[0]
    assert select(variants, suggested) in ("aaa", "bbb")  # the suggestion names one variant
    assert select(variants, "dtype=bf16,token_budget=2048") == "bbb"


@pytest.mark.parametrize("ids", [("aaa", "bbb", "ddd"), ("ddd", "aaa", "bbb"), ("bbb", "ddd", "aaa")])
def test_a_store_of_several_variants_without_a_selector_suggests_one_that_names_a_single_variant(ids):
    """The example in "name one as STORE#SELECTOR, e.g. …" is copied by people: it must pick one variant,
    whichever comes first (two bf16 variants apart by token_budget, one fp32)."""
    variants = dict(zip(ids, [_with_budget(4096), _with_budget(2048), _with_budget(4096, dtype="fp32")]))
    with pytest.raises(SelectorError) as e:
        select(variants, None, where="s.zarr")
    msg = str(e.value)
    assert "holds 3 variants; name one as s.zarr#SELECTOR" in msg
    suggested = msg.split("e.g. #", 1)[1].split(" ", 1)[0]
    assert select(variants, suggested) == min(variants)


def test_a_selector_key_that_names_no_field_is_an_unknown_key_with_the_valid_ones():
    variants = {"aaa": _with_budget(4096), "bbb": _with_budget(2048, dtype="fp32")}
    with pytest.raises(SelectorError) as e:
        select(variants, "dtyp=bf16")
    msg = str(e.value)
    assert "unknown key 'dtyp'" in msg and "did you mean 'dtype'" in msg
    assert "valid keys:" in msg and all(k in msg for k in ("backend", "dtype", "device", "token_budget", "precision"))
    with pytest.raises(SelectorError, match="matches no variant"):  # a known key, a value no variant has
        select(variants, "precision=fp8-e4m3")
    with pytest.raises(SelectorError) as e:  # a typo in a value: the values the store holds for that key
        select(variants, "dtype=bf61,backend=torch")
    assert "matches no variant in store (dtype here: bf16, fp32)." in str(e.value)


def test_info_json_names_what_tells_each_variant_apart_as_info_and_selector_errors_do(tmp_path: Path):
    path = tmp_path / "s.zarr"
    store = Store.create(path)
    vids = {}
    for name, prov in (
        ("4096", _with_budget(4096)),
        ("2048", _with_budget(2048)),
        ("fp32", _with_budget(4096, "fp32")),
    ):
        vids[name] = store.create_variant(prov, LAYERS, 16, prov["environment"]["dtype"], "zstd", 64)
        write_unit(store, vids[name], [5, 7])
    info = run_cli("info", str(path), "--json")
    assert info.returncode == 0, info.stderr
    by = {v["id"]: v["distinguished_by"] for v in json.loads(info.stdout)["variants"]}
    assert by == {
        vids["4096"]: {"dtype": "bf16", "token_budget": "4096"},
        vids["2048"]: {"token_budget": "2048"},
        vids["fp32"]: {"dtype": "fp32"},
    }  # the fewest fields naming each alone
    heads = {
        line.split(":")[0].split()[1]: line
        for line in run_cli("info", str(path)).stdout.splitlines()
        if line.startswith("variant ")
    }
    with pytest.raises(SelectorError) as e:
        HiddenStateDataset(str(path), variant="dtype=bf16")
    for vid, fields in by.items():  # the text header and the selector error show the same fields, each once
        shown = " ".join(f"{k}={v}" for k, v in fields.items() if k != "dtype")
        assert heads[vid].endswith(shown) and heads[vid].count("dtype=") == 1
        if vid != vids["fp32"]:
            assert f"{vid} (backend=torch dtype=bf16 device=cpu attention=sdpa {shown})" in str(e.value)


def test_a_new_variant_beside_one_of_the_same_line_says_which_settings_made_it_new():
    old, new = _with_budget(4096), _with_budget(2048)
    note = fork_note("bbb", new, {"aaa": old})
    assert note is not None and note.startswith("new variant bbb beside aaa (backend=torch dtype=bf16")
    assert "token_budget 2048 (was 4096): batch shapes" in note and "#token_budget=2048" in note
    assert "max_length" not in note  # equal on both sides
    assert fork_note("bbb", new, {"aaa": old, "bbb": new}) is None  # resuming it: not new
    beside = fork_note("ccc", _with_budget(2048, dtype="fp32"), {"aaa": old})  # another line: still a new variant
    assert beside is not None and beside.endswith("name this one with #dtype=fp32")
    assert fork_note("aaa", old, {}) is None  # the first variant of a store is beside nothing


def test_a_build_forking_a_variant_by_its_token_budget_is_named_everywhere(tiny_store: Path, tmp_path: Path):
    """One real build beside the session store's bf16 variant, differing only in token_budget (and in
    the codec and unit size, which are not provenance and so fork nothing)."""
    shutil.copytree(tiny_store.parent, tmp_path / "tiny")
    store = tmp_path / "tiny" / "store.zarr"
    m = write_manifest(tmp_path / "tiny" / "b.toml", dtypes='["bf16"]', layers="{ aux = [0, 1], target = [3] }")
    m.write_text(
        m.read_text()
        .replace("token_budget = 2048", "token_budget = 1024")
        .replace("unit_tokens = 2048", "unit_tokens = 512")
    )
    r = run_cli("build", str(m), "--limit", "6", "--quiet", "--codec", "zstd")
    assert r.returncode == 0, r.stderr
    note = [line for line in r.stderr.splitlines() if line.startswith("new variant ")]
    assert len(note) == 1 and "it differs in token_budget 1024 (was 2048): batch shapes" in note[0], r.stderr
    assert "codec" not in note[0] and "unit_tokens" not in note[0]

    info = run_cli("info", str(store))
    heads = [line for line in info.stdout.splitlines() if line.startswith("variant ") and "dtype=bf16" in line]
    assert len(heads) == 2 and sorted(h.rsplit(" ", 1)[1] for h in heads) == ["token_budget=1024", "token_budget=2048"]
    for line in info.stdout.splitlines():  # each selector info prints names its variant
        if line.startswith("  select as "):
            assert Store.open(store).select(line.split("#", 1)[1]) in Store.open(store).variant_ids()

    cli = run_cli("diff", f"{store}#dtype=bf16", f"{store}#dtype=fp32")
    assert cli.returncode == 2 and "they differ in token_budget" in cli.stderr
    with pytest.raises(SelectorError) as e:
        HiddenStateDataset(str(store), variant="dtype=bf16")
    assert cli.stderr.strip() == f"error: {e.value}"  # Python says what the CLI says
    assert len(HiddenStateDataset(str(store), variant="dtype=bf16,token_budget=1024")) == 6

    unknown = run_cli("diff", f"{store}#dtyp=bf16", f"{store}#dtype=fp32")
    with pytest.raises(SelectorError) as e:
        HiddenStateDataset(str(store), variant="dtyp=bf16")
    assert unknown.returncode == 2 and unknown.stderr.strip() == f"error: {e.value}"
    assert "unknown key 'dtyp'" in str(e.value)
    apart = [
        v["distinguished_by"]
        for v in json.loads(run_cli("info", str(store), "--json").stdout)["variants"]
        if v["dtype"] == "bf16"
    ]
    assert sorted(apart, key=str) == [{"dtype": "bf16", "token_budget": "2048"}, {"token_budget": "1024"}]


@pytest.mark.parametrize("command", ["info", "verify", "gc"])
def test_a_store_command_given_a_variant_refuses_it_instead_of_dropping_it(tiny_store: Path, command: str):
    """info, verify and gc read a whole store: a ``#selector`` after it (a typo in it, too) is refused in one
    line naming the store to pass, not silently ignored."""
    r = run_cli(command, f"{tiny_store}#dtype=bf61")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (
        f"error: hsstore {command} reads a whole store, not one variant: pass {str(tiny_store)!r} "
        "without '#dtype=bf61'\n"
    )


def _fp8_of(source: str, **kw: str) -> dict:
    p = provenance(precision="fp8-e4m3", **kw)
    p["environment"]["storage"]["source"] = {"variant": source, "store": "s.zarr"}
    return p


def test_a_selector_naming_no_precision_never_names_an_fp8_variant_so_a_growing_store_cannot_repoint_it():
    """#dtype=bf16 means the states as computed: in a store of one FP8 copy it names nothing (and says how to
    name the copy), so a variant of another model built there later cannot silently become what it names."""
    fp8 = _fp8_of("e522cf1e7b27a1b2")
    only_fp8 = {"21a03a664467": fp8}
    with pytest.raises(SelectorError) as e:
        select(only_fp8, "dtype=bf16")
    assert "matches no variant in store among those stored as computed" in str(e.value)
    assert "e.g. #dtype=bf16,precision=fp8-e4m3" in str(e.value)  # the way to name the copy
    assert select(only_fp8, "dtype=bf16,precision=fp8-e4m3") == "21a03a664467"
    grown = {**only_fp8, "ae53725e2008": provenance(model="llama")}
    assert select(grown, "dtype=bf16") == "ae53725e2008"  # as computed: the one there is
    assert select(grown, "precision=fp8-e4m3") == "21a03a664467"
    two_fp8 = {**grown, "77aa00000000": _fp8_of("ae53725e2008", model="llama")}
    with pytest.raises(SelectorError, match="matches 2 variants"):
        select(two_fp8, "precision=fp8-e4m3")
    for vid, pairs in distinguishing(two_fp8).items():  # each naming selector names its variant under this rule
        assert select(two_fp8, ",".join(f"{k}={v}" for k, v in pairs.items())) == vid, (vid, pairs)
    assert distinguishing(grown) == {"21a03a664467": {"precision": "fp8-e4m3"}, "ae53725e2008": {"dtype": "bf16"}}


def test_variant_and_storage_keys_mean_the_variant_id_and_its_storage_precision():
    """``variant=`` is the variant's own id (a prefix), never a field of another variant's provenance that ends in
    ``variant`` (an FP8 copy's source); ``storage=`` is the storage precision, as ``precision=``."""
    variants = {
        "e522cf1e7b27": provenance(),
        "49c1d70f4462": provenance("fp32"),
        "21a03a664467": _fp8_of("e522cf1e7b27"),
    }
    assert select(variants, "variant=e522") == "e522cf1e7b27"
    assert select(variants, "variant=49c1d70f4462") == "49c1d70f4462"
    assert select(variants, "variant=21a0") == "21a03a664467"
    with pytest.raises(SelectorError, match="matches no variant"):
        select(variants, "variant=ffff")
    with pytest.raises(SelectorError, match="matches 2 variants"):
        select({**variants, "e5aa00000000": provenance("fp16")}, "variant=e5")
    assert select(variants, "storage=fp8-e4m3") == "21a03a664467"
    assert select(variants, "storage.precision=fp8-e4m3") == "21a03a664467"
    assert select(variants, "source.variant=e522cf1e7b27") == "21a03a664467"  # the copy's source, spelled as a path
