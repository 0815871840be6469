"""Bad and foreign files given to import/export/vocab-map: one clear line, exit 2, nothing committed, and
never an unpickled object (docs/errors.md, section "Interop")."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import torch
from helpers import REPO, main_exit, run_main
from interop_files import TOKENIZER, WRITERS, random_samples

from hsstore import Store

SF = ["--tokenizer", TOKENIZER, "--num-layers", "4", "--layers", "0,1,2,final_norm", "--capture", "output"]


def _imp(t: Path, fmt: str, src: Path, *extra: str, opts: list[str] | None = None) -> list[str]:
    return ["import", fmt, str(src), "--store", str(t / "s.zarr"), *(SF if opts is None else opts), *extra]


def _sf(t: Path, mutate=None, n: int = 2, **kw) -> Path:
    """A SpecForge folder; ``mutate(record)`` edits the first file's dict before it is saved."""
    src = t / "sf"
    WRITERS["specforge"](src, random_samples(n=n, **kw))
    if mutate is not None:
        f = src / "rows_0-2000" / "data_0.ckpt"
        rec = torch.load(f, weights_only=True)
        mutate(rec)
        torch.save(rec, f)
    return src


class Evil:
    """Unpickling this would create a file: weights_only must refuse it before that."""

    def __reduce__(self):
        return (Path.touch, (Path("/tmp/hsstore-interop-pwned"),))


def _evil(t: Path) -> Path:
    src = _sf(t)
    torch.save({"input_ids": torch.zeros(3, dtype=torch.long), "payload": Evil()}, src / "rows_0-2000" / "data_0.ckpt")
    return src


def _foreign(t: Path) -> Path:
    src = _sf(t)
    (src / "rows_0-2000" / "data_0.ckpt").write_bytes(pickle.dumps({"a": 1}) + b"junk")
    return src


def _fp8(t: Path) -> Path:
    from safetensors.torch import save_file

    src = t / "sp"
    WRITERS["speculators"](src, random_samples(n=2))
    f = src / "hidden_states" / "hs_0.safetensors"
    save_file(
        {
            "hidden_states": torch.zeros(7, 4, 32, dtype=torch.float8_e4m3fn),
            "hidden_states_scales": torch.ones(7, 1, 1),
            "token_ids": torch.zeros(7, dtype=torch.long),
        },
        str(f),
    )
    return src


def _spec_mismatch(t: Path) -> Path:
    from safetensors.torch import save_file

    src = t / "sp"
    samples = random_samples(n=2)
    WRITERS["speculators"](src, samples)
    s = samples[0]
    save_file(
        {"hidden_states": torch.cat([s.aux, s.target[:, None]], 1).contiguous(), "token_ids": s.ids + 1},
        str(src / "hidden_states" / "hs_0.safetensors"),
    )
    return src


def _modelopt(t: Path, prenorm: bool | None = None, drop_mask: bool = False) -> Path:
    src = t / "mo"
    WRITERS["modelopt"](src, random_samples(n=2), prenorm=prenorm)
    if drop_mask:
        for f in src.glob("*.pt"):
            rec = torch.load(f, weights_only=True)
            del rec["loss_mask"]
            torch.save(rec, f)
    return src


def _mixed(t: Path) -> Path:
    src = t / "ea"
    WRITERS["eagle"](src, random_samples(n=2, hidden=32))
    WRITERS["eagle"](src, random_samples(n=1, hidden=48, seed=1), index=1)
    return src


def _newline_name(t: Path) -> Path:
    """An EAGLE folder whose first file's name holds a newline (and an escape sequence) and is not a torch file."""
    src = t / "ea"
    WRITERS["eagle"](src, random_samples(n=2))
    (src / "0" / "data_\n\x1b[2J0.ckpt").write_bytes(b"not a torch file")
    return src


def _stride_zero(rec: dict) -> None:
    """Every tensor a view of a few bytes declaring 20 M tokens (a 2 KB file; 2.9 GB once copied)."""
    n = 20_000_000
    rec.update(
        input_ids=rec["input_ids"][:1].expand(n),
        loss_mask=rec["loss_mask"][:1].expand(n),
        hidden_state=rec["hidden_state"][:, :1].expand(1, n, -1),
        aux_hidden_state=rec["aux_hidden_state"][:, :1].expand(1, n, -1),
    )


def _zip_bomb(t: Path) -> Path:
    """A SpecForge .ckpt of ~100 KB whose zip members are deflated zeros declaring ~80 MB: torch.save's own
    layout, members compressed (torch.load inflates them)."""
    import io
    import zipfile

    n, hidden = 1_000_000, 8

    def zeros(rec: dict) -> None:
        rec.update(
            input_ids=torch.zeros(n, dtype=torch.long),
            loss_mask=torch.ones(n, dtype=torch.long),
            hidden_state=torch.zeros(1, n, hidden, dtype=torch.bfloat16),
            aux_hidden_state=torch.zeros(1, n, 3 * hidden, dtype=torch.bfloat16),
        )

    src = _sf(t, zeros, hidden=hidden)
    f = src / "rows_0-2000" / "data_0.ckpt"
    plain = zipfile.ZipFile(io.BytesIO(f.read_bytes()))
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for m in plain.infolist():
            z.writestr(m.filename, plain.read(m.filename))
    assert f.stat().st_size < 1_000_000
    return src


def _gzip_bomb(t: Path) -> Path:
    """A .ckpt.gz of a few hundred KB that inflates to 256 MiB (written a MiB at a time)."""
    import zlib

    src = t / "sf"
    WRITERS["specforge"](src, random_samples(n=2), compress=True)
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    with open(src / "rows_0-2000" / "data_0.ckpt.gz", "wb") as f:
        for _ in range(256):
            f.write(z.compress(zeros))
        f.write(z.flush())
    return src


def _sparse(rec: dict) -> None:
    rec["hidden_state"] = rec["hidden_state"].to(torch.float32).to_sparse()


def _spec_rows(t: Path, rows: list[dict]) -> Path:
    """A speculators folder whose Arrow table holds ``rows`` as written (strings, nulls), beside valid
    hidden-states files."""
    from datasets import Dataset

    src = t / "sp"
    WRITERS["speculators"](src, random_samples(n=len(rows)))
    ds = Dataset.from_list(rows)
    for f in src.iterdir():
        if f.is_file():
            f.unlink()
    ds.save_to_disk(str(src))
    return src


SP = [*SF[:5], "1,2,3,4", "--capture", "input"]


def _exported(t: Path) -> str:
    from hsstore.interop.importer import ImportRequest, import_cache

    src = _sf(t)
    import_cache(
        ImportRequest(
            "specforge",
            str(src),
            str(t / "s.zarr"),
            tokenizer=TOKENIZER,
            num_layers=4,
            layers="0,1,2,final_norm",
            capture="output",
        )
    )
    (t / "busy").mkdir()
    (t / "busy" / "notes.txt").write_text("x")
    return str(t / "s.zarr")


def _export_without_layer_count(t: Path, fmt: str = "specforge") -> Path:
    """An export whose provenance records no layer count: its record says so as the exporter writes it then
    (num_layers -1, the slots' hsstore ids as written, capture unknown)."""
    import json

    (t / "src").mkdir()
    assert main_exit(["export", _exported(t / "src"), fmt, str(t / "ex")]) == 0
    side = t / "ex" / "hsstore-export.json"
    rec = json.loads(side.read_text())
    rec.update(num_layers=-1, tool_capture="unknown", tool_layers=[*rec["slots"]["aux"], *rec["slots"]["target"]])
    side.write_text(json.dumps(rec))
    return t / "ex"


CASES = {
    "import-format-unknown": (lambda t: _imp(t, "medusa", _sf(t)), "unknown format 'medusa'"),
    "import-no-files": (
        lambda t: (t / "e").mkdir() or _imp(t, "specforge", t / "e"),
        "no specforge sample files under",
    ),
    "import-dir-missing": (lambda t: _imp(t, "eagle", t / "nope"), "does not exist or is not a folder"),
    "import-layers-missing": (
        lambda t: _imp(t, "specforge", _sf(t), opts=["--tokenizer", TOKENIZER]),
        "do not record which layers they hold: pass --layers",
    ),
    "import-capture-unknown-word": (
        lambda t: _imp(t, "specforge", _sf(t), opts=[*SF[:-1], "inputs"]),
        "unknown --capture 'inputs'",
    ),
    "import-layer-count": (
        lambda t: _imp(t, "specforge", _sf(t), opts=[*SF[:5], "0,1,final_norm", *SF[6:]]),
        r"hold 3 aux state\(s\) and a target state per token \(4 slot\(s\)\), but --layers names 3",
    ),
    "import-layer-word": (
        lambda t: _imp(t, "specforge", _sf(t), opts=[*SF[:5], "0,1,2,last", *SF[6:]]),
        "'last' is not a layer id",
    ),
    "import-input-layer-zero": (
        lambda t: _imp(t, "specforge", _sf(t), opts=[*SF[:5], "0,1,2,4", "--capture", "input"]),
        "layer 0 under --capture input is the embedding output",
    ),
    "import-layer-out-of-range": (
        lambda t: _imp(t, "specforge", _sf(t), opts=[*SF[:5], "0,1,2,4", *SF[6:]]),
        "layer 4 is out of range for a 4-layer model .*post-norm state is final_norm",
    ),
    "import-target-derives-from-aux": (
        lambda t: _imp(t, "specforge", _sf(t), opts=[*SF[:5], "0,2,3,final_norm", *SF[6:]]),
        r"target final_norm is RMSNorm of aux layer 3 .* check --layers",
    ),
    "import-layer-twice": (
        lambda t: _imp(t, "specforge", _sf(t), opts=[*SF[:5], "0,1,1,3", *SF[6:]]),
        "names one layer twice",
    ),
    "import-no-num-layers": (
        lambda t: _imp(t, "specforge", _sf(t), opts=["--tokenizer", TOKENIZER, *SF[4:]]),
        "pass --model DIR .* or --num-layers N",
    ),
    "import-export-no-layer-count": (
        lambda t: [
            "import",
            "specforge",
            str(_export_without_layer_count(t)),
            "--store",
            str(t / "s.zarr"),
            "--tokenizer",
            TOKENIZER,
        ],
        r"the number of decoder layers is unknown.*--num-layers N",
    ),
    "import-no-tokenizer": (lambda t: _imp(t, "specforge", _sf(t), opts=SF[2:]), "pass --tokenizer PATH"),
    "import-wrong-tokenizer": (
        lambda t: _imp(t, "specforge", _sf(t, lambda r: r["input_ids"].fill_(300))),
        "token id 300 is outside the tokenizer's vocabulary",
    ),
    "import-pickle-refused": (
        lambda t: _imp(t, "specforge", _evil(t)),
        r"not a plain torch.save file .*never unpickles",
    ),
    "import-foreign-file": (lambda t: _imp(t, "specforge", _foreign(t)), "not a plain torch.save file of tensors"),
    "import-missing-key": (
        lambda t: _imp(t, "specforge", _sf(t, lambda r: r.pop("hidden_state"))),
        r"no 'hidden_state' \(keys:",
    ),
    "import-mask-not-binary": (
        lambda t: _imp(t, "specforge", _sf(t, lambda r: r["loss_mask"].fill_(2))),
        "loss_mask holds values other than 0 and 1",
    ),
    "import-length-mismatch": (
        lambda t: _imp(t, "specforge", _sf(t, lambda r: r.update(hidden_state=r["hidden_state"][:, :-1]))),
        r"hidden_state has shape .*; expected \[",
    ),
    "import-dflash-file": (
        lambda t: _imp(t, "specforge", _sf(t, lambda r: r.update(hidden_states=r.pop("aux_hidden_state")))),
        "DFlash-family feature file",
    ),
    "import-mixed-caches": (
        lambda t: _imp(t, "eagle", _mixed(t), opts=[*SF[:5], "final_norm", *SF[6:]]),
        "the folder mixes two caches",
    ),
    "import-fp8-speculators": (
        lambda t: _imp(t, "speculators", _fp8(t), opts=[*SF[:5], "1,2,3,4", "--capture", "input"]),
        "FP8-quantized hidden states",
    ),
    "import-speculators-tokens-differ": (
        lambda t: _imp(t, "speculators", _spec_mismatch(t), opts=[*SF[:5], "1,2,3,4", "--capture", "input"]),
        "token_ids do not match row 0",
    ),
    "import-speculators-no-dataset": (
        lambda t: (t / "sp" / "hidden_states").mkdir(parents=True) or _imp(t, "speculators", t / "sp"),
        "not a speculators data folder",
    ),
    "import-modelopt-no-mask": (
        lambda t: _imp(t, "modelopt", _modelopt(t, drop_mask=True)),
        "no 'loss_mask' .*will not guess",
    ),
    "import-modelopt-prenorm-contradiction": (
        lambda t: _imp(t, "modelopt", _modelopt(t, prenorm=True)),
        "says its target is pre-norm .* but --layers names the target 'final_norm'",
    ),
    "import-newline-in-name": (
        lambda t: _imp(t, "eagle", _newline_name(t), opts=[*SF[:5], "final_norm", *SF[6:]]),
        r"0/data_\\n\\x1b\[2J0.ckpt: not a plain torch.save file",
    ),
    "import-stride-zero-view": (
        lambda t: _imp(t, "specforge", _sf(t, _stride_zero)),
        r"'input_ids' declares shape \(20000000,\) .* over only .*save it with .contiguous\(\)",
    ),
    "import-gzip-bomb": (
        lambda t: _imp(t, "specforge", _gzip_bomb(t)),
        r"data_0.ckpt.gz: inflates past .*decompression bomb",
    ),
    "import-zip-bomb": (
        lambda t: _imp(t, "specforge", _zip_bomb(t)),
        r"data_0\.ckpt: its zip members inflate to .* from .*: a decompression bomb",
    ),
    "import-sparse-tensor": (lambda t: _imp(t, "specforge", _sf(t, _sparse)), r"'hidden_state' is a sparse_coo tensor"),
    "import-speculators-string-ids": (
        lambda t: _imp(
            t, "speculators", _spec_rows(t, [{"input_ids": ["a", "b"], "loss_mask": [0, 1], "seq_len": 2}] * 2), opts=SP
        ),
        r"row 0: input_ids holds .* not integers",
    ),
    "import-speculators-null-row": (
        lambda t: _imp(
            t, "speculators", _spec_rows(t, [{"input_ids": None, "loss_mask": None, "seq_len": None}] * 2), opts=SP
        ),
        r"row 0: input_ids holds null",
    ),
    "export-folder-not-empty": (
        lambda t: ["export", _exported(t), "speculators", str(t / "busy")],
        "exists and is not empty",
    ),
    "export-folder-other-format": (
        lambda t: (
            main_exit(["export", _exported(t), "modelopt", str(t / "mo")]) == 0
            and ["export", str(t / "s.zarr"), "specforge", str(t / "mo")]
        ),
        r"says the folder was exported as 'modelopt', not 'specforge'; choose a new folder",
    ),
    "export-layer-not-stored": (
        lambda t: ["export", _exported(t), "specforge", str(t / "x"), "--aux", "0,7"],
        r"layer\(s\) \[7\] are not stored",
    ),
    "vocab-map-vocab-beyond-int32": (
        lambda t: ["vocab-map", _exported(t), "--size", "4", "--target-vocab-size", "10000000000"],
        r"target vocabulary 10000000000 \(from --target-vocab-size\) must be between 1 and 2147483648",
    ),
    "vocab-map-record-foreign": (
        lambda t: (
            (t / "vm").mkdir()
            or (t / "vm" / "vocab-map-4.json").write_text("{}")
            and ["vocab-map", _exported(t), "--size", "4", "--out", str(t / "vm")]
        ),
        r"vm/vocab-map-4\.json is not a vocab-map record hsstore wrote; choose another --out",
    ),
    "vocab-map-size": (
        lambda t: ["vocab-map", _exported(t), "--size", "100000"],
        "--size 100000 must be between 1 and",
    ),
}


_run = run_main


@pytest.mark.parametrize("case", sorted(CASES))
def test_interop_bad_input_is_one_line_exit_2(case: str, tmp_path: Path, capsys):
    Path("/tmp/hsstore-interop-pwned").unlink(missing_ok=True)
    make_args, pattern = CASES[case]
    code, err = _run(make_args(tmp_path), capsys)
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line and not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err
    assert not Path("/tmp/hsstore-interop-pwned").exists()  # nothing was unpickled
    if (tmp_path / "s.zarr").exists() and not case.startswith(("export", "vocab")):
        assert Store.open(tmp_path / "s.zarr").variants == []


def test_vocab_map_prices_its_vocabulary_before_allocating(tmp_path: Path, capsys, monkeypatch) -> None:
    """`vocab-map-vocab-too-large`: a vocabulary whose counting would not fit the memory budget is refused
    before any array is made (the budget is set here, so the case holds on any machine)."""
    monkeypatch.setenv("HSSTORE_MEMORY_BUDGET", "1G")
    code, err = _run(["vocab-map", _exported(tmp_path), "--size", "4", "--target-vocab-size", "100000000"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert re.search(r"counting a target vocabulary of 100,000,000 .* needs .*, more than the 1 GB memory budget", err)
    assert not list(tmp_path.glob("vocab-map-*"))


def test_interop_catalogue_documents_every_case():
    doc = (REPO / "docs" / "errors.md").read_text()
    missing = [c for c in CASES if f"`{c}`" not in doc]
    assert not missing, f"docs/errors.md lacks rows for {missing}"


@pytest.mark.process
@pytest.mark.parametrize("fmt", ["specforge", "modelopt"])
def test_export_on_a_full_disk_is_an_io_fault_exit_1_naming_the_os_error(fmt: str, tmp_path: Path) -> None:
    """Running out of space (here: a file-size limit, EFBIG) mid-export is exit 1 naming the OS error, not
    exit 2 "choose a writable folder": the folder was writable; no temporary file is left."""
    import resource
    import signal
    import subprocess
    import sys

    store = _exported(tmp_path)

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 10, 4 << 10))

    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "hsstore", "export", store, fmt, str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
    )
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1 and "File too large" in errors[0], r.stderr[-2000:]
    assert "writable" not in errors[0] and "Traceback" not in r.stderr
    assert not [p for p in out.rglob("*") if "tmp" in p.name]


def _bomb(rec: dict, rng, key: str) -> str:
    """One size-bomb or foreign-layout mutation of ``rec[key]``; returns what it did."""
    t = rec[key]
    n = rng.choice([2**20, 2**24, 10**8])
    how = rng.choice(["expand-rows", "expand-last", "sparse", "as-strided", "complex", "list"])
    if how == "expand-rows":
        rec[key] = t.reshape(-1)[:1].expand(n) if t.dim() == 1 else t[..., :1, :].expand(*t.shape[:-2], n, t.shape[-1])
    elif how == "expand-last":
        rec[key] = t[..., :1].expand(*t.shape[:-1], n)
    elif how == "sparse":
        rec[key] = t.to(torch.float32).to_sparse()
    elif how == "as-strided":
        rec[key] = t.as_strided((n, *t.shape[1:]), (0, *t.stride()[1:]))
    elif how == "complex":
        rec[key] = t.to(torch.complex64)
    else:
        rec[key] = t.tolist()
    return f"{how} {key} to {n}"


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. torch casting a complex mask to int: silently wrong
@pytest.mark.parametrize("seed", range(12))
def test_seeded_size_bombs_in_sample_files_are_refused_in_one_line(seed: int, tmp_path: Path) -> None:
    """Seeded mutations of a SpecForge file's tensors into size bombs and foreign layouts (stride-0 views of
    up to 10^8 rows, sparse, complex, plain lists): the import reads every other file or refuses with
    hsstore's own one-line error — never another exception, never a multi-gigabyte allocation."""
    import random

    from hsstore.core.errors import HsstoreError
    from hsstore.interop.importer import ImportRequest, import_cache

    rng = random.Random(seed)
    key = rng.choice(["input_ids", "loss_mask", "hidden_state", "aux_hidden_state"])
    did: list[str] = []
    src = _sf(tmp_path, lambda rec: did.append(_bomb(rec, rng, key)))
    try:
        import_cache(
            ImportRequest(
                "specforge",
                str(src),
                str(tmp_path / "s.zarr"),
                tokenizer=TOKENIZER,
                num_layers=4,
                layers="0,1,2,final_norm",
                capture="output",
                jobs=1,
            )
        )
    except HsstoreError as e:
        assert "\n" not in str(e), (did, str(e))


def test_foreign_files_are_decoded_only_where_they_are_priced() -> None:
    """torch.load, gzip and zlib decoding of another tool's files happen in hsstore/interop/sample.py only,
    where sizes are checked against the memory budget before anything is materialized."""
    # testing/bench.py reads back the torch.save files its own benchmark wrote (the torch.load baseline), never input
    # read/stream_state.py inflates a training state's consumed marks, bounded to the snapshot's size
    allowed = {
        REPO / "hsstore" / "interop" / "sample.py",
        REPO / "hsstore" / "testing" / "bench.py",
        REPO / "hsstore" / "read" / "stream_state.py",
    }
    calls = re.compile(r"\btorch\.load\(|\bgzip\.(decompress|open)\(|\bzlib\.decompress(obj)?\(|\bpickle\.loads?\(")
    offenders = [
        f"{p.relative_to(REPO)}:{i}"
        for p in sorted((REPO / "hsstore").rglob("*.py"))
        if p not in allowed
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if calls.search(line.split("#")[0]) and "``" not in line
    ]
    assert not offenders, offenders
