"""Commands racing each other in real processes: ``python tests/racers.py ROLE STORE ARGS...``.

Each role runs until its work is done or a file named ``stop`` appears beside the store, then exits
0 (a report, if it has one, on stdout); any error ends it with the error on stderr and exit 1. ``start`` starts one in a process of
its own; ``stop_all`` ends them and returns their (exit code, stderr)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _stopped(store: Path) -> bool:
    return (store.parent / "stop").exists()


def _pause(rng: object) -> None:
    """A seeded pause between a soak role's passes (the soak shares the CPU with the build it races)."""
    time.sleep(rng.uniform(0.05, 0.3))  # type: ignore[attr-defined]


def writer(store: Path, units: int, seed: int) -> None:
    """Write ``units`` one-sample units of fresh samples into the store's first variant."""
    from hsstore import Store
    from hsstore.storage.writer import UnitWriter
    from hsstore.testing.factories import make_samples, make_states

    s = Store.open(store, mode="a")
    vid = s.io.list_dir("variants")[0]
    rec = s.variant_record(vid)
    w = UnitWriter(s, vid)
    for i in range(units):
        if _stopped(store):
            return
        samples = make_samples([8 + i % 5], seed=seed * 100_000 + i)
        w.write(samples, make_states(samples, rec.hidden_size, rec.dtype, rec.all_layers, seed=i))


def gc(store: Path, force: bool, grace: float) -> None:
    """gc in a loop until stopped."""
    from hsstore import Store
    from hsstore.storage.gc import collect_garbage

    s = Store.open(store, mode="a")
    while not _stopped(store):
        collect_garbage(s, grace_seconds=grace, force=force)


def import_folder(store: Path, fmt: str, folder: str, layers: str, capture: str) -> None:
    """One ``hsstore import`` of ``folder`` in units of one sample each; prints its report as JSON."""
    import json

    from interop_files import TOKENIZER

    from hsstore.interop.importer import ImportRequest, import_cache

    r = import_cache(
        ImportRequest(
            fmt,
            folder,
            str(store),
            tokenizer=TOKENIZER,
            num_layers=4,
            layers=layers,
            capture=capture,
            unit_tokens=1,
            jobs=1,
        )
    )
    print(json.dumps({k: r.to_dict()[k] for k in ("samples", "samples_written", "samples_present", "duplicates")}))


def soak_gc(store: Path, seed: int) -> None:
    """gc until stopped, each pass plain or ``--force --grace 0`` by the seed."""
    import random

    from hsstore import Store
    from hsstore.storage.gc import collect_garbage

    rng = random.Random(seed)
    s = Store.open(store, mode="a")
    while not _stopped(store):
        force = rng.random() < 0.5
        collect_garbage(s, grace_seconds=0.0 if force else rng.choice([0.0, 3600.0]), force=force)
        _pause(rng)


def soak_reader(store: Path, seed: int) -> None:
    """Open every variant afresh and read a few of its committed samples (every layer), until stopped."""
    import random

    from hsstore import Store

    rng = random.Random(seed)
    while not _stopped(store):
        s = Store.open(store)
        for vid in s.variant_ids():
            r = s.reader(vid)
            r.check_corrupt_commits()
            for key in rng.sample(r.keys, min(4, len(r.keys))):
                r.read(key)
        _pause(rng)


def soak_convert(store: Path, seed: int) -> None:
    """Derive (and keep resuming) the FP8 variant of the bf16 one, until stopped."""
    import random

    from hsstore.storage.convert import convert

    rng = random.Random(seed)
    while not _stopped(store):
        convert(f"{store}#dtype=bf16", "fp8-e4m3", workers=1 + seed % 2)
        _pause(rng)


def soak_export(store: Path, seed: int, folder: str) -> None:
    """Export the fp32 variant into one folder again and again with options drawn from the seed."""
    import random

    from hsstore.core.errors import BadInput
    from hsstore.interop.exporter import ExportRequest, export_cache

    rng = random.Random(seed)
    while not _stopped(store):
        # two slot choices that differ in their files (layer 1 as target with aux [0]: no target in aux)
        aux, target = rng.choice([(None, None), ([0], 1)])
        try:
            export_cache(
                ExportRequest(
                    f"{store}#dtype=fp32",
                    "specforge",
                    folder,
                    aux=aux,
                    target_layer=target,
                    limit=rng.choice([None, 3, 12]),
                    compress=rng.random() < 0.3,
                    jobs=2,
                )
            )
        except BadInput as e:  # soak_import is reading the folder: the expected answer, not an error
            if "read by an import" not in str(e):
                raise
        _pause(rng)


def soak_import(store: Path, seed: int, folder: str, into: str) -> None:
    """Import the export folder (while soak_export rewrites it) into another store, until stopped. An import
    refused because the folder is being written or never finished is the expected answer, not an error."""
    import random

    from interop_files import TOKENIZER

    from hsstore.core.errors import BadInput
    from hsstore.interop.importer import ImportRequest, import_cache

    rng = random.Random(seed)
    while not _stopped(store):
        if Path(folder, "hsstore-export.json").is_file():
            try:
                import_cache(ImportRequest("specforge", folder, into, tokenizer=TOKENIZER, jobs=1, quiet=True))
            except BadInput as e:
                if "being written by an `hsstore export`" not in str(e) and "never finished" not in str(e):
                    raise
        _pause(rng)


def start(role: str, store: Path, *args: object) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    return subprocess.Popen(
        [sys.executable, __file__, role, str(store), *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_all(store: Path, procs: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str]]:
    """Ask every racer to stop (they finish the step they are in) and collect (exit code, stderr)."""
    (store.parent / "stop").touch()
    out = []
    for p in procs:
        err = p.communicate(timeout=timeout)[1]
        out.append((p.returncode, err))
    return out


def wait(procs: list[subprocess.Popen], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        p.wait(timeout=max(1.0, deadline - time.monotonic()))


if __name__ == "__main__":
    role, path, *rest = sys.argv[1:]
    try:
        if role == "writer":
            writer(Path(path), int(rest[0]), int(rest[1]))
        elif role == "gc":
            gc(Path(path), rest[0] == "force", float(rest[1]))
        elif role == "import":
            import_folder(Path(path), *rest)
        elif role in ("soak_gc", "soak_reader", "soak_convert"):
            globals()[role](Path(path), int(rest[0]))
        elif role == "soak_export":
            soak_export(Path(path), int(rest[0]), rest[1])
        elif role == "soak_import":
            soak_import(Path(path), int(rest[0]), rest[1], rest[2])
        else:
            raise SystemExit(f"unknown role {role}")
    except Exception as e:  # noqa: BLE001 - the race's outcome, reported to the test
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
