"""Model identity is content: a variant never mixes two weight files, and a moved model is the same model."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path

import pytest
import xxhash
from helpers import run_cli, save_local_model, write_manifest

from hsstore import HiddenStateDataset, ProvenanceMismatch, Store
from hsstore.capture.model.spec import ModelSpec, check_torch_file
from hsstore.core.errors import BuildFailed
from hsstore.core.keys import hash_files, stamp

LAYERS = "{ aux = [1], target = [2] }"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_local_model(tmp_path_factory.mktemp("models") / "my-model")


def _build(model: Path, store: Path, limit: int, env: dict, *args: str) -> dict:
    m = write_manifest(
        store.parent / f"{store.stem}-{model.name}.toml",
        model=str(model),
        layers=LAYERS,
        store=str(store),
        dtypes='["fp32"]',
    )
    r = run_cli("build", str(m), "--limit", str(limit), "--json", *args, env=env)
    assert r.returncode == 0, r.stderr
    assert "Loading weights" not in r.stderr  # transformers' own progress bar is silenced: hsstore says what it does
    # a status line from the start and at each phase, in order, before any other output
    # (the weights are hashed before tokenizing: a regenerating build generates under the model's identity)
    phases = [
        "planning",
        "loading the tokenizer",
        "hashing the model's weights",
        "tokenizing",
        "starting the torch worker",
        "torch/fp32/cpu: loading the model",
    ]
    said = [
        line.removeprefix("hsstore build: ") for line in r.stderr.splitlines() if line.startswith("hsstore build: ")
    ]
    assert [next(i for i, s in enumerate(said) if s.startswith(p)) for p in phases] == sorted(
        next(i for i, s in enumerate(said) if s.startswith(p)) for p in phases
    ), said
    assert r.stderr.startswith("hsstore build: planning "), r.stderr
    return json.loads(r.stdout)


def _flip_a_weight_byte_keeping_times(path: Path) -> None:
    """Change one weight (the low mantissa byte of the first tensor's first value), then put the file's
    access and modification times back, as `rsync -a`, `cp -p` or a re-download with kept times do."""
    st = path.stat()
    with open(path, "r+b") as f:
        header = struct.unpack("<Q", f.read(8))[0]
        f.seek(8 + header)
        b = f.read(1)
        f.seek(8 + header)
        f.write(bytes([b[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


def test_changed_weights_with_restored_mtime_never_mix_into_the_old_variant(model_dir: Path, tmp_path: Path):
    env = {"HSSTORE_CACHE": str(tmp_path / "cache")}  # a private hash cache, where a build keeps one
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    store = tmp_path / "s.zarr"
    (first,) = _build(model, store, 4, env)["variants"]
    _flip_a_weight_byte_keeping_times(model / "model.safetensors")
    refused = run_cli("build", str(store.parent / f"{store.stem}-{model.name}.toml"), "--limit", "4", env=env)
    assert refused.returncode == 2 and "another model" in refused.stderr  # other weights: asked for (issue 43)
    (second,) = _build(model, store, 4, env, "--another-model")["variants"]
    assert second["variant"] != first["variant"] and second["samples_written"] == 4
    (third,) = _build(model, store, 8, env)["variants"]  # more rows: they go to the new weights' variant
    assert third["variant"] == second["variant"] and third["samples_written"] == 4
    counts = {v.id: v.n_samples for v in Store.open(store).variants}
    assert counts == {first["variant"]: 4, second["variant"]: 8}
    weights = {
        v.id: v.provenance["recipe"]["model"]["weights"]["model.safetensors"]["xxh3_128"]
        for v in Store.open(store).variants
    }
    assert weights[first["variant"]] != weights[second["variant"]]
    with pytest.raises(ProvenanceMismatch, match="recipe.model.fingerprint"):  # other weights: another model
        HiddenStateDataset(
            store, variant=second["variant"], require=HiddenStateDataset(store, variant=first["variant"])
        )


def test_a_copied_or_hub_cache_symlinked_model_directory_is_the_same_variant_and_satisfies_require(
    model_dir: Path, tmp_path: Path
):
    """Identity is content, not location: a copy under a new path and name (new mtimes), and the HF cache
    layout (snapshots/REV/* -> ../../blobs/HASH, the links followed), are the model that first ran."""
    copy = tmp_path / "elsewhere" / "renamed-copy"
    shutil.copytree(model_dir, copy)  # new path, new directory name, new mtimes; the same bytes
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for f in model_dir.iterdir():
        shutil.copy2(f, blobs / xxhash.xxh3_64_hexdigest(f.read_bytes()))
        (snap / f.name).symlink_to(Path("../../blobs") / xxhash.xxh3_64_hexdigest(f.read_bytes()))
    store = tmp_path / "s.zarr"
    (a,) = _build(model_dir, store, 4, {})["variants"]
    (b,) = _build(copy, store, 6, {})["variants"]
    assert b["variant"] == a["variant"] and b["samples_present"] == 4 and b["samples_written"] == 2
    (c,) = _build(snap, store, 6, {})["variants"]
    assert c["variant"] == a["variant"] and c["samples_present"] == 6 and c["samples_written"] == 0
    (v,) = Store.open(store).variants
    assert v.provenance["recipe"]["model"]["path"] == str(model_dir)  # where it first ran: informational
    other = tmp_path / "other.zarr"
    _build(copy, other, 4, {})
    ds = HiddenStateDataset(other, require=HiddenStateDataset(store).provenance)
    assert len(ds) == 4


def test_weights_changed_after_hashing_are_refused_before_anything_is_written(model_dir: Path, tmp_path: Path):
    """The worker compares the stamps after loading: a file rewritten (times restored) in between is caught."""
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    spec = ModelSpec(str(model))
    hashed = spec.hash_weights()
    spec.check_unchanged({n: h.stamp for n, h in hashed.items()})  # untouched: fine
    _flip_a_weight_byte_keeping_times(model / "model.safetensors")
    with pytest.raises(BuildFailed, match=r"model file\(s\) \['model.safetensors'\] .* changed after they were hashed"):
        spec.check_unchanged({n: h.stamp for n, h in hashed.items()})
    (model / "extra.safetensors").write_bytes((model / "model.safetensors").read_bytes())
    with pytest.raises(BuildFailed, match="extra.safetensors"):  # a weight file that appeared counts too
        spec.check_unchanged({n: h.stamp for n, h in spec.hash_weights().items() if n != "extra.safetensors"})


def test_hashes_are_of_the_bytes_in_parallel(tmp_path: Path):
    files = []
    for i, n in enumerate([0, 1, (16 << 20) + 3, 5000]):  # empty, tiny, over one read chunk, small
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(n))
        files.append(p)
    got = hash_files(files, threads=3)
    for p in files:
        assert got[str(p)].xxh3_128 == xxhash.xxh3_128_hexdigest(p.read_bytes())
        assert got[str(p)].size == p.stat().st_size and got[str(p)].stamp == stamp(p)


def test_builtin_model_identity_is_unchanged_so_old_stores_resume():
    """Builtins have no directory: their name is content. Their identity (and so their variant ids) is
    pinned to what format 1.0 stores hold."""
    spec = ModelSpec("builtin:tiny-qwen3_5")
    ident = spec.identity(spec.config(len(spec.tokenizer()))).to_dict()
    assert ident == {
        "path": "builtin:tiny-qwen3_5",
        "name": "builtin:tiny-qwen3_5",
        "model_type": "qwen3_5_text",
        "num_layers": 4,
        "hidden_size": 64,
        "config_fingerprint": "d91acfed2e87d34111e258ee237930af",
        "seed": 0,
        "generator_version": 1,
        "init_device": "cpu",
        "fingerprint": "bb22bad149ccfc4e27f711b17aac8dbb",
    }


def test_a_file_that_changes_while_it_is_hashed_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import hsstore.core.keys as fh

    p = tmp_path / "model.safetensors"
    p.write_bytes(b"x" * 1000)
    stamps = iter([fh.stamp(p), fh.stamp(p).replace(mtime_ns=1)])  # as a copy still running would show
    monkeypatch.setattr(fh, "stamp", lambda path: next(stamps))
    with pytest.raises(
        BuildFailed, match=r"model.safetensors changed while it was hashed .* re-run when it is complete"
    ):
        fh.hash_file(p)


def _refused_before_a_store(model: Path, tmp_path: Path, pattern: str) -> None:
    store = tmp_path / "s.zarr"
    m = write_manifest(tmp_path / "m.toml", model=str(model), layers=LAYERS, store=str(store), dtypes='["fp32"]')
    r = run_cli("build", str(m), "--limit", "2", "--quiet")
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:") or "Traceback" in x]
    assert r.returncode == 2 and len(lines) == 1 and re.search(pattern, lines[0]), r.stderr[-2000:]
    assert not store.exists()  # found while planning: no store, no variant, nothing to clean up


def test_a_sharded_checkpoint_missing_a_shard_is_refused_before_a_store_is_made(tmp_path: Path):
    from transformers import AutoModelForCausalLM

    model = tmp_path / "sharded"
    shutil.copytree(save_local_model(tmp_path / "one"), model)
    AutoModelForCausalLM.from_pretrained(model).save_pretrained(model, max_shard_size="200KB")
    (model / "model.safetensors").unlink(missing_ok=True)
    shards = sorted(model.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (model / "model.safetensors.index.json").is_file()
    shards[1].unlink()  # an interrupted download
    _refused_before_a_store(model, tmp_path, rf"names weight shard\(s\) \['{shards[1].name}'\] that are not in")


def test_a_truncated_weight_file_is_refused_before_a_store_is_made(model_dir: Path, tmp_path: Path):
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 2])  # a download cut short
    _refused_before_a_store(model, tmp_path, r"model\.safetensors' is not a whole safetensors file")


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_damaged_bin_checkpoint_is_refused_before_a_store_is_made(model_dir: Path, tmp_path: Path, damage: str):
    import torch
    from safetensors.torch import load_file

    model = tmp_path / "model"
    shutil.copytree(model_dir, model, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save(load_file(model_dir / "model.safetensors"), model / "pytorch_model.bin")  # the pre-safetensors format
    data = bytearray((model / "pytorch_model.bin").read_bytes())
    check_torch_file(model / "pytorch_model.bin")  # whole: accepted
    if damage == "truncated":
        data = data[: len(data) // 2]  # a download cut short
    else:
        data[len(data) // 2] ^= 0xFF  # a bad sector or a bad copy, size kept
    (model / "pytorch_model.bin").write_bytes(bytes(data))
    _refused_before_a_store(model, tmp_path, r"pytorch_model\.bin' is not a whole torch checkpoint")


def test_the_pinned_chat_date_is_part_of_the_tokenizer_identity_only_where_a_template_prints_a_date():
    """How the tokens were made includes the day a dated template printed: recorded with the tokenizer (so
    it is in the recipe, hence the variant id); a template that prints no date records none, so such
    tokenizers' identities, and the variant ids built on them, are what they were."""
    spec = ModelSpec("builtin:tiny-qwen3_5")
    tok = spec.tokenizer()
    plain, template = spec.tokenizer_identity(tok).to_dict(), tok.chat_template
    assert set(plain) == {"fingerprint", "vocab_size", "has_chat_template"}
    tok.chat_template = "{{ strftime_now('%Y-%m-%d') }}" + template
    dated = spec.tokenizer_identity(tok).to_dict()
    assert dated["chat_date"] == "2024-07-26" and dated["fingerprint"] != plain["fingerprint"]
    tok.chat_template = {"default": template, "tool_use": tok.chat_template}
    assert spec.tokenizer_identity(tok).to_dict()["chat_date"] == "2024-07-26"  # one of its named templates
