"""Defects the audit misnamed in a hostile round (docs/notes/audit-hostile.md), each seeded into a peer-format export
and audited: a value bug on every sample (a scale, fp16 bits read as bf16, a clip) is that bug, not "states
of other weights"; a clip that hits only row 0 (the attention-sink row) is not "states of a suffix"; a slot's
stale bytes in the leading rows are a stale copy, not a suffix; token ids shifted against correct states are
a token shift, not a stale copy (so are ids offset in value, ids +1); an aux layer holding the final norm's
output is the target leaking; a scale is named when it is beyond the noise of the cache's dtype."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from interop_damage import _load, damage, read_slots, sample_file, sidecar, subset

from hsstore import Store
from hsstore.compare.audit import AuditRequest, run_audit
from hsstore.interop.exporter import ExportRequest, export_cache
from hsstore.interop.importer import ImportRequest, import_cache

AUX0, AUX1, TARGET, NORM = 0, 1, 3, 4
ALL = (AUX0, AUX1, TARGET)


def _picks(store: str, n: int) -> list[tuple[int, str]]:
    """The n shortest samples (index in commit order = the export's file index, key), in commit order."""
    s = Store.open(store.split("#")[0])
    r = s.reader(s.select(store.split("#")[1]))
    return sorted(sorted(enumerate(r.keys), key=lambda ik: (r.refs[ik[1]].length, ik[1]))[:n])


def _audit(fmt: str, src: str, model: str, tmp: Path, n: int, seed) -> tuple[dict, list[tuple[int, str]]]:
    """Export ``src`` to ``fmt``, keep the n shortest samples, damage them with ``seed(folder, picks)``,
    import, audit every sample."""
    picks = _picks(src, n)
    export_cache(ExportRequest(src, fmt, str(tmp / "full")))
    folder = subset(fmt, tmp / "full", tmp / fmt, picks)
    seed(folder, picks)
    import_cache(ImportRequest(fmt, str(folder), str(tmp / "s.zarr"), tokenizer=model, allow_unhealthy=True))
    return run_audit(AuditRequest(model=model, target=str(tmp / "s.zarr"), fraction=1.0)).to_dict(), picks


def _by_layer(rep: dict, key: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for f in rep["findings"]:
        if f["key"] == key:
            out.setdefault(f["layer"], []).append(f)
    return out


def _scaled(a, t):
    return (a.float() * 0.5).to(a.dtype), (t.float() * 0.5).to(t.dtype)


def _fp16_read_as_bf16(a, t):
    return a.to(torch.float16).view(torch.bfloat16), t.to(torch.float16).view(torch.bfloat16)


def _clip_aux0(a: torch.Tensor) -> torch.Tensor:
    a = a.clone()
    a[:, AUX0], top = _clip_largest_row(a[:, AUX0])
    assert top == 0  # the case: the largest values are row 0's
    return a


def _clip_largest_row(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x`` [T, H] clipped at the second-largest row maximum: only the row of the largest value changes."""
    peaks = x.float().abs().amax(1)
    top = int(peaks.argmax())
    c = float(torch.cat([peaks[:top], peaks[top + 1 :]]).max())
    return x.clamp(-c, c), top


def _clip_top(x: torch.Tensor, share: float = 0.002) -> tuple[torch.Tensor, list[int]]:
    """``x`` clipped at the magnitude its largest ``share`` of values exceed, and the rows that changed."""
    mag = x.float().abs().flatten()
    c = float(mag.kthvalue(int(mag.numel() * (1 - share))).values)
    return x.clamp(-c, c), torch.nonzero((x.float().abs() > c).any(1)).flatten().tolist()


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_a_value_bug_on_every_sample_is_named_not_other_weights(fmt: str, tiny_store: Path, tmp_path: Path):
    """Every sample beyond noise in every layer made the audit say "states of other weights"; undone, each
    bug leaves the states within noise, so it is named: scaled, wrong_dtype, clipped."""
    bugs = {"scaled": _scaled, "wrong_dtype": _fp16_read_as_bf16}

    def seed(folder: Path, picks: list) -> None:
        for (i, k), bug in zip(picks, bugs.values()):
            damage(fmt, sample_file(fmt, folder, i, k), bug)
        i, k = picks[2]
        damage(fmt, sample_file(fmt, folder, i, k), lambda a, t: (a, _clip_top(t)[0]))

    rep, picks = _audit(fmt, f"{tiny_store}#dtype=bf16", "builtin:tiny-qwen3_5", tmp_path, 3, seed)
    for (_, key), kind in zip(picks, bugs):
        got = _by_layer(rep, key)
        assert {L: [f["kind"] for f in fs] for L, fs in got.items()} == {L: [kind] for L in ALL}, (fmt, kind, got)
    _, _, target = read_slots(fmt, sample_file(fmt, Path(tmp_path / "full"), *picks[2]))
    got = _by_layer(rep, picks[2][1])
    assert {L: [f["kind"] for f in fs] for L, fs in got.items()} == {TARGET: ["clipped"]}, got
    assert got[TARGET][0]["rows"] and set(got[TARGET][0]["rows"]) <= set(_clip_top(target)[1]), got
    assert "other_weights" not in rep["defects"], rep["verdict"]


def test_a_clip_of_row_0_alone_is_not_states_of_a_suffix(attn_store: Path, tmp_path: Path):
    """tiny-llama's largest values sit in row 0 (the attention sink), where a clip (an fp16 overflow) changes
    most: a clip beyond noise in row 0 alone read as "rows 0..0 are not this sample's: states of a suffix"."""
    src = f"{attn_store}#attention=sdpa,dtype=bf16"

    def seed(folder: Path, picks: list) -> None:
        i, k = picks[0]
        damage("modelopt", sample_file("modelopt", folder, i, k), lambda a, t: (_clip_aux0(a), t))

    rep, picks = _audit("modelopt", src, "builtin:tiny-llama", tmp_path, 2, seed)
    got = _by_layer(rep, picks[0][1])
    assert {L: [f["kind"] for f in fs] for L, fs in got.items()} == {AUX0: ["clipped"]}, got
    assert got[AUX0][0]["rows"] == [0]  # the case: beyond noise in row 0 alone


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_stale_leading_rows_are_a_stale_copy_and_a_norm_leak_is_the_target(fmt: str, tiny_store: Path, tmp_path: Path):
    """Rows 0..5 holding a neighbour's last 6 rows (a slot's bytes, not a prefix left unwritten) read as
    "states of a suffix"; an aux layer holding the final norm of the target read as a capture point."""
    from test_audit import _final_norm

    def seed(folder: Path, picks: list) -> None:
        (vi, vk), (di, dk), (ni, nk) = picks[0], picks[-1], picks[1]
        _, da, dt = read_slots(fmt, sample_file(fmt, folder, di, dk))

        def stale(a, t):
            a, t = a.clone(), t.clone()
            a[:6], t[:6] = da[-6:], dt[-6:]
            return a, t

        damage(fmt, sample_file(fmt, folder, vi, vk), stale)

        def leak(a, t):
            a = a.clone()
            a[:, AUX1] = _final_norm(t)
            return a, t

        damage(fmt, sample_file(fmt, folder, ni, nk), leak)

    rep, picks = _audit(fmt, f"{tiny_store}#dtype=bf16", "builtin:tiny-qwen3_5", tmp_path, 4, seed)
    got = _by_layer(rep, picks[0][1])
    assert {L: [f["kind"] for f in fs] for L, fs in got.items()} == {L: ["stale_copy"] for L in ALL}, got
    assert all(fs[0]["source"] == picks[-1][1] and fs[0]["rows"] == list(range(6)) for fs in got.values()), (
        picks,
        [(fs[0]["source"], fs[0]["rows"]) for fs in got.values()],
    )
    assert all("a prefix not written" in fs[0]["detail"] for fs in got.values())  # what the suffix rule saw, kept
    got = _by_layer(rep, picks[1][1])
    assert {L: [(f["kind"], f.get("match")) for f in fs] for L, fs in got.items()} == {
        AUX1: [("aux_equals_target", NORM)]
    }, got


@pytest.mark.parametrize("fmt", ["specforge", "modelopt"])
def test_token_ids_shifted_against_correct_states_are_a_token_shift(fmt: str, tiny_store: Path, tmp_path: Path):
    """A writer that drops the first token id but keeps every state row (the ids one ahead of the states):
    the leading rows equal those of samples sharing the prompt, under other tokens — read as a stale copy."""

    def seed(folder: Path, picks: list) -> None:
        path = sample_file(fmt, folder, *picks[1])
        obj = _load(fmt, path)
        ids = obj["input_ids"].flatten()
        obj["input_ids"] = torch.cat([ids[1:], ids[-1:]]).reshape(obj["input_ids"].shape)
        torch.save(obj, path)

    rep, picks = _audit(fmt, f"{tiny_store}#dtype=bf16", "builtin:tiny-qwen3_5", tmp_path, 4, seed)
    bad = [v for v in rep["sample_verdicts"] if v["verdict"] not in ("bit_exact", "within_noise")]
    assert len(bad) == 1 and bad[0]["key"] not in {k for _, k in picks}, bad  # new ids: a new key
    got = _by_layer(rep, bad[0]["key"])
    assert {L: [(f["kind"], f.get("match")) for f in fs] for L, fs in got.items()} == {
        L: [("token_shift", 1)] for L in ALL
    }, got


@pytest.mark.parametrize("fmt", ["modelopt", "eagle"])
def test_an_fp32_cache_of_bf16_computed_states_is_named_with_the_dtype_that_judges_it(
    fmt: str, tiny_store: Path, tmp_path: Path
):
    """States computed in bf16 and saved as fp32 (every value a bf16 value): a clean cache, flagged as "states of
    other weights" against the fp32 recomputation. The audit assumes (and says) bf16 and agrees; asked to judge
    them at fp32 (--dtype fp32), it names wrong_dtype and the --dtype that judges them."""
    s = Store.open(tiny_store)
    bf16 = s.reader(s.select("dtype=bf16"))

    def seed(folder: Path, picks: list) -> None:
        for i, k in picks:
            a0, a1, t = (x.float() for x in bf16.read_layers(bf16.refs[k], list(ALL)))
            damage(
                fmt, sample_file(fmt, folder, i, k), lambda a, _t: (None if a is None else torch.stack([a0, a1], 1), t)
            )

    rep, picks = _audit(fmt, f"{tiny_store}#dtype=fp32", "builtin:tiny-qwen3_5", tmp_path, 2, seed)
    assert rep["verdict"].startswith("AGREES") and rep["findings"] == [], rep["verdict"]
    assert rep["recompute"]["dtype"] == "bf16" and rep["assumed"]["dtype"].startswith("bf16 (every stored value")
    at_fp32 = run_audit(
        AuditRequest(model="builtin:tiny-qwen3_5", target=str(tmp_path / "s.zarr"), fraction=1.0, dtype="fp32")
    ).to_dict()
    layers = ALL if fmt != "eagle" else (TARGET,)
    assert at_fp32["defects"] == {"wrong_dtype": 2}, at_fp32["verdict"]
    assert {(f["key"], f["layer"]) for f in at_fp32["findings"]} == {(k, L) for _, k in picks for L in layers}
    assert all("--dtype bf16" in f["detail"] for f in at_fp32["findings"])


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_an_aux_slot_holding_the_embeddings_is_named_off_by_one(fmt: str, tiny_store: Path, tmp_path: Path):
    """vLLM's input id 0 is the state entering layer 0, the embeddings: a slot holding them where layer 0's
    output was stated read as plain "beyond noise" (the embeddings were no capture point the audit knew)."""
    from hsstore.capture.model.spec import ModelSpec

    model = ModelSpec("builtin:tiny-qwen3_5").load(torch.bfloat16, "cpu", "sdpa")
    s = Store.open(tiny_store)
    r = s.reader(s.select("dtype=bf16"))

    def seed(folder: Path, picks: list) -> None:
        i, k = picks[0]
        with torch.no_grad():
            emb = model.get_input_embeddings()(torch.from_numpy(r.read_tokens(r.refs[k])[0].astype("int64")))

        def embeddings(a, t):
            a = a.clone()
            a[:, AUX0] = emb.to(a.dtype)
            return a, t

        damage(fmt, sample_file(fmt, folder, i, k), embeddings)

    rep, picks = _audit(fmt, f"{tiny_store}#dtype=bf16", "builtin:tiny-qwen3_5", tmp_path, 2, seed)
    got = _by_layer(rep, picks[0][1])
    assert {L: [(f["kind"], f.get("match")) for f in fs] for L, fs in got.items()} == {AUX0: [("capture_point", -1)]}, (
        got
    )
    assert "embeddings" in got[AUX0][0]["detail"] and "restatement" not in rep


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_rows_read_from_the_wrong_block_of_the_same_sample_are_named(fmt: str, tiny_store: Path, tmp_path: Path):
    """A block table pointing at another block of the same request (16 rows hold the rows 32 later): read as
    plain "beyond noise" (the stale-slot search skipped the sample's own rows). Aux slots laid out [n, T, H]
    and read [T, n, H]: their rows of the prompt every sample shares were named another sample's."""

    def seed(folder: Path, picks: list) -> None:
        def wrong_block(a, t):
            n = t.shape[0]  # the source block near the end, past the prompt every sample shares
            a, t = a.clone(), t.clone()
            a[n - 56 : n - 40], t[n - 56 : n - 40] = a[n - 24 : n - 8].clone(), t[n - 24 : n - 8].clone()
            return a, t

        damage(fmt, sample_file(fmt, folder, *picks[0]), wrong_block)

        def layout(a, t):  # aux written [n, T, H] and read [T, n, H]
            return a.permute(1, 0, 2).reshape(a.shape).contiguous(), t

        damage(fmt, sample_file(fmt, folder, *picks[1]), layout)

    rep, picks = _audit(fmt, f"{tiny_store}#dtype=bf16", "builtin:tiny-qwen3_5", tmp_path, 3, seed)
    got = _by_layer(rep, picks[1][1])  # rows of the shared prompt are its own rows too, not another sample's
    assert {L: {f["kind"] for f in fs} for L, fs in got.items()} == {AUX0: {"stale_copy"}, AUX1: {"stale_copy"}}, got
    assert all(f["source"] == picks[1][1] for fs in got.values() for f in fs), got
    s = Store.open(tiny_store)
    r = s.reader(s.select("dtype=bf16"))
    ids = r.read_tokens(r.refs[picks[0][1]])[0]
    n = len(ids)
    rows = [t for t in range(n - 56, n - 40) if ids[t] != ids[t + 32]]  # under its source row's token: no copy
    got = _by_layer(rep, picks[0][1])
    assert {L: [(f["kind"], f["source"], f["rows"]) for f in fs] for L, fs in got.items()} == {
        L: [("stale_copy", picks[0][1], rows)] for L in ALL
    }, got
    assert all("this sample's own rows" in fs[0]["detail"] for fs in got.values())


@pytest.mark.parametrize("fmt", ["specforge", "modelopt"])
def test_noise_added_to_every_sample_is_not_other_weights(fmt: str, tiny_store: Path, tmp_path: Path):
    """Gaussian noise (0.05 x the layer's std) added to every layer of every sample read as "states of other
    weights"; its difference does not repeat at rows of one token (another model's does), so it stays
    beyond_noise and says so."""

    def noisy(x: torch.Tensor, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return (x.float() + 0.05 * x.float().std() * torch.randn(x.shape, generator=g)).to(x.dtype)

    def seed(folder: Path, picks: list) -> None:
        for n, (i, k) in enumerate(picks):
            damage(fmt, sample_file(fmt, folder, i, k), lambda a, t, n=n: (noisy(a, n), noisy(t, 100 + n)))

    rep, picks = _audit(fmt, f"{tiny_store}#dtype=bf16", "builtin:tiny-qwen3_5", tmp_path, 3, seed)
    assert rep["defects"] == {"beyond_noise": 3}, rep["verdict"]
    assert {(f["key"], f["layer"]) for f in rep["findings"]} == {(k, L) for _, k in picks for L in ALL}
    assert all("noise added to the states" in f["detail"] for f in rep["findings"])


def test_the_narrower_dtype_is_read_from_values_that_say_it():
    """An all-zero first sample (a slot never written) says nothing of the dtype the states were computed
    in; values rounded to bf16 or fp16 do (and values of fp32 do not)."""
    from hsstore.compare.defects import narrower_values

    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    assert narrower_values(torch.zeros(16, 64)) is None and narrower_values(x) is None
    assert narrower_values(x.to(torch.bfloat16).float()) == "bf16"
    assert narrower_values(x.to(torch.float16).float()) == "fp16"


@pytest.mark.parametrize("dtype,scale,named", [("fp32", 1.001, True), ("bf16", 1.05, True), ("bf16", 1.001, False)])
def test_a_scale_is_named_when_it_is_beyond_the_noise_of_the_caches_dtype(
    dtype: str, scale: float, named: bool, tiny_store: Path, tmp_path: Path
):
    """An fp32 cache whose states are the truth x 1.001 read as plain "beyond noise": a fitted scale within 1 %
    of 1 was never called a scale, though fp32's noise (~1e-7) is 10^4 times smaller. The precision noise
    of the cache's dtype says how small a scale is seen: x 1.001 in fp32 and x 1.05 in bf16 are `scaled`;
    x 1.001 in bf16 is below its rounding (~3e-3) and is no false alarm, nor is the unscaled sample."""

    def seed(folder: Path, picks: list) -> None:
        damage(
            "specforge",
            sample_file("specforge", folder, *picks[0]),
            lambda a, t: ((a.double() * scale).to(a.dtype), (t.double() * scale).to(t.dtype)),
        )

    rep, picks = _audit("specforge", f"{tiny_store}#dtype={dtype}", "builtin:tiny-qwen3_5", tmp_path, 2, seed)
    assert rep["recompute"]["dtype"] == dtype
    if not named:
        assert rep["verdict"].startswith("AGREES") and rep["findings"] == [], rep["verdict"]
        return
    got = _by_layer(rep, picks[0][1])
    assert {L: [f["kind"] for f in fs] for L, fs in got.items()} == {L: ["scaled"] for L in ALL}, got
    assert all(f"truth x {scale:g} " in fs[0]["detail"] for fs in got.values()), got
    assert rep["defects"] == {"scaled": 1} and not _by_layer(rep, picks[1][1]), rep["verdict"]


@pytest.mark.parametrize("fmt", ["specforge", "modelopt"])
def test_token_ids_offset_against_correct_states_are_not_a_stale_copy(fmt: str, tiny_store: Path, tmp_path: Path):
    """Token ids written +1 (each id the true id + 1, wrapping past the last) on right states: the rows of
    the prompt the sample shares with the other sample equal that sample's, under other ids — read as a
    stale copy of "a previous request's bytes". The states are right and the ids wrong: token_shift, no
    position shift (match 0), the offset said; the other sample stays clean."""
    from hsstore.capture.model.spec import ModelSpec

    vocab = len(ModelSpec("builtin:tiny-qwen3_5").tokenizer())

    def seed(folder: Path, picks: list) -> None:
        path = sample_file(fmt, folder, *picks[1])
        obj = _load(fmt, path)
        obj["input_ids"] = (obj["input_ids"] + 1) % vocab
        torch.save(obj, path)

    rep, picks = _audit(fmt, f"{tiny_store}#dtype=bf16", "builtin:tiny-qwen3_5", tmp_path, 2, seed)
    bad = [v for v in rep["sample_verdicts"] if v["verdict"] not in ("bit_exact", "within_noise")]
    assert len(bad) == 1 and bad[0]["key"] not in {k for _, k in picks}, bad  # new ids: a new key
    got = _by_layer(rep, bad[0]["key"])
    assert {L: [(f["kind"], f.get("match")) for f in fs] for L, fs in got.items()} == {
        L: [("token_shift", 0)] for L in ALL
    }, got
    assert all("offset by +1" in fs[0]["detail"] and fs[0]["rows"] for fs in got.values()), got
    assert "stale_copy" not in rep["defects"], rep["verdict"]


@pytest.mark.parametrize("offset_on", ["prefix", "longer"])
def test_token_ids_offset_on_a_sample_whose_text_is_anothers_prefix(offset_on: str, tiny_store: Path, tmp_path: Path):
    """A foreign cache (no export record) holding a sample B and a sample A whose text is B's first 40 tokens
    (its states are B's first 40 rows, as the model computes them): ids +1 on either one. Every row the two
    share is byte-for-byte the other's under other ids — the ids are wrong, the states right: token_shift,
    never a stale copy."""
    from hsstore.capture.model.spec import ModelSpec

    vocab = len(ModelSpec("builtin:tiny-qwen3_5").tokenizer())
    picks = _picks(f"{tiny_store}#dtype=bf16", 1)
    export_cache(ExportRequest(f"{tiny_store}#dtype=bf16", "specforge", str(tmp_path / "full")))
    folder = subset("specforge", tmp_path / "full", tmp_path / "specforge", picks)
    sidecar("specforge", folder).unlink()
    (i, key), m = picks[0], 40
    b = _load("specforge", sample_file("specforge", folder, i, key))
    a = {
        "input_ids": b["input_ids"][:m].clone(),
        "loss_mask": b["loss_mask"][:m].clone(),
        "aux_hidden_state": b["aux_hidden_state"][:, :m].clone(),
        "hidden_state": b["hidden_state"][:, :m].clone(),
    }
    bad = a if offset_on == "prefix" else b
    bad["input_ids"] = (bad["input_ids"] + 1) % vocab
    torch.save(b, sample_file("specforge", folder, i, key))
    torch.save(a, sample_file("specforge", folder, i + 1, ""))
    import_cache(
        ImportRequest(
            "specforge",
            str(folder),
            str(tmp_path / "s.zarr"),
            tokenizer="builtin:tiny-qwen3_5",
            model="builtin:tiny-qwen3_5",
            layers="0,1,3",
            capture="output",
        )
    )
    rep = run_audit(AuditRequest(model="builtin:tiny-qwen3_5", target=str(tmp_path / "s.zarr"), fraction=1.0)).to_dict()
    assert rep["samples"] == 2 and rep["defects"] == {"token_shift": 1}, rep["verdict"]
    (v,) = [v for v in rep["sample_verdicts"] if v["verdict"] != "within_noise" and v["verdict"] != "bit_exact"]
    got = _by_layer(rep, v["key"])
    assert {L: [(f["kind"], f.get("match")) for f in fs] for L, fs in got.items()} == {
        L: [("token_shift", 0)] for L in ALL
    }, got
    assert all("offset by +1" in fs[0]["detail"] and fs[0]["rows"][0] == 0 for fs in got.values()), got
