"""Small real objects for tests: stores with random states, manifests, CLI runs (in this process, or in real
subprocesses where the process is the subject)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

import torch

from hsstore import Store
from hsstore.capture.model.kernels import installed
from hsstore.storage.writer import UnitWriter
from hsstore.testing.factories import (  # noqa: F401
    LAYERS,
    TORCH_DTYPES,
    crashed_unit,
    make_samples,
    make_states,
    new_variant,
    one_sample_units,
    provenance,
    store_with_unit,
    write_unit,
)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "hsstore" / "data" / "conversations.jsonl"
# read before conftest blocks the kernel packages in this process: GPU tests build with fla in subprocesses
FLA_INSTALLED = installed("fla")


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300, process: bool = False
) -> subprocess.CompletedProcess:
    """``hsstore ARGS``: in this process through the real entry point, builds with inline workers
    (inline_cli.run_inline), answered as a subprocess would; in a real ``python -m hsstore``
    subprocess with ``process=True`` or where ``env`` sets a ``PYTHON*`` variable (read at a process's
    start). ``timeout`` bounds only the subprocess."""
    if process or any(k.startswith("PYTHON") for k in env or {}):
        return run_cli_process(*args, cwd=cwd, env=env, timeout=timeout)
    from inline_cli import run_inline

    return run_inline(args, cwd=cwd or REPO, env=env)


def run_cli_process(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m hsstore ARGS`` in a real subprocess (for tests where the process is the subject)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hsstore", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env=e,
        timeout=timeout,
    )


def start_build(manifest: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """``hsstore build MANIFEST --quiet ARGS`` started in a session of its own (``kill_build`` stops it with
    its worker); stdout dropped, stderr piped; ``env`` added to this process's environment."""
    return subprocess.Popen(
        [sys.executable, "-m", "hsstore", "build", str(manifest), "--quiet", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def build_racing(procs: list[subprocess.Popen], committed, *args: str) -> subprocess.CompletedProcess:  # noqa: ANN001
    """``hsstore build ARGS`` in this process (run_cli), started once the racing build processes ``procs``
    have committed a unit (``committed()`` says so) and while one of them still runs: this process is one
    more concurrent writer, without an interpreter start of its own (an inline build needs no imports, so
    started with them it would finish before they write)."""
    wait_for(lambda: committed() or all(p.poll() is not None for p in procs), 300, "the racing builds' first commit")
    assert any(p.poll() is None for p in procs), "the racing builds ended before this one started"
    return run_cli("build", *args)


def diff_report(a: str, b: str, *args: str) -> dict:
    """``hsstore diff A B ARGS --json -`` (run_cli), which must succeed: its report."""
    r = run_cli("diff", a, b, *args, "--json", "-")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def assert_bit_exact(a: str, b: str, n: int) -> dict:
    """``hsstore diff A B`` finds exactly ``n`` shared samples, none on one side only, and every layer
    bit-exact: the report."""
    rep = diff_report(a, b)
    assert rep["shared_samples"] == n and rep["only_a"] == rep["only_b"] == 0
    assert rep["layers"], "the diff compared no layers"
    assert all(L["bit_exact"] == 1.0 and L["rel_l2"] == 0.0 for L in rep["layers"]), rep["layers"]
    return rep


def write_manifest(
    path: Path,
    *,
    model: str = "builtin:tiny-qwen3_5",
    layers: str = "{ aux = [0, 1], target = [2] }",
    files: list[str] | None = None,
    store: str = "store.zarr",
    dtypes: str = '["bf16"]',
    extra_model: str = "",
    extra_data: str = "",
    extra_build: str = "",
    max_length: int = 256,
) -> Path:
    files = files or [str(DATA)]
    text = f"""
[model]
path = "{model}"
layers = {layers}
{extra_model}
[data]
files = {files!r}
max_length = {max_length}
{extra_data}
[build]
backends = ["torch"]
dtypes = {dtypes}
devices = ["cpu"]
token_budget = 2048
unit_tokens = 2048
{extra_build}
[store]
path = "{store}"
""".replace("'", '"')
    path.write_text(text)
    return path


def save_local_model(d: Path, arch: str = "tiny-llama", seed: int = 0, chat_template: bool = True) -> Path:
    """A real ``save_pretrained`` model directory (safetensors weights, tokenizer) of a tiny builtin."""
    from transformers import AutoModelForCausalLM

    from hsstore.capture.model.builtin import builtin_config, builtin_tokenizer

    tok = builtin_tokenizer()
    if not chat_template:
        tok.chat_template = None
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(builtin_config(arch, vocab_size=len(tok))).save_pretrained(d)
    tok.save_pretrained(d)
    if not chat_template:
        for f in d.glob("chat_template*"):
            f.unlink()
    return d


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A directory made once per test run by ``build``, shared by every xdist worker of the run (the first
    to ask builds it under a file lock, the others wait for it): session stores are built once, not once
    per worker. Tests must treat it as read-only (copy it to change it)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's directory, above each worker's own
    d = root / f"shared-{name}"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / ".done").exists():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            build(d)
            (d / ".done").write_text("")
    return d


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc: no psutil)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped, does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_for(condition, timeout: float = 120, what: str = "condition"):  # noqa: ANN001, ANN201
    """Poll ``condition()`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = condition()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def kill_build(proc: subprocess.Popen) -> None:
    """SIGKILL a build started in its own process group (``start_new_session`` or ``process_group=0``)
    and its workers (each in its own group) at the same moment, and wait until none runs."""
    import signal

    groups = [proc.pid, *children(proc.pid)]
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    wait_for(lambda: not any(alive(p) for p in groups), 60, "the killed build's processes to end")


def main_exit(argv: list[str]) -> int:
    """``hsstore ARGV`` in this process through the real entry point: its exit code (what it printed
    stays for capsys)."""
    import pytest

    from hsstore.cli.main import main

    old, sys.argv = sys.argv, ["hsstore", *argv]
    try:
        with pytest.raises(SystemExit) as e:
            main()
    finally:
        sys.argv = old
    return e.value.code


def run_main(argv: list[str], capsys: object) -> tuple[int, str]:
    """``hsstore ARGV`` in this process through the real entry point: (exit code, stderr). What setting
    the case up printed is dropped first."""
    capsys.readouterr()
    code = main_exit(argv)
    return code, capsys.readouterr().err


class TaggedItems(torch.utils.data.Dataset):
    """Items of ``ds`` with ``tag(ds, item)`` added as ``item[name]``: what the process that read an item
    (a DataLoader worker, or this one) saw while reading it."""

    def __init__(self, ds: torch.utils.data.Dataset, name: str, tag: Callable) -> None:
        self.ds, self.name, self.tag = ds, name, tag

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        item = self.ds[i]
        item[self.name] = self.tag(self.ds, item)
        return item


META_DOCS = {  # every metadata document (zarr.json) of the format, under a variant with a committed and a crashed unit
    "variants-group": lambda v: "variants/zarr.json",
    "variant": lambda v: f"variants/{v}/zarr.json",
    "units-group": lambda v: f"variants/{v}/units/zarr.json",
    "unit": lambda v: f"variants/{v}/units/w-000000/zarr.json",
    "array": lambda v: f"variants/{v}/units/w-000000/layer_0/zarr.json",
    "uncommitted-unit": lambda v: f"variants/{v}/units/crashed-000000/zarr.json",
    "uncommitted-array": lambda v: f"variants/{v}/units/crashed-000000/input_ids/zarr.json",
}


def garbage_metadata(io, vid: str, doc: str, commits: bool) -> str:  # noqa: ANN001 - any back end
    """Write non-JSON over ``doc``'s zarr.json (the variant's commit records removed unless ``commits``)."""
    from hsstore.storage import layout

    if not commits:
        for key in io.list(layout.commits_prefix(vid)):
            io.remove(key)
    key = META_DOCS[doc](vid)
    assert io.get(key) is not None, key  # the case: a document the store has
    io.put(key, [b"\x00garbage, not JSON {"])
    return key


def read_path_store(
    tmp_path: Path, lengths: list[list[int]], hidden: int = 16, codec: str = "zstd", chunk: int = 4096
) -> tuple[Path, dict[str, dict[int, torch.Tensor]]]:
    """A store with one unit per list of lengths; returns its path and each key's states per layer."""
    store = Store.create(tmp_path / "s.zarr")
    vid = new_variant(store, codec=codec, chunk=chunk, hidden=hidden)
    want: dict[str, dict[int, torch.Tensor]] = {}
    for u, unit in enumerate(lengths):
        samples = make_samples(unit, seed=u)
        states = make_states(samples, hidden, "bf16", [0, 1, 2], seed=u)
        UnitWriter(store, vid).write(samples, states)
        a = 0
        for s in samples:
            want[s.key] = {i: states[i][a : a + s.length] for i in (0, 1, 2)}
            a += s.length
    return tmp_path / "s.zarr", want


def read_path_item_check(item: dict[str, Any], want: dict[str, dict[int, torch.Tensor]]) -> None:
    """The item holds exactly the states ``read_path_store`` wrote for its key."""
    w = want[item["key"]]
    assert torch.equal(item["aux_hidden"], torch.stack([w[0], w[1]], dim=1))
    assert torch.equal(item["target_hidden"][:, 0], w[2])
