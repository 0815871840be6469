"""FP8 storage end to end: built and converted FP8 variants, raw and dequantized reads, provenance
refusal, convert resumability after SIGKILL, verify, info's error against the bf16-vs-fp32 floor."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO, diff_report, one_sample_units, run_cli

from hsstore import HiddenStateDataset, ProvenanceMismatch, Store, StreamingHiddenStateDataset
from hsstore.core import precision_names as precision
from hsstore.core import quant
from hsstore.core.errors import BadInput
from hsstore.storage.convert import convert
from hsstore.storage.verify import verify

FP8 = "precision=fp8-e4m3"


@pytest.fixture(scope="module")
def converted_once(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny store (bf16 and fp32 variants) with an FP8 variant converted from the bf16 one, made once."""
    s = tmp_path_factory.mktemp("fp8") / "s.zarr"
    shutil.copytree(tiny_store, s)
    r = run_cli("convert", f"{s}#dtype=bf16", "--precision", "fp8-e4m3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["complete"] and out["samples_converted"] == 40 and out["samples_present"] == 0
    return s


@pytest.fixture
def converted(converted_once: Path, tmp_path: Path) -> Path:
    """A test's own copy of the converted store (tests may change it)."""
    s = tmp_path / "s.zarr"
    shutil.copytree(converted_once, s)
    return s


def test_convert_quantizes_every_sample_exactly_as_the_quantizer_does(converted: Path) -> None:
    src = HiddenStateDataset(converted, variant="dtype=bf16")
    fp8 = HiddenStateDataset(converted, variant=FP8)
    raw = HiddenStateDataset(converted, variant=FP8, raw=True)
    assert fp8.keys == src.keys and fp8.precision == "fp8-e4m3" and src.precision is None
    for i in (0, 7, len(src) - 1):
        a, b, r = src[i], fp8[i], raw[i]
        assert b["aux_hidden"].dtype == torch.bfloat16 and b["aux_hidden"].shape == a["aux_hidden"].shape
        assert r["aux_hidden"].dtype == torch.float8_e4m3fn and r["aux_scales"].shape == (*a["aux_hidden"].shape[:2], 1)
        for role in ("aux", "target"):
            x = a[f"{role}_hidden"]
            T, n, H = x.shape
            q = quant.quantize(x.reshape(T * n, H))
            assert torch.equal(r[f"{role}_hidden"].view(torch.uint8).reshape(T * n, H), q.codes)
            assert torch.equal(r[f"{role}_scales"].reshape(T * n, 1), q.scales)
            # default reads are the exact dequantization of the raw codes
            assert torch.equal(b[f"{role}_hidden"].float(), r[f"{role}_hidden"].float() * r[f"{role}_scales"])
        assert torch.equal(b["input_ids"], a["input_ids"]) and torch.equal(b["loss_mask"], a["loss_mask"])


def test_requiring_the_bf16_provenance_refuses_fp8_unless_storage_may_drift(converted: Path) -> None:
    train = HiddenStateDataset(converted, variant="dtype=bf16")
    with pytest.raises(
        ProvenanceMismatch, match=r"environment\.storage\.precision: 'fp8-e4m3' \(store\) != '<absent>'"
    ):
        HiddenStateDataset(converted, variant=FP8, require=train)
    HiddenStateDataset(converted, variant=FP8, require=train, allow_drift=["storage"])
    fp8 = HiddenStateDataset(converted, variant=FP8)
    HiddenStateDataset(converted, variant=FP8, require=fp8)  # its own provenance matches
    with pytest.raises(ProvenanceMismatch, match="storage"):
        HiddenStateDataset(converted, variant="dtype=bf16", require=fp8)


def test_a_selector_that_does_not_name_a_precision_still_picks_the_variant_stored_as_computed(converted: Path) -> None:
    assert HiddenStateDataset(converted, variant="dtype=bf16").precision is None
    assert HiddenStateDataset(converted, variant="dtype=bf16,precision=fp8-e4m3").precision == "fp8-e4m3"


def test_fp8_variant_is_verify_clean_smaller_and_info_states_its_error_against_the_floor(converted: Path) -> None:
    v = verify(Store.open(converted))
    assert v.ok, v.problems
    r = run_cli("info", str(converted), "--json")
    assert r.returncode == 0, r.stderr
    variants = {
        (x["provenance"]["environment"]["dtype"], x.get("precision")): x for x in json.loads(r.stdout)["variants"]
    }
    fp8, bf16 = variants[("bf16", "fp8-e4m3")], variants[("bf16", None)]
    st = fp8["storage"]
    assert st["source"]["variant"] == bf16["id"] and st["scale"] == precision.SCALE_SCHEME
    assert set(st["error"]) == {"0", "1", "3"} and st["floor"]["samples"] > 0
    for layer, e in st["error"].items():
        assert 0.005 < e["rel_l2"] < 0.05 and e["tokens"] == fp8["n_tokens"]
        assert st["error_vs_floor"][layer] == pytest.approx(e["rel_l2"] / st["floor"]["rel_l2"][layer])
    assert fp8["raw_state_bytes"] == bf16["raw_state_bytes"]  # raw = the states as computed (bf16)
    text = run_cli("info", str(converted)).stdout
    assert "fp8-e4m3" in text and "x the bf16-vs-fp32 floor" in text


def test_diff_reads_fp8_dequantized_against_its_source(converted: Path) -> None:
    rep = diff_report(f"{converted}#{FP8}", f"{converted}#dtype=bf16")
    assert rep["shared_samples"] == 40 and [L["layer"] for L in rep["layers"]] == [0, 1, 3]
    for layer in rep["layers"]:
        assert 0.005 < layer["rel_l2"] < 0.05


def test_a_floor_measured_on_fp8_states_is_refused(converted: Path) -> None:
    """A against C is the floor; with A (or C) stored as FP8 it would be FP8 error, and every divergence
    below twice that would read "within precision noise"."""
    for a, c in ((FP8, "dtype=fp32"), ("dtype=bf16", FP8)):
        r = run_cli(
            "diff",
            f"{converted}#{a}",
            f"{converted}#dtype=bf16" if a == FP8 else f"{converted}#dtype=fp32",
            "--floor",
            f"{converted}#{c}",
        )
        assert r.returncode == 2, r.stdout
        assert "stored as fp8-e4m3" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(
        "diff", f"{converted}#dtype=bf16", f"{converted}#{FP8}", "--floor", f"{converted}#dtype=fp32", "--json", "-"
    )
    assert r.returncode == 0, r.stderr  # B stored as FP8: A against C is still the bf16-vs-fp32 floor
    assert json.loads(r.stdout)["verdict_kind"] == "beyond_noise"  # FP8 error is ~10x the bf16 floor


def test_check_recomputes_an_fp8_variant_bit_exactly_and_refuses_a_floor(converted: Path) -> None:
    """Live states go through the build's quantizer, so a correct FP8 store reads identical; a floor on
    FP8 states would measure storage error and is refused."""
    r = run_cli("check", "builtin:tiny-qwen3_5", f"{converted}#{FP8}", "--samples", "4", "--json", "-")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["verdict_kind"] == "identical" and [L["layer"] for L in rep["layers"]] == [0, 1, 3]
    assert all(L["bit_exact"] == 1.0 for L in rep["layers"])
    r = run_cli("check", "builtin:tiny-qwen3_5", f"{converted}#{FP8}", "--floor", f"{converted}#dtype=fp32")
    assert r.returncode == 2 and "stored as fp8-e4m3" in r.stderr and "Traceback" not in r.stderr


def test_converting_twice_is_a_no_op_and_converting_fp8_is_refused(converted: Path) -> None:
    again = convert(f"{converted}#dtype=bf16", "fp8-e4m3")
    assert again.samples_converted == 0 and again.samples_present == 40 and again.complete
    # asked for another codec, the existing variant keeps its own (a codec changes no number), and says so:
    # the report once said "codec none" of a variant stored, and listed by info, as zstd
    kept = Store.open(converted).variant_record(again.variant).codec
    r = run_cli("convert", f"{converted}#dtype=bf16", "--precision", "fp8-e4m3", "--codec", "none", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["codec"] == kept != "none", r.stdout
    assert f"keeps its codec {kept} (codec none was asked for)" in r.stderr, r.stderr
    r = run_cli("convert", f"{converted}#dtype=bf16", "--precision", "fp8-e4m3")  # the CLI's text: stdout is
    assert r.returncode == 0 and r.stdout.startswith(f"{converted}#")  # the report, no progress debris
    r = run_cli("convert", f"{converted}#{FP8}", "--precision", "fp8-e4m3")
    assert r.returncode == 2 and "already stored as fp8-e4m3" in r.stderr
    r = run_cli("convert", f"{converted}#dtype=bf16", "--precision", "fp4")
    assert r.returncode == 2 and "unknown storage precision 'fp4'" in r.stderr


def _many_units(tmp_path: Path, n: int = 60) -> Path:
    """A bf16 store of ``n`` one-sample units (so a convert has many commits to be killed between)."""
    one_sample_units(tmp_path / "many.zarr", [64 + 7 * i for i in range(n)], seed=1, hidden=256, chunk=64)
    return tmp_path / "many.zarr"


@pytest.mark.process
def test_convert_killed_mid_way_resumes_to_the_same_variant(tmp_path: Path) -> None:
    src = _many_units(tmp_path)
    dst = tmp_path / "fp8.zarr"
    cmd = [
        sys.executable,
        "-m",
        "hsstore",
        "convert",
        f"{src}",
        "--precision",
        "fp8-e4m3",
        "--store",
        str(dst),
        "--workers",
        "1",
        "--quiet",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    commits: list[Path] = []
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        commits = list(dst.glob("variants/*/commits/*.json")) if dst.exists() else []
        if commits:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGSTOP)  # freeze it, count, then kill it
    n_before = len(list(dst.glob("variants/*/commits/*.json")))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 1 <= n_before < 60, f"the convert was not stopped mid-way ({n_before} of 60 units committed)"
    r = run_cli("convert", str(src), "--precision", "fp8-e4m3", "--store", str(dst), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (
        out["complete"]
        and out["samples_present"] >= n_before - 1
        and out["samples_converted"] + out["samples_present"] == 60
    )
    clean = convert(str(src), "fp8-e4m3", dest=str(tmp_path / "clean.zarr"))
    assert clean.variant == out["variant"]  # same provenance, same id
    resumed = HiddenStateDataset(dst, raw=True)
    fresh = HiddenStateDataset(tmp_path / "clean.zarr", raw=True)
    assert resumed.keys == fresh.keys and len(resumed) == 60  # same samples, in the source's order
    for k in resumed.keys[::7]:
        a, b = resumed[resumed.keys.index(k)], fresh[fresh.keys.index(k)]
        assert torch.equal(a["aux_hidden"].view(torch.uint8), b["aux_hidden"].view(torch.uint8))
        assert torch.equal(a["target_scales"], b["target_scales"])
    r = run_cli("gc", str(dst), "--force")
    assert r.returncode == 0, r.stderr
    assert verify(Store.open(dst)).ok
    # the error recorded over the resumed units equals the error of the clean convert
    assert set(out["error"]) == set(clean.error) and clean.error
    for layer, e in clean.error.items():
        assert out["error"][layer]["rel_l2"] == pytest.approx(e.rel_l2, rel=1e-9)


def test_fp8_build_on_cpu_equals_converting_its_bf16_twin(tiny_store: Path, tmp_path: Path) -> None:
    """An FP8 build of the session store's manifest and rows (so the same batches) holds the codes and scales
    that converting the session store's bf16 variant gives, under the same variant id."""
    built_path = tmp_path / "built.zarr"
    r = run_cli(
        "build",
        str(tiny_store.parent / "m.toml"),
        "--store",
        str(built_path),
        "--dtype",
        "bf16",
        "--limit",
        "40",
        "--quiet",
        "--precision",
        "fp8-e4m3",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    conv = convert(f"{tiny_store}#dtype=bf16", "fp8-e4m3", dest=str(tmp_path / "conv.zarr"))
    built = HiddenStateDataset(built_path, raw=True)
    derived = HiddenStateDataset(tmp_path / "conv.zarr", raw=True)
    assert built.variant_id == conv.variant  # the source is informational: same numbers, same id
    assert sorted(built.keys) == sorted(derived.keys) and len(built.keys) == 40
    for k in built.keys:
        a, b = built[built.keys.index(k)], derived[derived.keys.index(k)]
        for role in ("aux", "target"):
            assert torch.equal(a[f"{role}_hidden"].view(torch.uint8), b[f"{role}_hidden"].view(torch.uint8))
            assert torch.equal(a[f"{role}_scales"], b[f"{role}_scales"])
    info = Store.open(built_path).reader(built.variant_id).quant_error()
    assert set(info) == {0, 1, 3} and all(e["tokens"] > 0 for e in info.values())


def test_raw_streaming_batches_pad_codes_and_scales(converted: Path) -> None:
    ds = StreamingHiddenStateDataset(converted, variant=FP8, raw=True, batch_tokens=1024, shuffle=False)
    batch = next(iter(ds))
    assert batch["aux_hidden"].dtype == torch.float8_e4m3fn and batch["aux_scales"].dtype == torch.float32
    B, T = batch["input_ids"].shape
    assert batch["aux_scales"].shape == (B, T, 2, 1) and batch["target_scales"].shape == (B, T, 1, 1)
    one = HiddenStateDataset(converted, variant=FP8, raw=True)[int(batch["index"][0])]
    n = one["input_ids"].shape[0]
    assert torch.equal(batch["aux_hidden"][0, :n].view(torch.uint8), one["aux_hidden"].view(torch.uint8))
    assert not batch["aux_hidden"][0, n:].view(torch.uint8).any()
    with pytest.raises(BadInput, match="raw=True reads FP8 codes and scales; variant .* read it without raw=True"):
        HiddenStateDataset(converted, variant="dtype=bf16", raw=True)


def test_a_damaged_scale_file_is_named_by_verify(converted: Path) -> None:
    fp8 = HiddenStateDataset(converted, variant=FP8)
    scale = sorted(p for p in converted.glob(f"variants/{fp8.variant_id}/units/*/scale_0/c/**/*") if p.is_file())[0]
    data = bytearray(scale.read_bytes())
    data[5] ^= 0xFF
    scale.write_bytes(bytes(data))
    v = verify(Store.open(converted))
    assert not v.ok and any("scale_0" in p.what or "crc32c" in p.what for p in v.problems)


def test_reads_bf16_says_what_read_layers_returns_for_every_kind_of_variant(converted_once: Path) -> None:
    """The diff warms its compiled loops for the dtypes read_layers will return before reading a sample
    (VariantReader.reads_bf16): bf16, fp32 and an FP8 variant dequantized to bf16 each answer as they read."""
    store = Store.open(converted_once)
    readers = [store.reader(v) for v in store.variant_ids()]
    assert {r.record.stored_precision is not None for r in readers} == {r.reads_bf16 for r in readers} == {True, False}
    for r in readers:
        key = r.keys[0]
        states = r.read_layers(r.refs[key], r.record.all_layers)
        assert r.reads_bf16 == all(s.dtype == torch.bfloat16 for s in states), (r.id, states[0].dtype)
