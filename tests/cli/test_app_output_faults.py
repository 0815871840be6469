"""Reports on stdout that cannot be written whole — a file-size limit, a full disk — fail in one line with
exit 1; never a traceback, never exit 0 with the JSON cut off (docs/errors.md, `output-incomplete`)."""

from __future__ import annotations

import ast
import json
import os
import resource
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import REPO, run_cli

STORE = REPO / "tests" / "data" / "format-v1.zarr"
COMMANDS = {
    "info": ["info", str(STORE), "--json"],
    "verify": ["verify", str(STORE), "--json"],
    "diff": ["diff", f"{STORE}#3cd1", f"{STORE}#b4b2", "--json", "-"],
}


def _run(args: list[str], stdout: object, limit: int | None = None) -> subprocess.CompletedProcess:
    def lower() -> None:  # as `ulimit -f`: the shell leaves SIGXFSZ at its default, which kills the writer
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "hsstore", *args],
        cwd=REPO,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        preexec_fn=lower if limit is not None else None,
    )


@pytest.mark.process
@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_a_file_size_limit_on_stdout_is_exit_1_not_a_cut_report(cmd: str, tmp_path: Path) -> None:
    whole = run_cli(*COMMANDS[cmd])  # the whole report (in this process: only the limited run needs its own)
    assert whole.returncode == 0, whole.stderr
    json.loads(whole.stdout)
    limit = len(whole.stdout.encode()) // 2  # half the report fits
    with open(tmp_path / "out.json", "w") as f:
        r = _run(COMMANDS[cmd], f, limit)
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1, r.stderr
    assert len(errors) == 1 and errors[0].startswith("error: writing the report to stdout failed"), r.stderr
    assert "File too large" in errors[0] and "Traceback" not in r.stderr


@pytest.mark.process
def test_a_full_disk_on_stdout_is_one_line_exit_1() -> None:
    with open("/dev/full", "w") as f:
        r = _run(COMMANDS["info"], f)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "No space left on device" in r.stderr and "Traceback" not in r.stderr


def test_every_command_prints_its_report_through_write_stdout() -> None:
    """One place writes reports (hsstore.cli.render): no typer.echo or print to stdout elsewhere."""
    offenders = []
    for path in sorted((REPO / "hsstore" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "echo",
                "print",
            ):
                if not any(k.arg in ("err", "file") for k in node.keywords):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, offenders


# --- report files the user names (--json FILE, --plot PNG) ------------------------------------------------

DIFF = ["diff", f"{STORE}#3cd1", f"{STORE}#b4b2"]


def _drain(source: int | Path, into: list[bytes]) -> threading.Thread:
    """A thread reading a descriptor (or opening a FIFO and reading it) to its end into ``into``: the
    writer must never block on a full pipe."""

    def run() -> None:
        with open(source, "rb") as f:
            into.append(f.read())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _whole(option: str, data: bytes) -> bool:
    return bool(json.loads(data)["layers"]) if option == "--json" else data.startswith(b"\x89PNG")


@pytest.mark.parametrize("option, name", [("--json", "r.json"), ("--plot", "p.png")])
def test_a_link_to_someone_elses_file_is_refused_never_written_through(tmp_path: Path, option: str, name: str) -> None:
    victim = tmp_path / "theirs" / "notes.txt"
    victim.parent.mkdir()
    victim.write_text("not hsstore's")
    (tmp_path / name).symlink_to(victim)
    r = run_cli(*DIFF, option, str(tmp_path / name))
    assert r.returncode == 2 and "is a symbolic link" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert victim.read_text() == "not hsstore's" and (tmp_path / name).is_symlink()  # both as they were
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, "theirs"]  # no temporary file left


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_a_fifo_or_dev_stdout_gets_the_report_streamed_not_replaced(tmp_path: Path, option: str) -> None:
    """``--json /dev/stdout`` (a link to a descriptor) and a FIFO are written into, as a shell redirection
    would; a file renamed over them would replace a device node or a link of the system (as root)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    from_fifo: list[bytes] = []
    fifo_reader = _drain(fifo, from_fifo)
    out = run_cli(*DIFF, option, str(fifo))
    assert out.returncode == 0, out.stderr
    fifo_reader.join(30)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and from_fifo and _whole(option, from_fifo[0])

    r, w = os.pipe()
    link = tmp_path / "stdout"  # as /dev/stdout -> /proc/self/fd/1, for a descriptor this test owns
    link.symlink_to(f"/proc/self/fd/{w}")
    from_pipe: list[bytes] = []
    pipe_reader = _drain(r, from_pipe)
    try:
        out = run_cli(*DIFF, option, str(link))
    finally:
        os.close(w)
    pipe_reader.join(30)
    assert out.returncode == 0, out.stderr
    assert link.is_symlink() and from_pipe and _whole(option, from_pipe[0])


def _small_store(tmp_path: Path) -> Path:
    from helpers import new_variant, write_unit

    from hsstore import Store

    s = Store.create(tmp_path / "s.zarr")
    write_unit(s, new_variant(s, dtype="bf16"), [4, 6])
    return tmp_path / "s.zarr"


@pytest.mark.parametrize("where", ["root-record", "inside", "the-store"])
@pytest.mark.parametrize("command", ["diff --json", "diff --plot", "export", "vocab-map"])
def test_outputs_inside_a_store_are_refused_and_the_store_stays_whole(tmp_path: Path, command: str, where: str) -> None:
    """A report, export or vocab-map inside a store: refused before any work. Before, ``--json STORE/zarr.json``
    replaced the store's root record (the store no longer opened), and an export or vocab-map folder in a
    store made ``verify`` report its files as damage from then on."""
    from hsstore import Store
    from hsstore.storage.verify import verify

    store = _small_store(tmp_path)
    target = {"root-record": store / "zarr.json", "inside": store / "variants" / "out", "the-store": store}[where]
    if command.startswith("diff"):
        if where != "root-record":
            target = (store if where == "the-store" else store / "variants") / (
                "r.json" if "json" in command else "p.png"
            )
        args = ["diff", str(store), str(store), command.split()[1], str(target)]
    elif command == "export":
        args = ["export", str(store), "modelopt", str(target)]
    else:
        args = ["vocab-map", str(store), "--size", "4", "--target-vocab-size", "300", "--out", str(target)]
    before = sorted(str(p.relative_to(store)) for p in store.rglob("*"))
    r = run_cli(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "is inside the hsstore store" in r.stderr, r.stderr
    assert sorted(str(p.relative_to(store)) for p in store.rglob("*")) == before
    assert verify(Store.open(store)).ok


@pytest.mark.process
def test_a_vocab_map_that_cannot_be_written_leaves_the_earlier_one_whole(tmp_path: Path) -> None:
    """A file-size limit (or a full disk) while a vocab-map replaces an earlier one of its folder: refused in
    one line, and the earlier files with the record that vouches for them are as they were. Before, the record
    was removed first and the files replaced one by one: d2t-N.npy new, vocab_mapping-N.pt old, no record."""
    import xxhash

    out = tmp_path / "vm"
    args = ["vocab-map", f"{STORE}#3cd1", "--size", "4", "--target-vocab-size", "300", "--out", str(out)]
    assert run_cli(*args).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    smallest = min(len(b) for n, b in before.items() if not n.endswith(".json"))
    with open(tmp_path / "stdout", "w") as f:
        r = _run(args, f, smallest + 1)  # the first file fits, a later one does not
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporary file left, nothing replaced
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "is as it was" in r.stderr, r.stderr
    record = json.loads(before["vocab-map-4.json"])
    assert all(xxhash.xxh3_128_hexdigest(before[n]) == h for n, h in record["files"].items())


def test_a_vocab_map_removes_the_temporary_files_a_killed_one_left(tmp_path: Path) -> None:
    """A vocab-map killed (SIGKILL) while it staged its files leaves them under temporary names; the next
    vocab-map into the folder removes them (it holds the folder: no live writer owns one)."""
    out = tmp_path / "vm"
    out.mkdir()
    left = out / ".d2t-4.npy.0123456789ab.hsstore-tmp"
    left.write_bytes(b"half")
    r = run_cli("vocab-map", f"{STORE}#3cd1", "--size", "4", "--target-vocab-size", "300", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert not left.exists() and not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_vocab_map_whose_files_cannot_be_renamed_in_does_not_claim_the_folder_is_as_it_was(tmp_path: Path) -> None:
    """A rename that fails after the earlier record was removed (here: a folder where a map file was) leaves
    the folder changed: the error says so and that a re-run finishes it, not "the folder is as it was"."""
    out = tmp_path / "vm"
    args = ["vocab-map", f"{STORE}#3cd1", "--size", "4", "--target-vocab-size", "300", "--out", str(out)]
    assert run_cli(*args).returncode == 0
    last = sorted(p for p in out.iterdir() if not p.name.endswith(".json"))[-1]
    last.unlink()
    (last / "x").mkdir(parents=True)  # os.replace cannot put a file over a folder that holds something
    r = run_cli(*args)
    assert r.returncode == 1 and "as it was" not in r.stderr and "re-run" in r.stderr, r.stderr
    assert not (out / "vocab-map-4.json").exists()  # no record vouches for the files there now
    assert not [p for p in out.iterdir() if p.name.endswith(".hsstore-tmp")]
