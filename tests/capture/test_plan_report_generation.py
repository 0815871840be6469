"""``hsstore plan`` of a manifest that regenerates its replies ([generate]): what it says when it cannot time the
generation, and that the replies and the calibration batch it plans are those the build generates."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import DATA, run_cli, write_manifest


def _manifest(d: Path, generate: str, *, files: list[str] | None = None, max_length: int = 256) -> Path:
    p = write_manifest(d / "m.toml", model="builtin:tiny-llama", dtypes='["fp32"]', files=files, max_length=max_length)
    p.write_text(p.read_text() + "[generate]\n" + generate)
    return p


def _generation(m: Path, *args: str) -> dict:
    r = run_cli("plan", str(m), "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["generation"]


def test_a_server_engine_plan_says_plan_does_not_run_the_server(tmp_path: Path) -> None:
    """--calibrate cannot time an openai server's generation: the plan must not tell the user to pass the
    --calibrate they passed."""
    m = _manifest(tmp_path, 'engine = "openai"\nurl = "http://127.0.0.1:9/v1"\nmax_new_tokens = 4\n')
    for args in ((), ("--calibrate", "1")):
        g = _generation(m, "--limit", "2", *args)
        assert g["seconds"] is None and g["generated_tokens_per_second"] is None
        assert "pass --calibrate" not in g["seconds_source"], g["seconds_source"]
        assert "openai" in g["seconds_source"] and "server" in g["seconds_source"], g["seconds_source"]


def test_a_plan_of_rows_with_no_prompt_is_refused_as_the_build_refuses_them(tmp_path: Path) -> None:
    """Text rows give no prompt to regenerate from: the build refuses them in one line (exit 2), so the plan does
    too, for the same reason (it used to plan them as the data's own samples)."""
    data = tmp_path / "text.jsonl"
    data.write_text('{"text": "a row of plain text"}\n{"text": "another row of text"}\n')
    m = _manifest(tmp_path, 'engine = "model"\nmax_new_tokens = 2\n', files=[str(data)])
    for cmd in ("plan", "build"):
        r = run_cli(cmd, str(m), "--quiet") if cmd == "build" else run_cli(cmd, str(m), "--calibrate", "1")
        assert r.returncode == 2 and "no prompt to regenerate from: 2" in r.stderr, (cmd, r.stderr)
        assert r.stderr.count("\n") == 1


def test_a_plan_counts_the_samples_the_build_writes_prompt_rows_and_n_replies_too(tmp_path: Path) -> None:
    """The plan stood the data's own replies in for the regenerated ones: a prompt row (no reply of its own) was
    'rejected', and n replies a row were one sample. It counts one stand-in a reply chain, as the build writes."""
    data = tmp_path / "rows.jsonl"
    rows = [json.loads(x) for x in DATA.read_text().splitlines()[:3]] + [
        {"messages": [{"role": "user", "content": "Hi."}]}
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    m = _manifest(
        tmp_path, 'engine = "model"\nmax_new_tokens = 3\ntemperature = 1.0\nseed = 1\nn = 2\n', files=[str(data)]
    )
    r = run_cli("plan", str(m), "--json")
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)
    r = run_cli("build", str(m), "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    built = json.loads(r.stdout)
    assert planned["inputs"]["usable"] == built["inputs"]["usable"] == 8 and not planned["inputs"]["rejected"]
    assert planned["generation"]["replies"] == built["replies_generated"] == 8


def test_prompts_the_build_drops_as_too_long_are_neither_planned_nor_calibrated_on(tmp_path: Path) -> None:
    """The build drops a prompt of max_length tokens or more before generating (prompts.prompt_tokens); the
    plan counted it, and its batches (longest prompts first) timed the build's 'first batch' on exactly the
    prompts the build never generates. Of the first 6 rows, 2 prompts exceed 80 tiny-llama tokens."""
    m = _manifest(tmp_path, 'engine = "model"\nmax_new_tokens = 2\n', max_length=80)
    g = _generation(m, "--limit", "6", "--calibrate", "1")
    r = run_cli("build", str(m), "--quiet", "--json", "--limit", "6")
    assert r.returncode == 0, r.stderr
    built = json.loads(r.stdout)["replies_generated"]
    assert built == 4
    assert (g["prompts"], g["replies"], g["calibration_prompts"]) == (built, built, built)
    assert g["max_generated_tokens"] == 2 * built


def test_docs_json_names_every_key_of_plan_json() -> None:
    """docs/json.md is where a script's author looks up ``plan --json``: it left out ``generation`` (and the
    ratio's ``expected_error``), so the regeneration estimate and its calibration keys were undocumented."""
    import re

    from helpers import REPO

    from hsstore.core.schema.plan import GenerationPlan, PlanReport, Ratio

    doc = (REPO / "docs" / "json.md").read_text()
    bullet = re.search(r"^- `plan --json`(.*?)(?=^- )", doc, re.S | re.M)
    assert bullet, "docs/json.md has no plan --json bullet"
    keys = {*PlanReport.__struct_fields__, *GenerationPlan.__struct_fields__, *Ratio.__struct_fields__}
    missing = sorted(k for k in keys if f'"{k}"' not in bullet.group(1))
    assert not missing, f"docs/json.md's plan --json leaves out {missing}"


def test_a_sampled_plan_scales_the_generation_to_the_whole_data(tmp_path: Path) -> None:
    """--sample N extrapolated the tokens to every row but planned the generation of the N sampled rows only
    (10 replies of a 120-row file whose build generates 120)."""
    m = _manifest(tmp_path, 'engine = "model"\nmax_new_tokens = 2\n', max_length=512)
    whole, sampled = _generation(m), _generation(m, "--sample", "10")
    assert whole["prompts"] == whole["replies"] == 120
    assert (sampled["prompts"], sampled["replies"], sampled["max_generated_tokens"]) == (120, 120, 240)
    assert abs(sampled["batches"] - whole["batches"]) <= max(1, whole["batches"] // 2)


def test_a_plan_of_prompts_only_data_plans_the_build_that_regenerates_them(tmp_path: Path) -> None:
    """Rows that are prompts (no assistant turn) are what regeneration is for, and the build takes them; the plan
    refused the data as 'no usable rows in the data files ... check [data] files and format'."""
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        '{"prompt": "Write fizzbuzz in Python."}\n{"prompt": "Explain recursion briefly."}\n'
        '{"messages": [{"role": "user", "content": "hi there"}]}\n'
    )
    m = _manifest(tmp_path, 'engine = "model"\nmax_new_tokens = 3\n', files=[str(data)])
    r = run_cli("plan", str(m), "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert (plan["inputs"]["usable"], plan["tokens"]["samples"]) == (3, 3)
    g = plan["generation"]
    assert (g["prompts"], g["replies"], g["max_generated_tokens"], g["expected_generated_tokens"]) == (3, 3, 9, 9)
    r = run_cli("build", str(m), "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["replies_generated"] == 3


def test_a_plan_of_prompts_the_build_would_all_drop_is_one_line_and_exit_2(tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "Write fizzbuzz in Python."}\n{"prompt": "Explain recursion briefly."}\n')
    m = _manifest(tmp_path, 'engine = "model"\nmax_new_tokens = 3\n', files=[str(data)], max_length=8)
    r = run_cli("plan", str(m))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "as prompts to regenerate from" in r.stderr and "prompt longer than max_length=8: 2" in r.stderr, r.stderr


def test_a_plan_after_an_earlier_build_counts_only_the_replies_still_to_generate(tmp_path: Path) -> None:
    """A build reuses every reply an earlier build checkpointed in the store (a re-run generates nothing already
    generated); the plan ignored them and estimated the whole generation again, as it does not the capture
    (its 'to write' is what the store lacks)."""
    m = _manifest(tmp_path, 'engine = "model"\nmax_new_tokens = 2\n')
    r = run_cli("build", str(m), "--quiet", "--json", "--limit", "2")
    assert r.returncode == 0, r.stderr
    g = _generation(m, "--limit", "3", "--calibrate", "1")
    assert (g["prompts"], g["replies"], g["checkpointed_replies"]) == (3, 3, 2)
    assert (g["max_generated_tokens"], g["batches"], g["calibration_prompts"]) == (2, 1, 1)
    g = _generation(m, "--limit", "2", "--calibrate", "1")
    assert (g["checkpointed_replies"], g["max_generated_tokens"], g["batches"], g["seconds"]) == (2, 0, 0, 0.0)
    assert "checkpointed" in g["seconds_source"], g["seconds_source"]
    r = run_cli("plan", str(m), "--limit", "2")  # the text form too
    assert r.returncode == 0 and "2 checkpointed in the store" in r.stdout and "nothing to generate" in r.stdout, (
        r.stderr
    )


def test_a_sampled_plan_scales_n_replies_a_row_to_the_whole_data(tmp_path: Path) -> None:
    """``--sample`` extrapolates the sampled rows' tokens to every row: with n replies a row each row holds n
    samples, which the extrapolation took for n rows (tokens n times low)."""
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(DATA.read_text().splitlines()[:12]) + "\n")
    m = _manifest(
        tmp_path, 'engine = "model"\nmax_new_tokens = 3\ntemperature = 1.0\nseed = 1\nn = 3\n', files=[str(data)]
    )
    whole = run_cli("plan", str(m), "--json")
    sampled = run_cli("plan", str(m), "--json", "--sample", "6")
    assert whole.returncode == 0 and sampled.returncode == 0, (whole.stderr, sampled.stderr)
    full, est = json.loads(whole.stdout)["tokens"], json.loads(sampled.stdout)["tokens"]
    assert full["samples"] == 36 and 0.6 * full["tokens"] < est["tokens"] < 1.6 * full["tokens"], (full, est)


def test_a_plan_after_a_build_counts_its_samples_committed_as_it_does_for_data_replies(tmp_path: Path) -> None:
    """A plan stood a placeholder in for each regenerated sample, whose key is not the built one: on a store the
    build had filled it planned every sample again (0 committed, the whole size to write). A reply chain whose
    replies the store holds is planned as the sample the build made of them: committed, nothing left to write;
    and the generation plan counts the same chains' replies checkpointed, two-turn chains too (nothing to
    generate, no batch, no calibration run). Chains with a reply still missing stay stand-ins (here: the third
    row after a build of two), for both n and turns = "all"."""
    data = tmp_path / "chats.jsonl"
    two_turns = {
        "messages": [
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "And another?"},
            {"role": "assistant", "content": "11"},
        ]
    }
    third = {"messages": [{**two_turns["messages"][0], "content": "Name an even number."}, *two_turns["messages"][1:]]}
    rows = [two_turns, json.loads(DATA.read_text().splitlines()[1]), third]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for generate, per_row, replies in (
        ("max_new_tokens = 3\ntemperature = 1.0\nseed = 1\nn = 2\n", 2, 4),
        ('max_new_tokens = 2\nturns = "all"\n', 1, 3),
    ):  # (of the first 2 rows)
        d = tmp_path / str(per_row)
        d.mkdir()
        m = _manifest(d, 'engine = "model"\n' + generate, files=[str(data)])
        r = run_cli("build", str(m), "--quiet", "--json", "--limit", "2")
        assert r.returncode == 0, r.stderr
        built = json.loads(r.stdout)["inputs"]["usable"]
        for limit in ("2", "3"):
            r = run_cli("plan", str(m), "--json", "--limit", limit, "--calibrate", "1")
            assert r.returncode == 0, r.stderr
            plan = json.loads(r.stdout)
            v, g = plan["variants"][0], plan["generation"]
            assert v["committed_samples"] == built, (generate, limit, v)
            if limit == "2":
                assert v["remaining_bytes"] == 0 and plan["inputs"]["usable"] == built, (generate, v)
                assert g["checkpointed_replies"] == g["replies"] == replies, (generate, g)
                assert (g["batches"], g["max_generated_tokens"], g["seconds"]) == (0, 0, 0.0), (generate, g)
            else:
                assert plan["inputs"]["usable"] > built and v["remaining_bytes"] > 0, (generate, plan["inputs"], v)
                rounds = 2 if "all" in generate else 1  # turns = "all": the third row's two turns, a round each
                assert g["checkpointed_replies"] == replies < g["replies"] and g["batches"] == rounds, (generate, g)


def test_a_plan_before_any_build_counts_a_duplicate_row_once_as_the_build_does(tmp_path: Path) -> None:
    """The same prompt regenerates the same reply (greedy, or a draw seeded by the prompt): the build keeps one
    sample and generates the reply once; the plan's stand-ins counted the duplicate row as a sample of its own, and
    its generation plan the reply twice."""
    data = tmp_path / "dup.jsonl"
    rows = [json.loads(x) for x in DATA.read_text().splitlines()[1:3]]
    data.write_text("\n".join(json.dumps(r) for r in [*rows, rows[0]]) + "\n")
    m = _manifest(tmp_path, 'engine = "model"\nmax_new_tokens = 2\n', files=[str(data)])
    r = run_cli("plan", str(m), "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    planned, generation = plan["inputs"], plan["generation"]
    r = run_cli("build", str(m), "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    build = json.loads(r.stdout)
    built = build["inputs"]
    assert (planned["usable"], planned["duplicates"]) == (built["usable"], built["duplicates"]) == (2, 1)
    # the duplicate's reply is generated once (the build's second copy is a reuse)
    assert generation["max_generated_tokens"] == 2 * build["replies_generated"] == 2 * 2, (generation, build)


def test_a_plan_of_every_turn_counts_a_batch_a_round_and_earlier_replies_at_most_max_new_tokens(tmp_path: Path) -> None:
    """turns = "all" regenerates turn by turn, a round of batches per turn, each earlier reply at most
    max_new_tokens: the plan counted one round and the data's own earlier replies (3,819 tokens planned for 2,313
    built). Now its batches are the build's, and its tokens differ from the build's by less than what the unknown
    reply lengths can make (each regenerated reply of each sample is 1 to max_new_tokens tokens)."""
    rows = DATA.read_text().splitlines()[60:80]
    data = tmp_path / "multi.jsonl"
    data.write_text("\n".join(rows) + "\n")
    tokens = 8
    m = _manifest(
        tmp_path,
        f'engine = "model"\nturns = "all"\nmax_new_tokens = {tokens}\ntemperature = 1.0\nseed = 11\n',
        files=[str(data)],
        max_length=512,
    )
    plan = json.loads(run_cli("plan", str(m), "--limit", "10", "--json").stdout)
    r = run_cli("build", str(m), "--limit", "10", "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    built = json.loads(r.stdout)
    store = tmp_path / "store.zarr"
    turns = max(len(json.loads(x).get("messages", json.loads(x).get("conversations", []))) for x in rows[:10]) // 2
    assert plan["generation"]["batches"] == len(list((store / "builds").glob("*/gen-*.jsonl")))  # a batch a file
    samples, written = built["variants"][0]["samples_written"], built["variants"][0]["tokens"]
    assert abs(plan["tokens"]["tokens"] - written) < samples * turns * tokens, (plan["tokens"], written)
