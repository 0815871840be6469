"""A store that lives for months (issue 43): many variants of one model, each named by every selector the
tool prints, by a label a person gives it, and never joined by another model's states unasked.

One real store of a tiny llama built through the CLI: 2 attention kernels x 2 dtypes, a token-budget twin,
an FP8 twin (hsstore convert) and an import of an export of one of them — seven variants."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import run_cli, write_manifest

from hsstore import HiddenStateDataset, SelectorError
from hsstore.core.selectors import distinguishing, select
from hsstore.storage.names import label_records, model_records
from hsstore.storage.store import Store

LAYERS = "{ aux = [0, 1], target = [3] }"
SELECTOR = re.compile(r"#([^\s;]+)")  # a selector as the tool prints it: up to a space or ';'


def _ok(*args: str) -> str:
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    return r.stderr


def _noted(store: Path, stderr: str) -> list[tuple[str, str]]:
    """Each "new variant" note of a build, with the variant its selector names in the store right then."""
    notes = [n for n in stderr.splitlines() if n.startswith("new variant ")]
    return [(n, Store.open(store).select(_selectors(n.split("name this one with", 1)[1])[0])) for n in notes]


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The store, and every stderr line its builds printed about a new variant."""
    d = tmp_path_factory.mktemp("many")
    store = d / "store.zarr"
    sdpa = write_manifest(d / "sdpa.toml", model="builtin:tiny-llama", dtypes='["bf16", "fp32"]', layers=LAYERS)
    eager = write_manifest(
        d / "eager.toml",
        model="builtin:tiny-llama",
        dtypes='["bf16", "fp32"]',
        layers=LAYERS,
        extra_model='attn_implementation = "eager"',
    )
    small = write_manifest(
        d / "small.toml", model="builtin:tiny-llama", layers=LAYERS, extra_build='label = "small-budget"'
    )
    small.write_text(small.read_text().replace("token_budget = 2048", "token_budget = 1024"))
    notes = []
    for m, args in (
        (sdpa, ("--dtype", "bf16", "--label", "sdpa-bf16")),
        (sdpa, ("--dtype", "fp32")),
        (eager, ()),
        (small, ()),
    ):  # (the eager build makes two variants)
        notes += _noted(store, _ok("build", str(m), "--limit", "4", "--quiet", *args))
    _ok("convert", f"{store}#sdpa-bf16", "--precision", "fp8-e4m3", "--label", "sdpa-fp8", "--quiet")
    _ok("export", f"{store}#sdpa-bf16", "specforge", str(d / "exported"))
    shutil.copytree(d / "exported", d / "foreign")  # without hsstore's export record: another tool's cache
    (d / "foreign" / "hsstore-export.json").unlink()
    _ok(
        "import",
        "specforge",
        str(d / "foreign"),
        "--store",
        str(store),
        "--model",
        "builtin:tiny-llama",
        "--layers",
        "0,1,3",
        "--capture",
        "output",
        "--label",
        "imported",
        "--quiet",
    )
    return store, notes


def _selectors(text: str) -> list[str]:
    return [s for s in SELECTOR.findall(text) if not s.startswith("SELECTOR")]  # (STORE#SELECTOR: a placeholder)


def test_the_store_holds_seven_variants_and_builds_name_each_new_one(many):
    store, notes = many
    assert len(Store.open(store).variant_ids()) == 7
    # every build after the first made variants beside others: each said so, with a selector naming it
    assert len(notes) == 4, notes  # sdpa fp32, eager bf16 and fp32, the smaller budget
    eager = [n for n, _ in notes if "attention=eager" in n.split(":")[0]]
    assert len(eager) == 2 and any("attention eager (was sdpa)" in n for n in eager), eager
    for note, named in notes:  # its selector named it alone when the build said it
        assert named == note.split()[2], note


def test_every_selector_info_prints_names_exactly_its_variant(many):
    store, _ = many
    s = Store.open(store)
    info = json.loads(_info(store, "--json"))
    assert len({v["selector"] for v in info["variants"]}) == 7
    for v in info["variants"]:
        assert s.select(v["selector"]) == v["id"]
        fields = ",".join(f"{k}={x}" for k, x in v["distinguished_by"].items())
        if fields:  # the fields info says tell it apart are a selector too
            assert s.select(fields) == v["id"], fields
    heads = [line for line in _info(store).splitlines() if line.startswith("  select as ")]
    assert len(heads) == 7
    for line in heads:
        assert s.select(line.split("#", 1)[1].split()[0]) in s.variant_ids()
    # the two builds apart only by the attention kernel do not read alike
    text = _info(store).splitlines()
    kernels = {line for line in text if line.startswith("variant ") and "attention=eager" in line}
    assert len(kernels) == 2 and all("attention=eager" in k for k in kernels)


def _info(store: Path, *args: str) -> str:
    r = run_cli("info", str(store), *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize(
    "selector",
    [
        None,
        "backend=torch",
        "dtype=bf16",
        "attention=sdpa",
        "dtype=bf16,attention=sdpa",
        "model.name=builtin:tiny-llama",
        "dtype=bf61",
        "nolabel",
    ],
)
def test_every_selector_an_error_suggests_names_exactly_one_variant(many, selector):
    """Ambiguity, no selector, no match: each selector the message offers picks one variant, the one it is
    offered for; no field is said twice in a candidate's description."""
    store, _ = many
    s = Store.open(store)
    with pytest.raises(SelectorError) as e:
        s.select(selector)
    msg = str(e.value)
    offered = _selectors(msg)
    assert offered, msg
    picked = [s.select(x) for x in offered]
    assert all(p in s.variant_ids() for p in picked)
    for part in msg.split("Choices: ", 1)[1].split("; "):
        vid, sel = part.split()[0], part.rsplit(" as #", 1)[1]
        assert s.select(sel) == vid, part
        words = part.split("(", 1)[1].split(")", 1)[0].split()
        assert len({w.split("=")[0] for w in words}) == len(words), part  # each field once
    cli = run_cli("diff", f"{store}#{selector}" if selector else str(store), f"{store}#sdpa-bf16")
    assert cli.returncode == 2 and cli.stderr.strip() == f"error: {msg}"  # the CLI says what Python says


def test_a_hash_field_is_selected_by_a_prefix_as_an_id_is(many):
    store, _ = many
    s = Store.open(store)
    vid = s.select("sdpa-bf16")
    fp = s.variant_record(vid).provenance["recipe"]["model"]["fingerprint"]
    assert s.select(f"label=sdpa-bf16,model.fingerprint={fp[:8]}") == vid
    assert s.select(f"label=sdpa-bf16,model.fingerprint={fp}") == vid
    # one model: its prefix names all six stored as computed (the FP8 one only with precision=)
    with pytest.raises(SelectorError, match="matches 6 variants"):
        s.select(f"model.fingerprint={fp[:10]}")
    with pytest.raises(SelectorError, match="matches no variant"):  # shorter than 8: not a prefix
        s.select(f"model.fingerprint={fp[:6]}")


def test_labels_from_build_convert_import_rename_and_python(many, tmp_path: Path):
    src, _ = many
    shutil.copytree(src, tmp_path / "s.zarr")
    store = tmp_path / "s.zarr"
    s = Store.open(store)
    assert sorted(s.labels().values()) == ["imported", "sdpa-bf16", "sdpa-fp8", "small-budget"]
    info = {v["label"]: v for v in json.loads(_info(store, "--json"))["variants"] if v["label"]}
    assert info["sdpa-fp8"]["precision"] == "fp8-e4m3" and info["imported"]["provenance"]["source"]
    assert info["sdpa-bf16"]["selector"] == "sdpa-bf16"
    head = next(line for line in _info(store).splitlines() if line.startswith("variant sdpa-bf16 "))
    assert head.split()[2].rstrip(":") == info["sdpa-bf16"]["id"]  # the label comes first, then the id
    vid = info["sdpa-bf16"]["id"]
    assert len(HiddenStateDataset(str(store), variant="sdpa-bf16")) == 4  # the Python API takes it too
    assert len(HiddenStateDataset(f"{store}#label=sdpa-bf16")) == 4

    r = run_cli("label", f"{store}#sdpa-bf16", "sdpa-fp8")  # another variant's label: refused, nothing changes
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "already names variant" in r.stderr
    assert s.labels()[vid] == "sdpa-bf16"
    r = run_cli("label", f"{store}#sdpa-bf16", "baseline", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["previous"] == "sdpa-bf16"
    assert s.select("baseline") == vid and s.labels()[vid] == "baseline"
    with pytest.raises(SelectorError, match="labels here: baseline, imported"):
        s.select("sdpa-bf16")
    history = [(rec.label, rec.previous, rec.by) for _, rec in label_records(s) if rec.variant == vid]
    assert history == [("sdpa-bf16", None, "build"), ("baseline", "sdpa-bf16", "label")]
    assert run_cli("label", f"{store}#baseline", "bad label").returncode == 2
    assert run_cli("verify", str(store)).returncode == 0  # the label records are part of the format


def test_a_label_another_variant_holds_stops_a_build_before_it_runs(many, tmp_path: Path):
    src, _ = many
    shutil.copytree(src, tmp_path / "s.zarr")
    store = tmp_path / "s.zarr"
    m = write_manifest(tmp_path / "m.toml", model="builtin:tiny-llama", layers=LAYERS, store=str(store))
    before = sorted(p.name for p in (store / "variants").iterdir())
    r = run_cli("build", str(m), "--dtype", "fp32", "--label", "sdpa-bf16", "--quiet", "--limit", "4")
    assert r.returncode == 2 and "label 'sdpa-bf16' already names variant" in r.stderr
    assert sorted(p.name for p in (store / "variants").iterdir()) == before
    r = run_cli("build", str(m), "--label", "two", "--dtype", "bf16", "--dtype", "fp32", "--quiet")
    assert r.returncode == 2 and "names one variant but this build makes 2" in r.stderr


def _tree(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in store.rglob("*"))


def test_another_model_is_refused_before_it_runs_unless_asked(many, tmp_path: Path):
    src, _ = many
    shutil.copytree(src, tmp_path / "s.zarr")
    store = tmp_path / "s.zarr"
    m = write_manifest(tmp_path / "qwen.toml", model="builtin:tiny-qwen3_5", store=str(store))
    before = _tree(store)
    r = run_cli("build", str(m), "--quiet", "--limit", "4")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert "builtin:tiny-llama" in r.stderr and "builtin:tiny-qwen3_5" in r.stderr and "--another-model" in r.stderr
    assert "loading the model" not in r.stderr and _tree(store) == before  # nothing ran, nothing written
    r = run_cli(
        "import",
        "specforge",
        str(src.parent / "exported"),
        "--store",
        str(store),
        "--model",
        "builtin:tiny-qwen3_5",
        "--quiet",
    )  # an import of another model's states: refused alike
    assert r.returncode == 2 and "--another-model" in r.stderr and _tree(store) == before

    m.write_text(m.read_text().replace("[build]", "[build]\nanother_model = true"))  # the manifest key
    _ok("build", str(m), "--quiet", "--limit", "4")
    info = json.loads(_info(store, "--json"))
    assert [len(g["variants"]) for g in info["models"]] == [7, 1]
    assert info["models"][1]["model"].startswith("builtin:tiny-qwen3_5")
    text = _info(store)
    assert "of 2 models)" in text and text.count("\nmodel builtin:tiny-") == 2
    s = Store.open(store)
    assert [r.name.split()[0] for r in model_records(s)] == ["builtin:tiny-qwen3_5"]
    assert run_cli("verify", str(store)).returncode == 0
    for v in info["variants"]:  # still every variant is named by its selector
        assert s.select(v["selector"]) == v["id"]


def test_the_fewest_fields_are_found_where_adding_them_one_by_one_is_not_fewest():
    """Four variants over three fields: the greedy 'most telling first' would take two fields for the
    last one, the search takes the one field that names it."""
    base = {
        "recipe": {"model": {"name": "m"}, "tokenizer": {"fingerprint": "t"}, "layers": {"aux": [0], "target": [1]}},
        "environment": {
            "dtype": "bf16",
            "backend": "torch",
            "device": "cpu",
            "kernels": {"attention": "sdpa", "causal_conv1d": "n/a", "chunk_gated_delta_rule": "n/a"},
        },
    }

    def v(dtype: str, attention: str, budget: int) -> dict:
        p = json.loads(json.dumps(base))
        p["environment"].update(dtype=dtype, batching={"token_budget": budget})
        p["environment"]["kernels"]["attention"] = attention
        return p

    variants = {
        "a": v("bf16", "sdpa", 1),
        "b": v("bf16", "eager", 1),
        "c": v("fp32", "sdpa", 1),
        "d": v("bf16", "sdpa", 2),
    }
    apart = distinguishing(variants)
    assert apart["d"] == {"token_budget": "2"} and apart["b"] == {"attention": "eager"}
    assert apart["a"] == {"dtype": "bf16", "attention": "sdpa", "token_budget": "1"}
    for vid, fields in apart.items():
        assert select(variants, ",".join(f"{k}={x}" for k, x in fields.items())) == vid


def test_reimporting_the_stores_own_export_is_that_variant_and_keeps_its_label(many):
    """hsstore's own export restores its provenance on import: the same variant, nothing new, and a --label
    given to the import does not silently take the exported variant's label away."""
    store, _ = many
    before = Store.open(store)
    r = run_cli(
        "import",
        "specforge",
        str(store.parent / "exported"),
        "--store",
        str(store),
        "--model",
        "builtin:tiny-llama",
        "--label",
        "again",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    held = before.labels().get(json.loads(r.stdout)["variant"])
    assert Store.open(store).variant_ids() == before.variant_ids() and held in ("sdpa-bf16", "baseline")
    assert Store.open(store).labels() == before.labels() and json.loads(r.stdout)["label"] == held
    assert f"already labelled {held!r}" in r.stderr


def test_a_word_that_is_a_label_and_another_variants_id_prefix_names_neither(many, tmp_path: Path):
    """``#2`` where one variant is labelled 2 and another's id starts with 2: refused as ambiguous, never one of
    them by a rule the user cannot see; and such a label is refused when given while the id exists."""
    variants = {"21a03a664467": {"environment": {"dtype": "bf16"}}, "7bd7372938bb": {"environment": {"dtype": "fp32"}}}
    with pytest.raises(SelectorError, match="matches 2 variants"):
        select(variants, "2", labels={"7bd7372938bb": "2"})
    assert select(variants, "label=2", labels={"7bd7372938bb": "2"}) == "7bd7372938bb"
    assert select(variants, "21", labels={"7bd7372938bb": "2"}) == "21a03a664467"
    assert select(variants, "7b", labels={"7bd7372938bb": "7b"}) == "7bd7372938bb"  # its own id: one variant

    src, _ = many
    shutil.copytree(src, tmp_path / "s.zarr")
    store = tmp_path / "s.zarr"
    ids = Store.open(store).variant_ids()
    mine = Store.open(store).select("sdpa-bf16")
    other = next(v for v in ids if v[0] != mine[0])
    r = run_cli("label", f"{store}#sdpa-bf16", other[:2])
    assert r.returncode == 2 and "reads as a prefix of variant" in r.stderr and other in r.stderr, r.stderr
    assert Store.open(store).labels()[mine] == "sdpa-bf16"


def test_a_shape_only_import_vouches_for_no_model(many, tmp_path: Path):
    """An import given no model is known by its shape alone: it must not let another model of that shape (the
    tiny qwen3.5 hybrid has the tiny llama's 4 layers and hidden 64) into the store unasked, and info never
    groups two models under it."""
    src, _ = many
    shutil.copytree(src, tmp_path / "s.zarr")
    store = tmp_path / "s.zarr"
    _ok(
        "import",
        "specforge",
        str(src.parent / "foreign"),
        "--store",
        str(store),
        "--tokenizer",
        "builtin:tiny-llama",
        "--num-layers",
        "4",
        "--layers",
        "0,1,3",
        "--capture",
        "output",
        "--quiet",
    )
    models = json.loads(_info(store, "--json"))["models"]
    assert [len(g["variants"]) for g in models] == [8]  # the one known model of its shape takes it
    m = write_manifest(tmp_path / "qwen.toml", model="builtin:tiny-qwen3_5", store=str(store))
    before = _tree(store)
    r = run_cli("build", str(m), "--quiet", "--limit", "4")
    assert r.returncode == 2 and "--another-model" in r.stderr and _tree(store) == before, r.stderr
    _ok("build", str(m), "--quiet", "--limit", "4", "--another-model")
    models = json.loads(_info(store, "--json"))["models"]
    assert sorted(len(g["variants"]) for g in models) == [1, 1, 7]  # shape-only: its own group beside two models
    assert any("shape only: 4 layers, hidden 64" in g["model"] for g in models)


def test_an_import_whose_label_another_variant_holds_writes_nothing(many, tmp_path: Path):
    """Importing again with other options makes another variant: a --label the first import holds is refused
    before a sample of it is written (it used to write the whole variant, then refuse the label)."""
    src, _ = many
    shutil.copytree(src, tmp_path / "s.zarr")
    store = tmp_path / "s.zarr"
    before = _tree(store)
    r = run_cli(
        "import",
        "specforge",
        str(src.parent / "foreign"),
        "--store",
        str(store),
        "--tokenizer",
        "builtin:tiny-llama",
        "--num-layers",
        "4",
        "--layers",
        "0,1,3",
        "--capture",
        "output",
        "--label",
        "imported",
        "--quiet",
    )
    assert r.returncode == 2 and "label 'imported' already names variant" in r.stderr, r.stderr
    assert _tree(store) == before


def test_an_export_imports_back_with_no_flags(many, tmp_path: Path):
    """The export record names the model (a builtin here): its tokenizer loads, is checked against the one the
    samples were keyed with, and the import restores the variant as exported."""
    store, _ = many
    exported = Store.open(store).select("sdpa-bf16")
    r = run_cli("import", "specforge", str(store.parent / "exported"), "--store", str(tmp_path / "b.zarr"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["provenance"] == "restored" and json.loads(r.stdout)["variant"] == exported
