"""The manifest is read strictly: wrong types are one line naming key, value and expected type; nothing is
coerced (``"false"`` is not False); values are range-checked; defaults live in one schema."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_cli, write_manifest

from hsstore.capture.inputs.manifest_file import load_manifest
from hsstore.core.errors import BadInput
from hsstore.core.schema.manifest import BuildTable, DataTable, ModelTable, StoreTable

WRONG_TYPES = [
    # (table snippet, key, value shown, expected type words)
    ("model", 'trust_remote_code = "false"', "[model] trust_remote_code = 'false'", "a boolean (true/false)"),
    ("build", 'allow_unhealthy = "no"', "[build] allow_unhealthy = 'no'", "a boolean (true/false)"),
    ("data", 'max_length = "abc"', "[data] max_length = 'abc'", "an integer"),
    ("data", "max_length = 511.9", "[data] max_length = 511.9", "an integer"),
    ("build", "token_budget = true", "[build] token_budget = True", "an integer"),
    ("build", 'dtypes = "bf16"', "[build] dtypes = 'bf16'", "a list"),
    ("model", "seed = 1.5", "[model] seed = 1.5", "an integer"),
]


def _manifest(tmp_path: Path, table: str, line: str) -> Path:
    """The test manifest with ``line`` in ``[table]``, replacing that key's line if it has one."""
    path = write_manifest(tmp_path / "m.toml")
    key = line.split("=")[0].strip()
    lines = [ln for ln in path.read_text().splitlines() if ln.split("=")[0].strip() != key]
    lines.insert(lines.index(f"[{table}]") + 1, line)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("table,line,shown,expected", WRONG_TYPES, ids=[w[1] for w in WRONG_TYPES])
def test_wrong_types_are_named_never_coerced(tmp_path: Path, table: str, line: str, shown: str, expected: str) -> None:
    with pytest.raises(BadInput) as e:
        load_manifest(_manifest(tmp_path, table, line))
    msg = str(e.value)
    assert shown in msg and f"expected {expected}" in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "line,words",
    [
        ("unit_tokens = 0", "unit_tokens = 0; it must be 1 or more"),
        ("gpus_per_rank = -1", "gpus_per_rank = -1; it must be 1 or more"),
    ],
)
def test_out_of_range_values_are_refused(tmp_path: Path, line: str, words: str) -> None:
    with pytest.raises(BadInput, match=words):
        load_manifest(_manifest(tmp_path, "build", line))


def test_quoted_false_never_enables_remote_code_through_the_cli(tmp_path: Path) -> None:
    r = run_cli("build", str(_manifest(tmp_path, "model", 'trust_remote_code = "false"')), "--quiet")
    assert r.returncode == 2, r.stderr
    assert "trust_remote_code = 'false'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "store.zarr").exists()


def test_defaults_come_from_the_schema_tables(tmp_path: Path) -> None:
    m = load_manifest(write_manifest(tmp_path / "m.toml"))  # sets backends/dtypes/devices/token_budget itself
    assert m.seed == ModelTable.__struct_defaults__[ModelTable.__struct_fields__.index("seed") - 2]
    assert m.too_long == DataTable(files=[]).too_long
    assert m.allow_unhealthy == BuildTable().allow_unhealthy is False
    assert m.codec == StoreTable().codec


@pytest.mark.parametrize(
    "override,words",
    [
        ("{ hidden_size = -64 }", "hidden_size = -64"),
        ("{ num_hidden_layers = 0 }", "num_hidden_layers = 0"),
        ("{ hiden_size = 128 }", "unknown config key 'hiden_size'"),
        ("{ hidden_size = 64.5 }", "hidden_size = 64.5"),
        ("{ tie_word_embeddings = 1 }", "tie_word_embeddings = 1"),
    ],
)
def test_bad_builtin_config_overrides_are_one_line(tmp_path: Path, override: str, words: str) -> None:
    m = _manifest(tmp_path, "model", f"config = {override}")
    r = run_cli("build", str(m), "--quiet")
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_tilde_in_paths_is_the_home_folder_and_the_store_may_come_from_the_cli_alone(tmp_path: Path) -> None:
    """``~`` means the home folder as in a shell (a manifest value and a quoted argument reach hsstore
    unexpanded): model path, data files and store path of the manifest, ``--store`` and a store argument."""
    import json
    import shutil

    from helpers import DATA, save_local_model

    home = tmp_path / "home"
    save_local_model(home / "models" / "llama")
    shutil.copy(DATA, home / "data.jsonl")
    (tmp_path / "elsewhere").mkdir()
    m = write_manifest(
        tmp_path / "elsewhere" / "m.toml", model="~/models/llama", files=["~/data.jsonl"], store="~/out/s.zarr"
    )
    env = {"HOME": str(home)}
    r = run_cli("build", str(m), "--limit", "4", "--quiet", "--json", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (home / "out" / "s.zarr" / "zarr.json").is_file() and not (tmp_path / "elsewhere" / "~").exists()
    # a manifest without a store path takes it from --store alone (and refuses to run without one)
    bare = tmp_path / "elsewhere" / "bare.toml"
    bare.write_text(m.read_text().replace('path = "~/out/s.zarr"', ""))
    r = run_cli("build", str(bare), "--quiet", env=env)
    assert r.returncode == 2 and "[store] path is missing" in r.stderr, r.stderr
    r = run_cli("build", str(bare), "--limit", "4", "--quiet", "--store", "~/other.zarr", env=env)
    assert r.returncode == 0 and (home / "other.zarr" / "zarr.json").is_file(), r.stderr[-2000:]
    r = run_cli("info", "~/out/s.zarr", "--json", env=env)
    assert r.returncode == 0 and [v["n_samples"] for v in json.loads(r.stdout)["variants"]] == [4], r.stdout
    assert load_manifest(m).data_files == [str(Path.home() / "data.jsonl")]


SCHEMA_RULES = [  # (a change to a valid resolved manifest, the schema's words for it)
    ({"backends": ["triton"]}, "unknown backend 'triton'"),
    ({"dtypes": ["int8"]}, "unknown dtype 'int8'"),
    ({"devices": ["tpu"]}, "unknown device 'tpu'"),
    ({"data_format": "alpaca"}, "unknown data format 'alpaca'"),
    ({"too_long": "drop"}, "too_long = 'drop'; choose truncate or skip"),
    ({"max_length": 1}, "max_length = 1; it must be at least 2"),
    ({"attn_implementation": "paged"}, "unknown attn_implementation 'paged'"),
    ({"init_device": "gpu"}, "init_device = 'gpu'; choose cpu or device"),
    ({"codec": "lz77"}, "unknown compression 'lz77'"),
    ({"precision": "fp4"}, "precision = 'fp4'"),
    ({"token_budget": 100}, r"token_budget \(100\) must be at least \[data\] max_length"),
    ({"dtypes": ["bf16", "bfloat16"]}, "dtypes names 'bf16' twice"),
    ({"backends": []}, "must each name at least one"),
    ({"gpus_per_rank": 0}, "gpus_per_rank = 0; it must be 1 or more"),
    ({"gpus_per_rank": 2}, r'set devices = \["cuda"\]'),
    ({"unit_tokens": 0}, "unit_tokens = 0; it must be 1 or more"),
    ({"store_path": ""}, r"\[store\] path is missing"),
]


@pytest.mark.parametrize(
    "change,words", SCHEMA_RULES, ids=[next(iter(c)) + str(i) for i, (c, _) in enumerate(SCHEMA_RULES)]
)
def test_the_manifest_rules_live_in_its_schema(tmp_path: Path, change: dict, words: str) -> None:
    """Every value rule a manifest (and a CLI override of it) is held to is the schema's: a resolved Manifest is
    checked by hsstore.core.schema.manifest alone, given the store's codec names."""
    from hsstore.core.schema.manifest import check_manifest
    from hsstore.storage.codecs import CHOICES

    good = load_manifest(write_manifest(tmp_path / "m.toml"))
    assert check_manifest(good, CHOICES) == good
    with pytest.raises(BadInput, match=words):
        check_manifest(good.replace(**change), CHOICES)


def test_the_manifest_file_rules_live_in_its_schema() -> None:
    """The rules of the TOML document (tables, keys, required keys, layers) are the schema's too, and the names
    other layers accept (backends, data formats, attention) are the schema's own tuples, not copies."""
    from hsstore.capture.inputs import tokenizing
    from hsstore.compare import audit
    from hsstore.core.schema import manifest as schema

    ok = {
        "model": {"path": "builtin:tiny-llama", "layers": {"aux": [0], "target": [1]}},
        "data": {"files": ["d.jsonl"]},
    }
    assert schema.parse_manifest_file(ok, "m.toml").model.layers.target == [1]
    for raw, words in [
        ({**ok, "modle": {}}, r"unknown table\(s\) \['modle'\]"),
        ({**ok, "model": {**ok["model"], "layrs": 1}}, r"unknown key\(s\) \['layrs'\] in \[model\]"),
        ({**ok, "model": {"layers": ok["model"]["layers"]}}, r"\[model\] path is missing"),
        ({**ok, "data": {}}, r"\[data\] files is missing"),
        ({**ok, "model": {**ok["model"], "layers": {"aux": [1], "target": [1]}}}, "both aux and target"),
        ({**ok, "model": {**ok["model"], "layers": {"aux": [0], "target": []}}}, "layers.target is empty"),
        ({**ok, "model": {**ok["model"], "seed": 1.5}}, r"\[model\] seed = 1.5: expected an integer"),
    ]:
        with pytest.raises(BadInput, match=words):
            schema.parse_manifest_file(raw, "m.toml")
    assert audit.BACKENDS is schema.BACKENDS and audit.ATTENTION is schema.ATTENTION
    assert tokenizing.FORMATS is schema.DATA_FORMATS
