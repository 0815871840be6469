"""Seeded mutation fuzzing of stores: one mutation of a copy of a good store per case, then every reading
entry point, each under a time limit. A case fails on a traceback (any exception that is not hsstore's
own error), a hang, data that is not bit-identical to the original, or gc removing a committed unit,
anything outside the store, or what another command holds (concurrent mutations: a writer mid-unit or
mid-claim keeps its lease through the checks; a store moved into units/ must survive ``gc --force``). Used by tests/storage/test_store_fuzz.py (a bounded run in CI and the long run of
scripts/fuzz_store.sh)."""

from __future__ import annotations

import contextlib
import fcntl
import io as _io
import json
import os
import random
import shutil
import signal
import stat
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import typer

import hsstore.cli.main  # noqa: F401  (registers every command on the app)
from hsstore import HiddenStateDataset, Store
from hsstore.cli.app import app
from hsstore.core.errors import HsstoreError
from hsstore.storage import layout
from hsstore.storage.fileio import group_json
from hsstore.storage.gc import collect_garbage
from hsstore.storage.info import store_info
from hsstore.storage.leases import Lease
from hsstore.storage.local import LocalBackend
from hsstore.storage.verify import verify

Truth = dict[tuple[str, str], tuple[bytes, ...]]  # (variant, key) -> (ids, mask, layer bytes...)
TIMEOUT_S = 20


class Hang(Exception):
    """An entry point ran past TIMEOUT_S."""


def snapshot(path: Path) -> Truth:
    """Every committed sample of every variant, as bytes."""
    store = Store.open(path)
    return {
        (vid, k): as_bytes(store.reader(vid).read(k)) for vid in store.variant_ids() for k in store.reader(vid).keys
    }


def as_bytes(d: dict[str, Any]) -> tuple[bytes, ...]:
    """A read sample's tokens, mask and every layer's bits."""
    return (
        d["input_ids"].numpy().tobytes(),
        d["loss_mask"].numpy().tobytes(),
        *(t.contiguous().view(torch.uint8).numpy().tobytes() for t in d["layers"].values()),
    )


# ---- mutations ----------------------------------------------------------------------------------------


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _json_paths(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _json_paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _json_paths(v, (*path, i))
    return out


OTHER_TYPES: list[Any] = ["x", 7, -1, 2.5, True, None, [], {}, [1, "a"], {"k": 1}, 2**70, ""]
HUGE: list[int] = [2**31, 2**40, 10**12, 2**62, 2**63 - 1]  # size bombs: shapes, lengths, offsets, sizes


def _huge_json(f: Path, rng: random.Random) -> str:
    """A size bomb: one integer of a record (a shape, a chunk size, a sample's length or offset, a file's
    size) made huge, so a reader that trusts it would allocate terabytes."""
    try:
        doc = json.loads(f.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return _flip(f, rng)
    ints = []
    for p in _json_paths(doc):
        node = doc
        for part in p:
            node = node[part]
        if p and isinstance(node, int) and not isinstance(node, bool):
            ints.append(p)
    if not ints:
        return _mutate_json(f, rng, "swap")
    path = rng.choice(ints)
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = rng.choice(HUGE)
    f.write_text(json.dumps(doc))
    return f"json-huge {'.'.join(map(str, path))}"


def _mutate_json(f: Path, rng: random.Random, how: str) -> str:
    try:
        doc = json.loads(f.read_bytes())
    except (ValueError, UnicodeDecodeError):
        return _flip(f, rng)
    paths = [p for p in _json_paths(doc) if p]
    if not paths:
        return _flip(f, rng)
    path = rng.choice(paths)
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    if how == "swap":
        parent[path[-1]] = rng.choice([v for v in OTHER_TYPES if type(v) is not type(parent[path[-1]])])
    elif how == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[rng.choice(["extra", "unit", "files", "id", "samples"]) + "_" * rng.randint(0, 1)] = rng.choice(
            OTHER_TYPES
        )
    else:
        parent.append(rng.choice(OTHER_TYPES))
    f.write_text(json.dumps(doc))
    return f"json-{how} {'.'.join(map(str, path))}"


def _flip(f: Path, rng: random.Random) -> str:
    data = bytearray(f.read_bytes())
    if not data:
        f.write_bytes(b"\x00")
        return "grow-empty"
    for _ in range(rng.randint(1, 3)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    f.write_bytes(bytes(data))
    return "bit-flip"


def _replace(f: Path, make: Callable[[Path], None]) -> None:
    f.unlink()
    make(f)


def mutate(store: Path, outside: Path, rng: random.Random) -> str:
    """Apply one seeded mutation to ``store``; returns what it did."""
    files = _files(store)
    f = rng.choice(files)
    rel = f.relative_to(store)
    kind = rng.choice(
        [
            "flip",
            "flip",
            "truncate",
            "extend",
            "json-swap",
            "json-swap",
            "json-drop",
            "json-extra",
            "fifo",
            "symlink",
            "delete",
            "odd-file",
            "dir-for-file",
            "file-for-dir",
            "rename-commit",
            "copy-commit",
            "chmod",
            "in-flight-unit",
            "in-flight-claim",
            "nested-store",
            "json-huge",
            "json-huge",
        ]
    )
    if kind in ("in-flight-unit", "in-flight-claim", "nested-store"):
        return _concurrent(store, rng, kind)
    if kind == "flip":
        return f"{_flip(f, rng)} {rel}"
    if kind == "truncate":
        size = f.stat().st_size
        os.truncate(f, rng.randint(0, max(0, size - 1)))
        return f"truncate {rel}"
    if kind == "extend":
        with open(f, "ab") as fh:
            fh.write(rng.randbytes(rng.randint(1, 64)))
        return f"extend {rel}"
    if kind == "json-huge":
        jsons = [p for p in files if p.suffix == ".json"]
        g = rng.choice(jsons) if jsons else f
        return f"{_huge_json(g, rng)} in {g.relative_to(store)}"
    if kind.startswith("json-"):
        return f"{_mutate_json(f, rng, kind[5:])} in {rel}"
    if kind == "fifo":
        _replace(f, os.mkfifo)
        return f"fifo {rel}"
    if kind == "symlink":
        target = rng.choice(
            [outside / "secret.bin", outside, Path("/dev/zero"), store / "missing", rng.choice(files), f.parent]
        )
        _replace(f, lambda p: p.symlink_to(target))
        return f"symlink {rel} -> {target.name}"
    if kind == "delete":
        f.unlink()
        return f"delete {rel}"
    if kind == "odd-file":
        where = rng.choice([p for p in store.rglob("*") if p.is_dir() and not p.is_symlink()] + [store])
        name = rng.choice([".DS_Store", "Thumbs.db", ".tmp-dead", "evil.py", "zarr.json.bak", "0"])
        while (where / name).exists():
            name += "x"
        (where / name).write_bytes(rng.randbytes(16))
        return f"odd-file {where.relative_to(store) / name}"
    if kind == "dir-for-file":
        _replace(f, lambda p: p.mkdir())
        return f"dir-for-file {rel}"
    if kind == "file-for-dir":
        d = f.parent
        if d == store:
            return f"{_flip(f, rng)} {rel}"
        shutil.rmtree(d)
        d.write_bytes(b"not a directory")
        return f"file-for-dir {d.relative_to(store)}"
    commits = [p for p in files if p.parent.name == "commits"]
    if kind in ("rename-commit", "copy-commit") and commits:
        c = rng.choice(commits)
        other = (
            c.parent / f"{rng.choice([n for n in ('x', 'w1-000000', 'fixture-000000', 'renamed') if n != c.stem])}.json"
        )
        (os.rename if kind == "rename-commit" else shutil.copyfile)(c, other)
        return f"{kind} {c.relative_to(store)} -> {other.name}"
    f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return f"chmod+x {rel}"


# another command at work in the store while the checks run: each leaves a folder that must outlive them
HELD: list[tuple[Path, Lease]] = []


def _concurrent(store: Path, rng: random.Random, kind: str) -> str:
    """A writer mid-unit (its lease held, some files written), a writer mid-claim (a locked temporary unit
    folder), or a store moved into a variant's units/ by hand; the folder goes into HELD."""
    units = sorted(p for p in store.glob("variants/*/units") if p.is_dir() and not p.is_symlink())
    if not units:
        return f"{_flip(rng.choice(_files(store)), rng)} (no units folder)"
    where = rng.choice(units)
    record = group_json(
        {
            layout.UNIT_ATTR: {
                "host": "h",
                "pid": os.getpid(),
                "writer": "busy",
                "started_at": "2000-01-01T00:00:00+00:00",
            }
        }
    )
    if kind == "in-flight-unit":
        name = f"busy-{rng.randrange(10**6):06d}"
        lease = LocalBackend(str(store)).claim(f"{where.relative_to(store)}/{name}/{layout.META}", record)
        assert lease is not None
        donor = next((u for u in sorted(where.iterdir()) if u.is_dir() and (u / "input_ids").is_dir()), None)
        if donor is not None:  # the arrays written so far
            shutil.copytree(donor / "input_ids", where / name / "input_ids")
        HELD.append((where / name, lease))
        return f"in-flight-unit {where.relative_to(store) / name}"
    if kind == "in-flight-claim":
        tmp = where / f"{layout.TMP_PREFIX}{rng.randrange(10**6):06d}"
        tmp.mkdir()
        fd = os.open(tmp / layout.META, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, record)
        HELD.append((tmp, Lease(fd)))
        return f"in-flight-claim {tmp.relative_to(store)}"
    inner = where / "inner"
    Store.create(store.parent / "inner.zarr")
    os.rename(store.parent / "inner.zarr", inner)
    HELD.append((inner / layout.META, Lease()))
    return f"nested-store {inner.relative_to(store)}"


def release_held() -> list[str]:
    """Release what _concurrent holds; the folders (or files) that did not outlive the checks."""
    gone = [str(p) for p, _ in HELD if not p.exists()]
    for _, lease in HELD:
        lease.release()
    HELD.clear()
    return gone


# ---- checks -------------------------------------------------------------------------------------------


def _within(fn: Callable[[], Any]) -> Any:
    def alarm(*_: Any) -> None:
        raise Hang(f"no answer within {TIMEOUT_S} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(TIMEOUT_S)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _reads(path: Path, truth: Truth) -> tuple[set[tuple[str, str]], list[str]]:
    """Samples read bit-identically through the reader and the dataset; wrong data is listed."""
    good: set[tuple[str, str]] = set()
    wrong: list[str] = []
    store = Store.open(path)
    store_info(store)
    for vid in store.variant_ids():
        try:
            r = store.reader(vid)
            r.check_corrupt_commits()
            ds = HiddenStateDataset(path, variant=vid)
        except HsstoreError:
            continue
        for i, k in enumerate(r.keys):
            try:
                mine = as_bytes(r.read(k))
                item = ds[i]
            except HsstoreError:
                continue
            want = truth.get((vid, k))
            if want is None or mine != want or not _same_item(item, want, r.record.layers, r.record.all_layers):
                wrong.append(f"{vid}/{k}: {'unknown sample served' if want is None else 'bytes differ'}")
            else:
                good.add((vid, k))
    return good, wrong


def _same_item(item: dict[str, Any], want: tuple[bytes, ...], roles: dict[str, list[int]], layers: list[int]) -> bool:
    """A dataset item (layers stacked by role) holds the bytes of the reader's layers."""
    if item["input_ids"].numpy().tobytes() != want[0]:
        return False
    for role in ("aux", "target"):
        for j, layer in enumerate(roles[role]):
            if (
                item[f"{role}_hidden"][:, j].contiguous().view(torch.uint8).numpy().tobytes()
                != want[2 + layers.index(layer)]
            ):
                return False
    return True


_COMMAND: list[Any] = []


def _cli(*argv: str) -> int:
    """The CLI's exit code for ``argv``, as hsstore.cli.main.main gives it (its click command is built
    once: typer takes 0.1 s to build it)."""
    if not _COMMAND:
        _COMMAND.append(typer.main.get_command(app))
    with contextlib.redirect_stdout(_io.StringIO()), contextlib.redirect_stderr(_io.StringIO()):
        try:
            rc = _COMMAND[0].main(args=list(argv), standalone_mode=False)
        except HsstoreError as e:
            return e.exit_code
        except typer.Exit as e:
            return e.exit_code
    return rc if isinstance(rc, int) else 0


class Failure(Exception):
    """A case broke a promise (a traceback, a hang, wrong data, lost data)."""


def _step(fn: Callable[[], Any]) -> tuple[bool, Any]:
    """(True, value) or (False, None) when hsstore refused with its own error; Failure otherwise."""
    try:
        return True, _within(fn)
    except HsstoreError:
        return False, None
    except Hang as e:
        raise Failure(f"hang: {e}") from None
    except Exception as e:  # noqa: BLE001 - exactly what the fuzzer is for: anything else is a traceback
        raise Failure(f"traceback: {type(e).__name__}: {str(e)[:200]}") from None


def _check(path: Path, truth: Truth) -> bool:
    """Every entry point on the mutated store; True if none refused. Failure on a broken promise."""
    clean, got = _step(lambda: _reads(path, truth))
    good, wrong = got if clean else (set(), [])
    if wrong:
        raise Failure(f"wrong data: {wrong[0]}")
    ok, result = _step(lambda: verify(Store.open(path)))
    if ok and result.ok and not clean:
        raise Failure("verify passed a store its readers refuse")
    clean &= ok and result.ok
    code = _step(lambda: _cli("info", str(path)))[1]  # (verify and gc are the library calls above and below)
    if code not in (0, 1, 2):
        raise Failure(f"info exited {code}")
    clean &= _step(lambda: collect_garbage(Store.open(path, mode="a"), force=True))[0]
    after = _step(lambda: _reads(path, truth))[1]
    after_good, wrong = after if after is not None else (set(), [])
    if wrong or not good <= after_good:
        raise Failure(f"gc lost committed data: {sorted(good - after_good)[:2]} {wrong[:1]}")
    return clean


def check(path: Path, outside: Path, truth: Truth) -> str:
    """The outcome of one mutated store: ``ok``, ``refused`` or ``FAIL: ...``."""
    secret = (outside / "secret.bin").read_bytes()
    try:
        outcome = "ok" if _check(path, truth) else "refused"
    except Failure as e:
        outcome = f"FAIL: {e}"
    if not (outside / "secret.bin").is_file() or (outside / "secret.bin").read_bytes() != secret:
        outcome = "FAIL: something outside the store changed"
    return outcome


def run(bases: list[Path], work: Path, seed: int, cases: int) -> tuple[Counter, list[str]]:
    """``cases`` seeded mutations, round-robin over the good stores ``bases``; (outcome counts, failures)."""
    truths = {b: snapshot(b) for b in bases}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is several times faster than a pool here
    counts: Counter = Counter()
    failures: list[str] = []
    for i in range(cases):
        rng = random.Random(seed * 1_000_003 + i)
        base = bases[i % len(bases)]
        case = work / f"case-{i}"
        store, outside = case / "s.zarr", case / "outside"
        shutil.copytree(base, store, symlinks=True)
        outside.mkdir()
        (outside / "secret.bin").write_bytes(b"outside the store")
        what = mutate(store, outside, rng)
        outcome = check(store, outside, truths[base])
        gone = release_held()
        if gone and not outcome.startswith("FAIL"):
            outcome = f"FAIL: gc removed what another command holds: {gone[0]}"
        counts[outcome.split(":")[0]] += 1
        if outcome.startswith("FAIL"):
            failures.append(f"seed {seed} case {i} ({what}): {outcome}")
        shutil.rmtree(case, ignore_errors=True)
    torch.set_num_threads(threads)
    return counts, failures
