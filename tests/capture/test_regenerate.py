"""Regeneration (issue 39): the target writes the replies, then hsstore captures them, with a ledger per reply.

Builds of the tiny builtin Llama on the CPU: the loss mask covers exactly the generated tokens, each reply has
a ledger record, a re-run (or a run after kill -9 mid-generation) generates nothing already generated, greedy
regeneration is reproducible bit for bit, and a dataset requiring the data's own replies refuses regenerated
ones unless allowed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import DATA, kill_build, run_cli, start_build, wait_for, write_manifest

from hsstore.core.errors import ProvenanceMismatch
from hsstore.read.dataset import HiddenStateDataset
from hsstore.storage.store import Store

GENERATE = """
[generate]
engine = "model"
max_new_tokens = {tokens}
{extra}
"""


def regen_manifest(
    d: Path,
    *,
    tokens: int = 6,
    extra: str = "",
    budget: int = 2048,
    store: str = "store.zarr",
    files: list[str] | None = None,
) -> Path:
    p = write_manifest(d / "m.toml", model="builtin:tiny-llama", dtypes='["fp32"]', store=store, files=files)
    text = p.read_text().replace("token_budget = 2048", f"token_budget = {budget}")
    p.write_text(text + GENERATE.format(tokens=tokens, extra=extra))
    return p


def build_json(manifest: Path, *args: str) -> dict:
    r = run_cli("build", str(manifest), "--quiet", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def lineage(store: Path, build_id: str) -> tuple[list[dict], dict[str, dict]]:
    """The build's ledger, and every checkpointed reply of the store by its key."""
    ledger = [json.loads(x) for x in (store / "builds" / build_id / "ledger.jsonl").read_text().splitlines()]
    replies = {}
    for f in (store / "builds").glob("*/gen-*.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            replies[r["key"]] = r
    return ledger, replies


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("regen")
    summary = build_json(regen_manifest(d), "--limit", "4")
    return d, summary


def test_generated_replies_are_masked_exactly_and_each_has_a_ledger_record(regenerated: tuple[Path, dict]) -> None:
    d, summary = regenerated
    assert summary["replies_generated"] == 4 and summary["replies_reused"] == 0
    ledger, replies = lineage(d / "store.zarr", summary["build_id"])
    assert len(ledger) == 4
    ds = HiddenStateDataset(str(d / "store.zarr"))
    items = {ds[i]["key"]: ds[i] for i in range(len(ds))}
    assert sorted(items) == sorted(r["sample_key"] for r in ledger)
    generated = {tuple(r["ids"]) for r in replies.values()}
    for rec in ledger:
        assert rec["engine"] == "model" and "transformers" in rec["engine_version"]
        assert rec["finish_reason"] in ("stop", "length") and rec["seed"] == 0
        assert rec["sampling"]["temperature"] == 0.0 and rec["sampling"]["max_new_tokens"] == 6
        item = items[rec["sample_key"]]
        ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
        assert len(ids) == rec["prompt_tokens"] + rec["reply_tokens"]
        # the mask is exactly the generated tokens: zeros over the prompt, ones over the reply
        assert mask == [False] * rec["prompt_tokens"] + [True] * rec["reply_tokens"]
        assert tuple(ids[rec["prompt_tokens"] :]) in generated
    gen = ds.provenance["recipe"]["generation"]
    assert gen["engine"] == "model" and gen["turns"] == "last" and gen["max_new_tokens"] == 6
    info = json.loads(run_cli("info", str(d / "store.zarr"), "--json").stdout)["generations"]
    assert [(g["build_id"], g["replies"], g["reply_tokens"]) for g in info] == [
        (summary["build_id"], 4, sum(r["reply_tokens"] for r in ledger))
    ]


def test_each_reply_records_the_kernels_generate_called_and_info_shows_them(tmp_path: Path) -> None:
    """The replies are the data a drafter learns from, and fla against its torch fallback can change which token
    greedy decoding picks: each reply (checkpoint and ledger) records the kernels its engine calls in the build's
    process, as a capture records its own, and ``info`` names them."""
    import torch

    from hsstore.capture.generate.engines import LocalEngine
    from hsstore.capture.model.spec import ModelSpec

    plain = write_manifest(tmp_path / "m.toml", model="builtin:tiny-qwen3_5", dtypes='["fp32"]')
    summary = build_json(plain, "--limit", "2", "--engine", "model", "--max-new-tokens", "2")
    spec = ModelSpec("builtin:tiny-qwen3_5")  # what the engine records (checked against the calls below)
    want = LocalEngine(spec.load(torch.float32, "cpu", None), spec.tokenizer(), 0, 4096).kernels
    assert want["chunk_gated_delta_rule"] not in ("n/a", "unknown")  # a hybrid: the families that differ are there
    ledger, replies = lineage(tmp_path / "store.zarr", summary["build_id"])
    assert len(ledger) == 2 and all(r["kernels"] == want for r in [*ledger, *replies.values()])
    line = " ".join(f"{k}={v}" for k, v in want.items())
    info = json.loads(run_cli("info", str(tmp_path / "store.zarr"), "--json").stdout)["generations"]
    assert [g["kernels"] for g in info] == [[line]]
    assert f"kernels: {line}" in run_cli("info", str(tmp_path / "store.zarr")).stdout


@pytest.mark.parametrize("attention", [None, "eager"])
def test_the_recorded_kernels_cover_every_kernel_function_generate_calls(
    attention: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked against the calls, not against the recording function: every gated-delta and conv function the
    modeling module defines that generate calls (the prompt's forward, then each decoding step's recurrent rule
    and conv update) is recorded under its family with what it is, and the attention is the one that ran."""
    import torch

    from hsstore.capture.generate.engines import LocalEngine
    from hsstore.capture.model.kernels import DECODE_FAMILIES, FAMILIES, installed
    from hsstore.capture.model.spec import ModelSpec

    spec = ModelSpec("builtin:tiny-qwen3_5")
    engine = LocalEngine(spec.load(torch.float32, "cpu", attention), spec.tokenizer(), 0, 4096)
    module = __import__(type(engine.model).__module__, fromlist=["_"])
    family_of = {n: f for f, names in {**FAMILIES, **DECODE_FAMILIES}.items() for n in names}
    called: set[str] = set()

    def recording(name: str, fn):
        return lambda *a, **k: called.add(name) or fn(*a, **k)

    for name in family_of:
        if callable(getattr(module, name, None)):
            monkeypatch.setattr(module, name, recording(name, getattr(module, name)))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: called.add("sdpa") or sdpa(*a, **k)
    )

    class Greedy:
        max_new_tokens, temperature, top_p, top_k, stop, seed = 4, 0.0, 1.0, 0, (), 0

    engine.batch([[5, 6, 7, 8], [9, 10, 11]], Greedy, [0, 0])
    kernels = {family_of[n] for n in called if n in family_of}
    assert {"chunk_gated_delta_rule", "recurrent_gated_delta_rule"} <= kernels  # the prompt, then the steps
    assert all(engine.kernels.get(f) not in (None, "unknown", "n/a") for f in kernels), (kernels, engine.kernels)
    if not installed("fla") and not installed("causal_conv1d"):  # (this machine) transformers' torch code ran
        assert all(engine.kernels[f] == "torch" for f in kernels), engine.kernels
    assert engine.kernels["attention"] == ("sdpa" if "sdpa" in called else "eager") == (attention or "sdpa")


def test_build_options_turn_regeneration_on(tmp_path: Path) -> None:
    """``hsstore build --engine model --max-new-tokens N`` regenerates a manifest without [generate]."""
    plain = write_manifest(tmp_path / "m.toml", model="builtin:tiny-llama", dtypes='["fp32"]')
    summary = build_json(plain, "--limit", "2", "--engine", "model", "--max-new-tokens", "3")
    ledger, _ = lineage(tmp_path / "store.zarr", summary["build_id"])
    assert len(ledger) == 2 and all(r["reply_tokens"] <= 3 and r["sampling"]["max_new_tokens"] == 3 for r in ledger)
    r = run_cli("build", str(plain), "--engine", "model", "--turns", "every")
    assert r.returncode == 2 and "turns = 'every'" in r.stderr


def test_a_rerun_generates_nothing_and_greedy_is_reproducible_bit_for_bit(
    regenerated: tuple[Path, dict], tmp_path: Path
) -> None:
    d, first = regenerated
    again = build_json(regen_manifest(d), "--limit", "4")
    assert again["replies_generated"] == 0 and again["replies_reused"] == 4
    assert again["variants"][0]["samples_present"] == 4 and again["variants"][0]["samples_written"] == 0
    # a fresh store, the same manifest: the same tokens, the same sample keys
    fresh = build_json(regen_manifest(tmp_path), "--limit", "4")
    assert fresh["replies_generated"] == 4
    a, ra = lineage(d / "store.zarr", first["build_id"])
    b, rb = lineage(tmp_path / "store.zarr", fresh["build_id"])
    assert [r["sample_key"] for r in a] == [r["sample_key"] for r in b]
    assert {k: v["ids"] for k, v in ra.items()} == {k: v["ids"] for k, v in rb.items()}
    assert first["variants"][0]["variant"] == fresh["variants"][0]["variant"]


def test_require_of_the_datas_replies_refuses_regenerated_ones_unless_allowed(
    regenerated: tuple[Path, dict], tmp_path: Path
) -> None:
    d, _ = regenerated
    plain = write_manifest(tmp_path / "m.toml", model="builtin:tiny-llama", dtypes='["fp32"]')
    r = run_cli("build", str(plain), "--quiet", "--limit", "2")
    assert r.returncode == 0, r.stderr
    original = HiddenStateDataset(str(tmp_path / "store.zarr"))
    with pytest.raises(ProvenanceMismatch, match="generation"):
        HiddenStateDataset(str(d / "store.zarr"), require=original)
    assert len(HiddenStateDataset(str(d / "store.zarr"), require=original, allow_drift=["generation"])) == 4


@pytest.mark.parametrize(
    "extra, says",
    [
        ("temprature = 0.5", "unknown key(s) ['temprature'] in [generate]"),
        ('engine = "openai"', "needs url"),
        ('engine = "vllm"', "engine = 'vllm'"),
        ('turns = "first"', "turns = 'first'"),
        ("n = 2", "identical replies"),
    ],
)
def test_a_bad_generate_table_is_one_line_and_exit_2(tmp_path: Path, extra: str, says: str) -> None:
    text = regen_manifest(tmp_path).read_text().replace('engine = "model"\n', "") + extra + "\n"
    (tmp_path / "m.toml").write_text(text)
    r = run_cli("build", str(tmp_path / "m.toml"))
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not (tmp_path / "store.zarr").exists()


def test_rows_dropped_for_cut_replies_are_named(tmp_path: Path) -> None:
    """``drop_cut``: a reply cut at max_new_tokens is not captured and rows.jsonl names its row; a stop string
    ends a reply ("stop"). The random model's replies start with byte tokens, so a stop string of one
    control character ends some and not others (what each did is read from the first build's ledger)."""
    extra = 'stop = ["\\u0002"]'
    kept = build_json(regen_manifest(tmp_path, extra=extra), "--limit", "8")
    first, _ = lineage(tmp_path / "store.zarr", kept["build_id"])
    cut = {r["row"] for r in first if r["finish_reason"] == "length"}
    assert cut and len(cut) < len(first), "the stop string should end some replies and not others"
    summary = build_json(regen_manifest(tmp_path, extra=extra + "\ndrop_cut = true"), "--limit", "8")
    assert summary["replies_generated"] == 0  # dropping is decided after generating: the replies are reused
    ledger, _ = lineage(tmp_path / "store.zarr", summary["build_id"])
    assert {r["row"] for r in ledger if r["sample_key"] is None} == cut
    rows = [
        json.loads(x)
        for x in (tmp_path / "store.zarr" / "builds" / summary["build_id"] / "rows.jsonl").read_text().splitlines()
    ]
    assert {r["row"] for r in rows if r["reason"] == "reply cut at max_new_tokens"} == cut
    assert summary["inputs"]["usable"] == len(first) - len(cut)


@pytest.mark.process
def test_kill_9_mid_generation_then_rerun_generates_nothing_already_generated(tmp_path: Path) -> None:
    """A build killed while generating: its checkpointed batches are reused, only the rest is generated."""
    rows = [json.loads(x) for x in DATA.read_text().splitlines()][:40]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = regen_manifest(tmp_path, tokens=24, budget=300, files=[str(data)])  # a few prompts a batch: many batches
    proc = start_build(m)
    parts = lambda: sorted((tmp_path / "store.zarr" / "builds").glob("*/gen-*.jsonl"))  # noqa: E731
    wait_for(lambda: len(parts()) >= 2 or proc.poll() is not None, 300, "two checkpointed batches")
    kill_build(proc)
    assert not list((tmp_path / "store.zarr").glob("variants/*/commits/*.json")), "killed before any capture"
    done = {json.loads(x)["key"] for f in parts() for x in f.read_text().splitlines()}
    assert 0 < len(done) < 40
    summary = build_json(m)
    assert summary["replies_reused"] == len(done)
    ledger, _ = lineage(tmp_path / "store.zarr", summary["build_id"])
    new = [r for r in ledger if r["generated_by"] == summary["build_id"]]
    assert summary["replies_generated"] == len(new) == len(ledger) - len(done)
    mine = (tmp_path / "store.zarr" / "builds" / summary["build_id"]).glob("gen-*.jsonl")
    assert not done & {json.loads(x)["key"] for f in mine for x in f.read_text().splitlines()}


def _runs(mask: list[bool]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def test_all_turns_are_regenerated_in_order_each_conditioned_on_the_earlier_ones(tmp_path: Path) -> None:
    """``turns = "all"``: every assistant turn is regenerated (a prompt row gets one appended), a later turn's prompt
    holding the regenerated text of the earlier ones; the sample is the last turn's prompt, as the target saw it,
    then its reply's tokens exactly, and an earlier reply is masked only on tokens the target generated."""
    lines = DATA.read_text().splitlines()
    multi = [
        x
        for x in lines
        if sum(
            m.get("role", m.get("from")) in ("assistant", "gpt")
            for m in (json.loads(x).get("messages") or json.loads(x)["conversations"])
        )
        == 2
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join([multi[0], json.dumps({"messages": [{"role": "user", "content": "Say hi."}]})]) + "\n")
    m = regen_manifest(tmp_path, extra='turns = "all"', files=[str(data)])
    m.write_text(m.read_text().replace("max_length = 256", "max_length = 1024"))
    summary = build_json(m)
    ledger, replies = lineage(tmp_path / "store.zarr", summary["build_id"])
    assert [(r["row"], r["turn"]) for r in ledger] == [(1, 0), (1, 1), (2, 0)]
    assert ledger[1]["prompt_tokens"] > ledger[0]["prompt_tokens"] + ledger[0]["reply_tokens"]
    ds = HiddenStateDataset(str(tmp_path / "store.zarr"))
    items = {ds[i]["key"]: ds[i] for i in range(len(ds))}
    for key in {r["sample_key"] for r in ledger}:
        item, recs = items[key], [r for r in ledger if r["sample_key"] == key]
        runs = _runs(item["loss_mask"].tolist())
        ids = item["input_ids"].tolist()
        made = [v["ids"] for v in replies.values() if any(v["prompt_tokens"] == r["prompt_tokens"] for r in recs)]
        assert len(made) == len(recs)
        # the last reply is the target's tokens exactly, after the prompt it saw: never re-tokenized text, nor an
        # end-of-turn token after a reply cut at max_new_tokens (what the target never emitted)
        last = [v for v in replies.values() if v["prompt_tokens"] == recs[-1]["prompt_tokens"]][0]
        assert runs and runs[-1] == (recs[-1]["prompt_tokens"], len(ids)) and ids[runs[-1][0] :] == last["ids"]
        for a, b in runs[:-1]:  # an earlier reply is masked only where its tokens are the ones generated
            assert any(ids[a:b] == g[: b - a] and b - a == len(g) for g in made), (ids[a:b], made)


def test_earlier_replies_are_masked_only_on_the_tokens_the_target_generated() -> None:
    """turns = "all" renders earlier replies as text for the later turns' prompts; their masks stay only where
    that text came back as the generated tokens, and the end-of-turn token only where the target emitted it."""
    from hsstore.capture.generate.prompts import Job, _exact_only

    end = 9
    reply = lambda ids: type("R", (), {"ids": ids})()  # noqa: E731 (a ledger Reply's ids are all that is read)
    job = Job("f", 1, [], None, [1, 3, 5], 0, replies=[reply([4, 5, end]), reply([6, 7]), reply([8])])
    context = [1, 2, 4, 5, end, 3, 6, 7, end, 3]
    mask = [0, 0, 1, 1, 1, 0, 1, 1, 1, 0]
    assert _exact_only(context, mask, job, [end]) == [0, 0, 1, 1, 1, 0, 1, 1, 0, 0]  # the cut reply's end: unmasked
    changed = [1, 2, 4, 6, end, 3, 6, 7, end, 3]  # the first reply's text came back as other tokens
    assert _exact_only(changed, mask, job, [end]) == [0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    assert _exact_only(context, [0, 0, 1, 1, 1, 1, 1, 1, 1, 0], job, [end]) == [0] * 10  # runs merged: none kept
    other_end = 10  # the target ended with another of its end tokens than the template closes the turn with
    job.replies[0] = reply([4, 5, other_end])
    assert _exact_only(context, mask, job, [end, other_end]) == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0]


def test_plan_estimates_generated_tokens_and_time(tmp_path: Path) -> None:
    m = regen_manifest(tmp_path, tokens=5)
    r = run_cli("plan", str(m), "--limit", "3", "--json")
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)["generation"]
    assert (g["prompts"], g["replies"], g["max_generated_tokens"]) == (3, 3, 15)
    assert 0 < g["expected_generated_tokens"] <= 15 and g["seconds"] is None
    r = run_cli("plan", str(m), "--limit", "3", "--json", "--calibrate", "1")
    g = json.loads(r.stdout)["generation"]
    assert g["generated_tokens_per_second"] > 0 and g["first_batch_extra_seconds"] >= 0
    assert g["seconds"] == pytest.approx(
        g["expected_generated_tokens"] / g["generated_tokens_per_second"] + g["first_batch_extra_seconds"]
    )
    assert not (tmp_path / "store.zarr").exists()  # a plan generates nothing into the store


def test_plan_calibrates_generation_on_a_batch_as_the_build_forms_it(tmp_path: Path) -> None:
    """The rate comes from the build's own first batch (every prompt the token budget holds), not from a few
    prompts: batched decoding's throughput grows with the batch (8 prompts measured a 100-prompt GPU build
    at a seventh of its speed). The batch count is the engine's own."""
    m = regen_manifest(tmp_path, tokens=4, budget=1 << 20)  # a budget that holds every prompt in one batch
    r = run_cli("plan", str(m), "--limit", "12", "--json", "--calibrate", "1")
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)["generation"]
    assert (g["prompts"], g["batches"], g["calibration_prompts"]) == (12, 1, 12)
    assert "first batch" in g["seconds_source"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A real OpenAI-compatible server (``transformers serve``) on 127.0.0.1 serving a tiny saved model."""
    import shutil
    import socket
    import subprocess
    import sys
    import urllib.request

    from helpers import save_local_model

    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    d = tmp_path_factory.mktemp("served")
    model = save_local_model(d / "model")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).parent / "transformers"
    proc = subprocess.Popen(
        [
            str(exe if exe.exists() else shutil.which("transformers")),
            "serve",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/v1"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def up() -> bool:
        assert proc.poll() is None, "transformers serve exited"
        try:
            return opener.open(f"{url}/models", timeout=5).status == 200
        except OSError:
            return False

    try:
        wait_for(up, 600, "transformers serve to answer")
        yield d, model, url
    finally:
        kill_build(proc)


@pytest.mark.process
def test_the_server_engine_regenerates_end_to_end(served: tuple[Path, Path, str], tmp_path: Path) -> None:
    d, model, url = served
    m = write_manifest(tmp_path / "m.toml", model=str(model), dtypes='["fp32"]')
    m.write_text(m.read_text() + f'[generate]\nengine = "openai"\nurl = "{url}"\nmax_new_tokens = 5\nconcurrency = 2\n')
    summary = build_json(m, "--limit", "3")
    assert summary["replies_generated"] == 3
    ledger, replies = lineage(tmp_path / "store.zarr", summary["build_id"])
    assert [r["engine"] for r in ledger] == ["openai"] * 3 and all(r["engine_version"] for r in ledger)
    assert all(r["kernels"] == {} for r in ledger)  # a server's kernels are not known here: none claimed
    info = json.loads(run_cli("info", str(tmp_path / "store.zarr"), "--json").stdout)["generations"]
    assert [g["kernels"] for g in info] == [["not recorded"]]
    ds = HiddenStateDataset(str(tmp_path / "store.zarr"))
    items = {ds[i]["key"]: ds[i] for i in range(len(ds))}
    for rec in ledger:
        item = items[rec["sample_key"]]
        assert item["loss_mask"].tolist() == [False] * rec["prompt_tokens"] + [True] * rec["reply_tokens"]
        # the server answers text: the reply is its tokens here (5 random byte tokens may decode to replacement
        # characters that tokenize longer), masked exactly
        assert rec["finish_reason"] in ("stop", "length") and rec["reply_tokens"] > 0
    assert ds.provenance["recipe"]["generation"]["engine"] == "openai"
    assert build_json(m, "--limit", "3")["replies_generated"] == 0


@pytest.mark.process
def test_a_server_serving_another_model_is_refused(served: tuple[Path, Path, str], tmp_path: Path) -> None:
    from helpers import save_local_model

    _, _, url = served
    other = save_local_model(tmp_path / "other", seed=1)
    m = write_manifest(tmp_path / "m.toml", model=str(other), dtypes='["fp32"]')
    m.write_text(m.read_text() + f'[generate]\nengine = "openai"\nurl = "{url}"\n')
    r = run_cli("build", str(m), "--limit", "2")
    assert r.returncode == 2 and "not the manifest's model" in r.stderr, r.stderr
    assert not (tmp_path / "store.zarr").exists()


def test_a_regenerating_build_refused_for_its_data_leaves_no_store_behind(tmp_path: Path):
    """A regenerating build makes its store first (its replies are checkpointed there as they come): refused
    for its data before a reply is saved, it left an empty store folder behind, which later commands took for
    a store. The store it made is removed; a store that was there before stays, untouched."""
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "Write fizzbuzz in Python."}\n{"prompt": "Explain recursion briefly."}\n')
    m = write_manifest(
        tmp_path / "m.toml", model="builtin:tiny-llama", dtypes='["fp32"]', files=[str(data)], max_length=8
    )
    m.write_text(m.read_text() + '[generate]\nengine = "model"\nmax_new_tokens = 3\n')
    r = run_cli("build", str(m), "--quiet")
    assert r.returncode == 2 and "no usable rows" in r.stderr, r.stderr
    assert not (tmp_path / "store.zarr").exists()
    Store.create(tmp_path / "store.zarr")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "store.zarr").rglob("*"))
    assert run_cli("build", str(m), "--quiet").returncode == 2
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "store.zarr").rglob("*")) == before


def test_a_sampled_reply_does_not_depend_on_the_batch_it_was_made_in(tmp_path: Path) -> None:
    """temperature 1, seed 3, n = 2: each reply draws from a generator of its own (the seed, its prompt, its index),
    so token budgets that batch the prompts differently (as another --limit, or a resume after a kill, does) give
    the same replies; the n replies of one prompt differ."""
    got = []
    for budget in (300, 4096):
        d = tmp_path / f"b{budget}"
        d.mkdir()
        m = regen_manifest(d, extra="temperature = 1.0\nseed = 3\nn = 2", budget=budget, store=str(d / "s.zarr"))
        summary = build_json(m, "--limit", "5")
        _, replies = lineage(d / "s.zarr", summary["build_id"])
        got.append({k: r["ids"] for k, r in replies.items()})
    assert got[0] and got[0].keys() == got[1].keys() and got[0] == got[1]
    assert len({tuple(ids) for ids in got[0].values()}) > len(got[0]) // 2  # sampled: not one reply for all


def _gen_files(store: Path) -> list[str]:
    return sorted(
        str(p.relative_to(store)) for p in (store / "builds").glob("*/*") if p.name.startswith(("gen-", "ledger"))
    )


def test_replies_generated_in_another_dtype_are_another_variant(tmp_path: Path) -> None:
    """One build of bf16 and fp32 generates its replies once, in bf16, and captures both variants over them; a
    later fp32 build generates in fp32: its replies are not the first build's fp32 variant's, so they make
    another variant (they went into that one, which then held two replies of one prompt)."""
    m = regen_manifest(tmp_path, extra="temperature = 1.0\nseed = 5")
    first = build_json(m, "--limit", "3", "--dtype", "bf16", "--dtype", "fp32")
    second = build_json(m, "--limit", "3", "--dtype", "fp32")
    fp32_first = next(v["variant"] for v in first["variants"] if v["dtype"] == "fp32")
    (fp32_second,) = (v["variant"] for v in second["variants"])
    assert fp32_second != fp32_first
    store = Store.open(tmp_path / "store.zarr")
    made = {
        vid: store.variant_record(vid).provenance["recipe"]["generation"]["generated_on"]
        for vid in (fp32_first, fp32_second)
    }
    assert made == {fp32_first: "cpu/bf16", fp32_second: "cpu/fp32"}


def test_a_build_of_another_model_is_refused_before_it_generates_a_reply(tmp_path: Path) -> None:
    m = regen_manifest(tmp_path)
    build_json(m, "--limit", "2")
    store = tmp_path / "store.zarr"
    before = _gen_files(store)
    m.write_text(m.read_text().replace('path = "builtin:tiny-llama"', 'path = "builtin:tiny-llama"\nseed = 1'))
    r = run_cli("build", str(m), "--limit", "2", "--quiet")
    assert r.returncode == 2 and "another model" in r.stderr, r.stderr
    assert _gen_files(store) == before  # no reply generated, no ledger of a build that never ran


def _served_manifest(d: Path, url: str) -> Path:
    m = write_manifest(d / "m.toml", model="builtin:tiny-llama", dtypes='["fp32"]')
    m.write_text(m.read_text() + f'[generate]\nengine = "openai"\nurl = "{url}"\nmax_new_tokens = 5\nretries = 0\n')
    return m


def test_a_server_is_recorded_by_its_url_and_server_header_and_another_one_is_another_variant(tmp_path: Path) -> None:
    """Two servers serving the same model path (e.g. another quantization behind each) answer differently: the
    replies of each are a variant of their own, whose generation names the url and the server's Server header."""
    from fake_openai import fake_server

    got = {}
    for text in ("Fine, thanks.", "Not bad at all."):
        with fake_server("builtin:tiny-llama", text) as (url, header):
            summary = build_json(_served_manifest(tmp_path, url), "--limit", "2")
            ledger, _ = lineage(tmp_path / "store.zarr", summary["build_id"])
            assert {r["engine_version"] for r in ledger} == {header}
            (vid,) = (v["variant"] for v in summary["variants"])
            got[vid] = (url, header)
    assert len(got) == 2  # two variants
    store = Store.open(tmp_path / "store.zarr")
    for vid, (url, header) in got.items():
        g = store.variant_record(vid).provenance["recipe"]["generation"]
        assert (g["server"], g["engine_version"]) == (url, header)


@pytest.mark.parametrize("mode,says", [("list", "GET /models"), ("str-choice", "no usable rows")])
def test_a_server_answering_out_of_shape_is_one_line_exit_2(tmp_path: Path, mode: str, says: str) -> None:
    from fake_openai import fake_server

    with fake_server("builtin:tiny-llama", mode=mode) as (url, _):
        r = run_cli("build", str(_served_manifest(tmp_path, url)), "--limit", "2", "--quiet")
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_build_summary_says_how_many_replies_were_generated_and_reused(tmp_path: Path) -> None:
    m = regen_manifest(tmp_path)
    r = run_cli("build", str(m), "--limit", "2", "--quiet")
    assert (
        r.returncode == 0
        and "\nreplies: 2 generated, 0 reused from an earlier build's checkpoints; ledger: " in r.stdout
    )
    r = run_cli("build", str(m), "--limit", "3", "--quiet")
    assert "\nreplies: 1 generated, 2 reused from an earlier build's checkpoints; ledger: " in r.stdout, r.stdout


def test_replies_kept_whole_only_are_another_variant_than_replies_kept_cut_too(tmp_path: Path) -> None:
    """drop_cut = true keeps only replies that ended before max_new_tokens; a later build keeping cut ones too
    went into that variant, which silently stopped being one of whole replies only."""
    stops = ", ".join(f'"{c}"' for c in "abcdefghijklmnopqrstuvwxyz")  # most replies stop early, some are cut
    m = regen_manifest(tmp_path, tokens=16, extra=f"drop_cut = true\ntemperature = 1.0\nseed = 3\nstop = [{stops}]")
    kept_whole = build_json(m, "--limit", "3")
    m.write_text(m.read_text().replace("drop_cut = true", "drop_cut = false"))
    kept_cut = build_json(m, "--limit", "3")
    assert kept_whole["variants"][0]["variant"] != kept_cut["variants"][0]["variant"]
    vid = kept_whole["variants"][0]["variant"]
    assert Store.open(tmp_path / "store.zarr").variant_record(vid).provenance["recipe"]["generation"]["drop_cut"]


def test_a_server_url_with_a_trailing_slash_reuses_the_replies_of_the_url_without(tmp_path: Path) -> None:
    """The variant named the url without its trailing "/", the checkpoints with it: the same variant took a second
    reply of each prompt."""
    from fake_openai import fake_server

    with fake_server("builtin:tiny-llama") as (url, _):
        first = build_json(_served_manifest(tmp_path, url), "--limit", "2")
        again = build_json(_served_manifest(tmp_path, url + "/"), "--limit", "2")
    assert again["variants"][0]["variant"] == first["variants"][0]["variant"]
    assert (again["replies_generated"], again["replies_reused"]) == (0, 2)
