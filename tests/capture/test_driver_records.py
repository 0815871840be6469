"""The build's records (worker plan, worker outcome, build result) and its pure share planner, directly."""

from __future__ import annotations

import json
import shutil

import pytest

from hsstore.capture.run.driver import share
from hsstore.core.batching import token_budget_batches
from hsstore.core.errors import BuildFailed, CorruptData
from hsstore.core.schema.build import BuildResult, WorkerOutcome, WorkerPlan

RECIPE = {
    "model": {"name": "builtin:tiny-llama", "path": "builtin:tiny-llama", "hidden_size": 64, "num_layers": 4},
    "tokenizer": {"fingerprint": "t"},
    "layers": {"aux": [1], "target": [2]},
}
PLAN = {
    "backend": "torch",
    "store": "/s.zarr",
    "recipe": RECIPE,
    "model": {
        "path": "builtin:tiny-llama",
        "config_overrides": {},
        "seed": 0,
        "trust_remote_code": False,
        "init_device": "cpu",
    },
    "weight_stamps": {"model.safetensors": {"dev": 1, "ino": 2, "size": 3, "mtime_ns": 4, "ctime_ns": 5}},
    "samples_file": "/t/samples.npz",
    "batches": [[0, 1], [2]],
    "runs": [["bf16", "cpu"]],
    "attn_implementation": "sdpa",
    "token_budget": 2048,
    "unit_tokens": None,
    "codec": "zstd",
    "allow_unhealthy": False,
    "pad_id": 0,
    "writer_prefix": "r0-",
    "quiet": True,
    "result": "/t/r.json",
    "progress": "/t/v",
    "parent_pid": 1,
    "precision": None,
    "label": None,
    "another_model": None,
}


def test_worker_plan_round_trips_and_refuses_wrong_types():
    plan = WorkerPlan.from_json(json.dumps(PLAN).encode(), "plan")
    assert plan.to_dict() == {**PLAN, "runs": [("bf16", "cpu")]} and plan.runs == [("bf16", "cpu")]
    assert json.loads(json.dumps(plan.to_dict())) == PLAN
    bad = {**PLAN, "allow_unhealthy": "false"}  # a string is never a boolean
    with pytest.raises(CorruptData, match=r"plan: allow_unhealthy = 'false': expected a boolean"):
        WorkerPlan.from_json(json.dumps(bad).encode(), "plan")
    with pytest.raises(BuildFailed, match="unknown key 'extra'"):
        WorkerPlan.from_dict({**PLAN, "extra": 1}, "plan", BuildFailed)


def test_worker_outcome_is_results_or_an_error():
    assert WorkerOutcome.from_json(b'{"error": "boom", "exit_code": 2}', "r").exit_code == 2
    with pytest.raises(CorruptData, match="is not valid JSON"):  # a worker killed mid-write
        WorkerOutcome.from_json(b'{"results": [', "r")


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_share_gives_every_sample_to_one_rank_in_whole_global_batches(world: int, seed: int):
    import random

    rng = random.Random(seed)
    lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 60))]
    global_batches = {tuple(sorted(b)) for b in token_budget_batches(lengths, 512)}
    seen: list[int] = []
    for rank in range(world):
        mine, batches = share(lengths, 512, rank, world)
        assert sorted(i for b in batches for i in b) == list(range(len(mine)))  # local indices, each once
        assert all(tuple(sorted(mine[i] for i in b)) in global_batches for b in batches)  # whole global batches
        seen += mine
    assert sorted(seen) == list(range(len(lengths)))  # every sample on exactly one rank


def test_build_result_keeps_the_documented_keys(tiny_store, tmp_path):
    from helpers import run_cli

    shutil.copytree(tiny_store.parent, tmp_path / "tiny")  # a rerun appends build records: not in the shared store
    r = run_cli("build", str(tmp_path / "tiny" / "m.toml"), "--limit", "40", "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    BuildResult.from_dict(out, "build --json")  # strict: every key typed, none unknown
    assert {"store", "rank", "world_size", "inputs", "variants", "complete", "seconds"} <= set(out)
    assert {"rows", "usable", "truncated", "duplicates", "rejected"} <= set(out["inputs"])
    documented = {
        "variant",
        "backend",
        "dtype",
        "device",
        "kernels",
        "samples_written",
        "samples_present",
        "tokens",
        "bytes",
        "seconds",
        "loop_seconds",
        "tokens_per_second",
        "writer_busy_seconds",
        "first_batch_seconds",
        "tail_seconds",
        "pinned_alloc_seconds",
        "steady_tokens",
        "steady_seconds",
        "peak_gpu_memory_gb",
    }
    assert len(out["variants"]) == 2 and all(documented <= set(v) for v in out["variants"])


def test_a_build_stopped_before_any_variant_says_nothing_was_committed():
    from hsstore.capture.run.driver import Context

    msg = Context("/s.zarr", 0, 1, ["cpu"]).stopped("SIGINT")
    assert msg == (
        "interrupted by SIGINT before any variant was written; nothing was committed — run the same "
        "command again to build"
    )


def test_a_rebuild_after_a_row_was_fixed_says_the_variant_still_holds_the_old_sample(tmp_path):
    """A variant keeps every sample committed to it: a row corrected (or removed) since the last build leaves that
    build's sample in the variant, which readers read too. The build says how many samples are not among its
    inputs (it said "1 samples written, 7 already present" and nothing else)."""
    from helpers import run_cli, write_manifest

    rows = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"Question {i}?"},
                    {"role": "assistant", "content": f"Answer {i}."},
                ]
            }
        )
        for i in range(5)
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(rows) + "\n")
    m = write_manifest(tmp_path / "m.toml", model="builtin:tiny-llama", files=[str(data)])
    first = json.loads(run_cli("build", str(m), "--quiet", "--json").stdout)
    (vid,) = first["complete"]
    assert first["samples_not_in_inputs"] == {vid: 0}
    data.write_text("\n".join(rows[:2] + [rows[2].replace("Answer 2.", "Answer two, corrected.")] + rows[3:]) + "\n")
    r = run_cli("build", str(m), "--quiet")
    assert r.returncode == 0, r.stderr
    assert f"variant {vid} also holds 1 committed sample(s) not among these inputs" in r.stdout, r.stdout
    again = json.loads(run_cli("build", str(m), "--quiet", "--json").stdout)
    assert again["samples_not_in_inputs"] == {vid: 1} and again["variants"][0]["samples_present"] == 5
