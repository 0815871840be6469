"""``hsstore plan``: tokens, bytes per variant and form, committed remainder, free space and time, checked
against the real builds it predicts; and ``hsstore build``'s refusal of a build its disk cannot hold."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, run_cli, run_main, write_manifest
from typer.testing import CliRunner

from hsstore.cli.main import app
from hsstore.core.flops import ASSUMED_MFU
from hsstore.testing.factories import config_toml, layers_toml

# the plan's bytes vs the build's, calibrated on every batch of the same model: what docs/plan.md states
TOLERANCE = 0.02


def _plan(*args: str) -> dict:
    r = CliRunner().invoke(app, ["plan", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _info(store: Path) -> dict:
    r = run_cli("info", str(store), "--json")
    assert r.returncode == 0, r.stderr
    return {v["dtype"]: v for v in json.loads(r.stdout)["variants"]}


def test_a_calibrated_plan_predicts_the_build_it_plans(attn_store: Path):
    """A session store's own manifest (tiny llama, sdpa; its bf16 variant), calibrated on every batch of its
    plan: the same tokens and units, bytes within TOLERANCE of what the build wrote, and every sample found
    committed in that variant (not in its eager twin: the attention asked for is matched)."""
    manifest = attn_store.parent / "sdpa.toml"
    r = run_cli("plan", str(manifest), "--limit", "40", "--dtype", "bf16", "--calibrate", "1000", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    built = {
        v["dtype"]: v
        for v in json.loads(run_cli("info", str(attn_store), "--json").stdout)["variants"]
        if v["provenance"]["environment"]["kernels"]["attention"] == "sdpa"
    }
    assert plan["calibration_batches"] == plan["batches"] > 1 and plan["tokens"]["samples"] == 40
    assert [v["dtype"] for v in plan["variants"]] == ["bf16"]
    for v in plan["variants"]:
        real = built[v["dtype"]]
        assert v["tokens"] == real["n_tokens"] and v["units"] == real["n_units"], (v, real)
        assert abs(v["bytes"] / real["bytes"] - 1) <= TOLERANCE, (v["dtype"], v["bytes"], real["bytes"])
        assert v["ratio"]["measured"] and v["committed_variant"] == real["id"]
        assert v["committed_samples"] == 40 and v["remaining_bytes"] == 0
        assert v["tokens_per_second"] > 0 and v["seconds"] == 0 and "measured" in v["seconds_source"]
    assert plan["space"]["local"] and plan["space"]["fits"] and plan["space"]["needed_bytes"] == 0


def test_plan_of_the_tiny_manifest_prints_tokens_bytes_space_and_time(tmp_path: Path):
    store = tmp_path / "t.zarr"
    r = CliRunner().invoke(
        app, ["plan", str(REPO / "manifests" / "tiny.toml"), "--store", str(store), "--peak-tflops", "1"]
    )
    assert r.exit_code == 0, r.output
    text = r.output
    for what in (
        "tokens: ",
        "variant torch/bf16/cpu stored bf16/shuffle-zstd",
        "variant torch/fp32/cpu",
        "fp8-e4m3/zstd",
        "free; the build needs",
        "time: ",
        "nothing committed",
    ):
        assert what in text, (what, text)
    assert "unknown" not in text.split("time: ")[1].split(" for ")[0], text
    assert not store.exists(), "planning made the store"


def test_a_sampled_plan_brackets_the_counted_tokens(tmp_path: Path):
    m = write_manifest(tmp_path / "m.toml", store=str(tmp_path / "s.zarr"))
    full, part = _plan(str(m)), _plan(str(m), "--sample", "60")
    t = part["tokens"]
    assert t["sampled_rows"] == 60 and full["tokens"]["sampled_rows"] is None
    assert t["tokens_low"] <= full["tokens"]["tokens"] <= t["tokens_high"], (t, full["tokens"])
    assert part["inputs"]["rows"] == 60


def test_plan_of_a_27b_shaped_builtin_states_bf16_and_fp8_sizes_and_an_assumed_time(tmp_path: Path):
    """27B shape on a machine without its GPU: nothing is instantiated, the bf16 default codec and FP8 sizes
    follow from tokens x hidden x bytes / ratio, and the time rests on the stated MFU of an H200's peak."""
    import resource

    m = write_manifest(
        tmp_path / "m.toml",
        layers=layers_toml("27b"),
        extra_model=config_toml("27b"),
        store=str(tmp_path / "s.zarr"),
        max_length=512,
    )
    m.write_text(m.read_text().replace('devices = ["cpu"]', 'devices = ["cuda"]'))
    plan = _plan(str(m), "--limit", "24")
    (v,) = plan["variants"]
    tokens, hidden = plan["tokens"]["tokens"], plan["hidden_size"]
    assert hidden == 5120 and plan["layers"] == [1, 16, 31, 46, 61]
    forms = {f["form"]: f for f in plan["forms"]}
    for form, itemsize in (("bf16", 2), ("fp8-e4m3", 1)):
        f = forms[form]
        states = tokens * hidden * itemsize / f["ratio"]["value"] * len(plan["layers"])
        assert states <= f["bytes"] <= states * 1.05 + 100_000, (form, f, states)
    assert v["form"] == "bf16" and v["codec"] == "shuffle-zstd" and v["bytes"] == forms["bf16"]["bytes"]
    assert forms["fp8-e4m3"]["bytes"] < v["bytes"] / 1.5
    assert v["mfu"] == ASSUMED_MFU and v["seconds"] > 0 and "assumed" in v["seconds_source"]
    assert plan["space"]["local"] and plan["space"]["free_bytes"] > 0
    # two FLOPs per weight: the bf16 weights of the layers run would take flops_per_token bytes
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert peak_rss < plan["flops_per_token"] / 4, "planning instantiated the 27B weights"
    r = CliRunner().invoke(app, ["plan", str(m), "--limit", "24", "--precision", "fp8-e4m3"])
    assert r.exit_code == 0, r.output
    for what in ("tokens: ", "variant torch/bf16/cuda stored fp8-e4m3/zstd", "time: ", "MFU 0.46", "free;"):
        assert what in r.output, (what, r.output)


@pytest.mark.process
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (user namespaces) for a small tmpfs")
def test_a_build_its_filesystem_cannot_hold_is_refused_before_any_model_loads(tmp_path: Path):
    """A real 64 KiB tmpfs (mounted in a user namespace, no root needed): the build exits 2 with one line
    naming the numbers and the fix, and leaves the filesystem empty — no store, no worker, no model. With
    --no-space-check it starts, and stops on the full disk as before (exit 1, nothing committed)."""
    small = tmp_path / "small"
    small.mkdir()
    m = write_manifest(tmp_path / "m.toml", store=str(small / "s.zarr"))
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not allowed here: {probe.stderr.decode().strip()}")
    build = f"{sys.executable} -m hsstore build {m} --limit 2"  # not quiet: its status lines name each phase
    script = (
        f"mount -t tmpfs -o size=64k none {small} && {build}; echo rc=$?; ls -A {small}; echo ---; "
        f"{build} --no-space-check; echo rc=$?"
    )
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, cwd=REPO)
    refused, forced = r.stdout.split("---")
    assert refused.strip() == "rc=2", (r.stdout, r.stderr)  # nothing listed: the filesystem is empty
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, r.stderr
    assert "free; free space" in errors[0] and "--no-space-check" in errors[0], errors[0]
    before, after = r.stderr.split(errors[0])
    loading = "torch/bf16/cpu: loading the model"
    assert loading not in before and loading in after, "a model was loaded before the refusal"
    assert forced.strip() == "rc=1" and "No space left on device" in errors[1], (r.stdout, errors[1])


def _under_file_size_limit(limit: int, *args: str) -> subprocess.CompletedProcess:
    """``hsstore ARGS`` in a real process whose file-size limit (RLIMIT_FSIZE) is ``limit`` bytes (SIGXFSZ
    ignored, as a shell's ``ulimit -f`` with a trap would: writes past it fail with EFBIG)."""
    import resource
    import signal

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "hsstore", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=apply,
    )


@pytest.mark.process
def test_plan_and_build_take_the_file_size_limit_like_free_space(tmp_path: Path):
    """`ulimit -f 64`: plan said "fits" and the build then failed with "File too large". The largest file the
    build writes is held against the process's file-size limit as its bytes are against free space: plan
    says it does not fit, naming the limit and the fix, and the build refuses before any model loads."""
    m = str(write_manifest(tmp_path / "m.toml", store=str(tmp_path / "s.zarr")))
    free = _plan(m, "--limit", "40")
    largest = free["space"]["largest_file_bytes"]
    assert free["space"]["fits"] and largest > 0 and free["space"]["file_size_limit"] is None, free["space"]
    limit = largest // 2  # (a multiple of 1024, as ulimit -f sets it in KiB)
    limit -= limit % 1024
    r = _under_file_size_limit(limit, "plan", m, "--limit", "40")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("space:"))
    assert "does NOT fit" in line and "file-size limit" in line and "ulimit -f" in line, line
    assert f"{limit // 1024} KiB" in line or f"{limit:,}" in line or str(limit) in line, line
    r = _under_file_size_limit(limit, "plan", m, "--limit", "40", "--json")
    space = json.loads(r.stdout)["space"]
    assert space["fits"] is False and space["file_size_limit"] == limit and space["largest_file_bytes"] == largest
    r = _under_file_size_limit(limit, "build", m, "--limit", "40")
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and "file-size limit" in errors[0], r.stderr[-2000:]
    assert "loading the model" not in r.stderr and not (tmp_path / "s.zarr").exists(), r.stderr[-2000:]


def test_a_resumed_build_plans_only_its_remainder(tiny_store: Path):
    """60 rows into the session store that holds the first 40: those are found committed (by key, in the
    variant of the same recipe and environment), and only the rest is left to write."""
    plan = _plan(str(tiny_store.parent / "m.toml"), "--limit", "60")
    built = _info(tiny_store)
    for v in plan["variants"]:
        assert v["committed_variant"] == built[v["dtype"]]["id"] and v["committed_samples"] == 40, v
        assert v["committed_tokens"] == built[v["dtype"]]["n_tokens"]
        assert 0 < v["remaining_bytes"] < v["bytes"], v
    assert plan["space"]["needed_bytes"] >= sum(v["remaining_bytes"] for v in plan["variants"])


def test_plan_refuses_sample_with_limit_and_calibration_on_an_absent_gpu(tmp_path: Path, capsys):
    import torch

    m = str(write_manifest(tmp_path / "m.toml", store=str(tmp_path / "s.zarr")))
    code, err = run_main(["plan", m, "--sample", "10", "--limit", "5"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--sample and --limit" in err, err
    if torch.cuda.is_available():
        return
    code, err = run_main(["plan", m, "--device", "cuda", "--calibrate", "1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "no CUDA GPU is visible" in err, err


def test_a_whole_sample_is_the_total_and_a_part_brackets_it():
    from hsstore.core.flops import sample_indices, total_from_sample

    values = [float((7 * i) % 13) for i in range(200)]
    whole = total_from_sample(values, len(values))
    assert whole.estimate == whole.low == whole.high == sum(values)
    part = total_from_sample([values[i] for i in sample_indices(len(values), 80, seed=1)], len(values))
    assert part.low < sum(values) < part.high and part.low < part.estimate < part.high


def test_plan_counts_the_replies_truncation_drops_as_the_build_does(tmp_path: Path):
    """The plan's inputs line says what the build's summary says: how many trained replies the cut at
    max_length drops whole."""
    turns = [{"role": r, "content": f"{r} turn {i} " + "word " * 8} for i in range(6) for r in ("user", "assistant")]
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": turns}) + "\n")
    m = write_manifest(tmp_path / "m.toml", files=[str(data)], store=str(tmp_path / "s.zarr"), max_length=160)
    dropped = _plan(str(m))["inputs"]["replies_dropped"]
    assert dropped > 0
    r = CliRunner().invoke(app, ["plan", str(m)])
    assert r.exit_code == 0, r.output
    said = f"1 truncated ({dropped} replies dropped whole: raise [data] max_length to keep them)"
    assert said in r.output.splitlines()[1], r.output


def test_an_uncalibrated_plan_of_a_fresh_store_probes_the_model_within_its_stated_error(
    tiny_store: Path, tmp_path: Path
):
    """No --calibrate, a store with nothing in it: the plan runs a batch of its own through the (small)
    model per dtype to measure the codec, and its bytes land within the expected error it states of what
    the build wrote. Before, it assumed 1.42x for bf16 and no compression for fp32 (15-58 % high)."""
    plan = _plan(str(tiny_store.parent / "m.toml"), "--limit", "40", "--store", str(tmp_path / "fresh.zarr"))
    built = _info(tiny_store)
    for v in plan["variants"]:
        err = v["ratio"]["expected_error"]
        assert v["committed_variant"] is None and "probed" in v["ratio"]["source"] and err is not None, v["ratio"]
        assert abs(v["bytes"] / built[v["dtype"]]["bytes"] - 1) <= err, (v["dtype"], v["bytes"], built[v["dtype"]])


def test_an_uncalibrated_plan_uses_the_ratio_a_variant_on_disk_reached(tiny_store: Path, tmp_path: Path):
    """A store holding a 24-sample build of the same model and form (over half the planned tokens): the plan
    of 40 samples sizes them with the ratios those committed files reach (no model is run) and lands within
    its stated error of the real 40-sample build."""
    m = write_manifest(tmp_path / "m.toml", dtypes='["bf16", "fp32"]', layers="{ aux = [0, 1], target = [3] }")
    r = run_cli("build", str(m), "--limit", "24", "--quiet")
    assert r.returncode == 0, r.stderr
    plan = _plan(str(m), "--limit", "40")
    built = _info(tiny_store)
    for v in plan["variants"]:
        assert "committed tokens of variant" in v["ratio"]["source"] and v["ratio"]["measured"], v["ratio"]
        assert abs(v["bytes"] / built[v["dtype"]]["bytes"] - 1) <= v["ratio"]["expected_error"], (
            v["dtype"],
            v["bytes"],
            built[v["dtype"]]["bytes"],
        )


def test_a_calibration_times_every_batch_it_says_and_the_encoding_per_dtype(tiny_store: Path, tmp_path: Path):
    """--calibrate 2 times 2 batches (the warm-up is an extra, untimed forward), and the time includes
    encoding each dtype's own states (fp32 has twice the bytes to compress). Before, the first of the N
    batches was the untimed warm-up ("1 timed batch(es)" for --calibrate 2) and only the forward counted."""
    plan = _plan(
        str(tiny_store.parent / "m.toml"), "--limit", "40", "--calibrate", "2", "--store", str(tmp_path / "fresh.zarr")
    )
    assert plan["batches"] > 2 and plan["calibration_batches"] == 2
    for v in plan["variants"]:
        assert "2 timed batch(es) after a warm-up" in v["seconds_source"], v["seconds_source"]
        assert f"encoding {v['dtype']}" in v["seconds_source"] and v["seconds"] > 0
