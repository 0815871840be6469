"""layout: every key a builder makes parses back to its kind and names; nothing else does."""

from __future__ import annotations

import pytest

from hsstore.storage import layout
from hsstore.storage.layout import Key, parse_key


def test_every_builder_parses_back():
    v, u = "0123456789ab", "r0-5f3a-000007"
    assert parse_key(layout.root_meta()) == Key("root-meta")
    assert parse_key(layout.variants_meta()) == Key("variants-meta")
    assert parse_key(layout.variant_meta(v)) == Key("variant-meta", v)
    assert parse_key(layout.units_meta(v)) == Key("units-meta", v)
    assert parse_key(layout.commit_key(v, u)) == Key("commit", v, u)
    assert parse_key(layout.build_key(v, "abc")) == Key("build", v)
    assert parse_key(layout.lineage_record_key("b1", 3, "end")).kind == "lineage"
    assert parse_key(layout.lineage_rows_key("b1")).kind == "lineage-rows"
    for rel in layout.unit_files([0, 7, 31]):
        assert parse_key(layout.unit_key(v, u, rel)) == Key("unit-file", v, u, rel)
    assert layout.unit_files([2]) == {
        "zarr.json",
        "input_ids/zarr.json",
        "input_ids/c/0",
        "loss_mask/zarr.json",
        "loss_mask/c/0",
        "layer_2/zarr.json",
        "layer_2/c/0/0",
    }


@pytest.mark.parametrize(
    "key",
    [
        "zarr.json.bak",
        "variants/.DS_Store",
        "variants/v/evil.py",
        "variants/v/units/u/layer_1/c/0",
        "variants/v/units/u/input_ids/c/0/0",
        "variants/v/units/u/layer_01/zarr.json",
        "variants/../zarr.json",
        "variants/v/commits/../x.json",
        "variants/v/commits/.hidden.json",
        "builds/b/r0-middle.json",
        "builds/x.json",
        "variants/v/units/u/notes.txt",
        "variants/v/units/u/layer_1/c/0/0/0",
    ],
)
def test_keys_hsstore_never_writes_are_unknown(key: str):
    assert parse_key(key).kind == "unknown"


def test_temporary_files_and_directories():
    assert parse_key("variants/v/commits/.tmp-0a1b").kind == "temp"
    for d in ("variants", "variants/v", "variants/v/units/u/layer_4/c/0", "variants/v/builds", "builds", "builds/b"):
        assert layout.is_dir_key(d), d
    for d in ("junk", "variants/v/units/u/input_ids/c/0", "variants/v/evil", "builds/b/x"):
        assert not layout.is_dir_key(d), d


@pytest.mark.parametrize("name", ["..", ".", "a/b", "", ".hidden", "x" * 129, "a b"])
def test_unsafe_names_are_refused(name: str):
    with pytest.raises(ValueError, match="not a safe name"):
        layout.unit_prefix("v", name)
