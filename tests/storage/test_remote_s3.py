"""Object storage: build -> verify -> dataset -> diff against s3:// on a real S3-protocol server
(moto's server mode, started on loopback by the test), with concurrent and killed writers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import torch
from helpers import assert_bit_exact, build_racing, children, kill_build, run_cli, start_build, wait_for
from torch.utils.data import DataLoader

from hsstore import HiddenStateDataset, Store, StreamingHiddenStateDataset
from hsstore.core.errors import StoreNotFound
from hsstore.storage import layout
from hsstore.storage.verify import verify

pytestmark = pytest.mark.process  # see docs/testing.md

pytest.importorskip("s3fs", reason="s3fs is part of the test extras (pip install -e '.[test]')")


def _build(manifest: Path, store: str, *extra: str) -> subprocess.Popen:
    return start_build(manifest, "--store", store, "--limit", "40", "--dtype", "bf16", *extra)


def _committed(url: str) -> int:
    """Samples committed in the store at ``url`` so far (0 while it does not exist yet)."""
    try:
        return sum(v.n_samples for v in Store.open(url).variants)
    except StoreNotFound:
        return 0


def _uncommitted(url: str) -> set[str]:
    """Units (``vid/uid``) in the store at ``url`` without a commit record: writes in progress, or a killed
    writer's debris (none while the store does not exist yet)."""
    try:
        io = Store.open(url).io
    except StoreNotFound:
        return set()
    vids = [v for v in io.list_dir(layout.variants_dir()) if v != layout.META]
    return {
        f"{v}/{u}"
        for v in vids
        for u in io.list_dir(layout.units_dir(v))
        if u != layout.META and not io.exists(layout.commit_key(v, u))
    }


def _frozen_mid_unit(p: subprocess.Popen, url: str) -> set[str]:
    """Stop the build ``p`` (driver and worker, SIGSTOP) at a moment it has committed a unit and is writing
    another: the units it has half-written then. (Seen first and killed after, the unit could commit in
    between: frozen, what is seen stays; a moment between units is let go and waited for again.)"""
    while True:
        wait_for(
            lambda: (_committed(url) > 0 and _uncommitted(url)) or p.poll() is not None,
            what="the build's first commit while its next unit is being written",
        )
        assert p.poll() is None, "the build finished before it could be stopped"
        groups = [p.pid, *children(p.pid)]  # each in a process group of its own (kill_build)
        _signal_groups(groups, signal.SIGSTOP)
        time.sleep(0.2)  # requests already sent land
        debris = _uncommitted(url)
        if debris:
            return debris
        _signal_groups(groups, signal.SIGCONT)


def _signal_groups(groups: list[int], sig: int) -> None:
    for g in groups:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.killpg(g, sig)


def test_s3_concurrent_writers_verify_read_diff_and_a_killed_writer(s3: str, tiny_store: Path, tmp_path: Path):
    """Two writers (a build process and this one) build one s3 store at once; verify, info, diff and both
    datasets read it; then a writer killed mid-build is resumed (here) and gc removes exactly its debris.
    (One test: each build process costs ~10 s of CPU.)"""
    manifest = tiny_store.parent / "m.toml"
    url = f"{s3}/{uuid.uuid4().hex[:8]}/conc.zarr"
    # a build process, and this process building the same once the other has committed a unit
    p = _build(manifest, url)
    here = build_racing(
        [p], lambda: _committed(url) > 0, str(manifest), "--store", url, "--limit", "40", "--dtype", "bf16", "--quiet"
    )
    assert p.wait(timeout=300) == 0 and here.returncode == 0, (p.stderr.read().decode()[-1000:], here.stderr)
    assert run_cli("verify", url).returncode == 0
    info = json.loads(run_cli("info", url, "--json").stdout)
    assert [v["n_samples"] for v in info["variants"]] == [40]
    assert_bit_exact(url, f"{tiny_store}#dtype=bf16", 40)  # the same states as the local build
    ds = HiddenStateDataset(url, require=f"{tiny_store}#dtype=bf16")
    local = HiddenStateDataset(tiny_store, variant="dtype=bf16")
    item = ds[3]
    assert torch.equal(item["target_hidden"], local.reader.read(item["key"])["layers"][3][:, None])
    stream = StreamingHiddenStateDataset(url, batch_tokens=2048)
    assert stream.prefetch > 0  # remote: reads run ahead on threads
    keys = [k for b in DataLoader(stream, batch_size=None, num_workers=2) for k in b["key"]]
    assert sorted(keys) == sorted(ds.keys)

    # a writer killed after its first commit (small units, so it is mid-build), then resumed
    small = tmp_path / "m-small-units.toml"  # (the session's tiny store is shared: nothing is written there)
    small.write_text(
        manifest.read_text()
        .replace("token_budget = 2048", "token_budget = 600")
        .replace("unit_tokens = 2048", "unit_tokens = 300")
    )
    killed = f"{s3}/{uuid.uuid4().hex[:8]}/killed.zarr"
    p = _build(small, killed)
    debris = _frozen_mid_unit(p, killed)  # the units the killed writer leaves half-written
    kill_build(p)  # the driver and its worker at once
    assert _uncommitted(killed) == debris
    partial = Store.open(killed).variants[0].n_samples
    assert 0 < partial < 40 and verify(Store.open(killed)).ok
    # the resume, in this process (the kill was the process's subject)
    resumed = run_cli("build", str(small), "--store", killed, "--limit", "40", "--dtype", "bf16", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    reader = Store.open(killed).reader(Store.open(killed).variant_ids()[0])
    assert len(reader.keys) == len(set(reader.keys)) == 40
    gc = json.loads(run_cli("gc", killed, "--json").stdout)
    assert sorted(gc["removed_units"]) == sorted(debris)  # the killed writer's units: none committed, none missed
    assert not _uncommitted(killed)
    assert verify(Store.open(killed)).ok and Store.open(killed).variants[0].n_samples == 40


def test_a_server_gone_mid_read_is_one_network_error_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server killed while a reader is open: reads raise StoreUnreachable (retried, bounded), never
    CorruptData "fails a checksum"; `hsstore verify` stops at the first network error with one line, exit 1,
    instead of reporting every sample as a problem. A map-style dataset reading in order, whose next sample's
    fetch ahead met the dead server, raises that fetch's error: it does not try the server all over again
    from the reading thread (the error came twice as late)."""
    import threading

    import s3fs

    from hsstore.core.errors import CorruptData, StoreUnreachable
    from hsstore.read import prefetch_reads
    from hsstore.storage import remote
    from hsstore.testing.bench import kill_server, moto_s3
    from hsstore.testing.factories import new_variant, write_unit

    monkeypatch.setattr(prefetch_reads, "MIN_BYTES", 0)  # these samples are small: look ahead all the same ...
    monkeypatch.setattr(prefetch_reads, "MAX_SAMPLES", 1)  # ... one sample ahead
    gave_up_in: list[str] = []  # the threads that tried the dead server until they gave up
    real = remote.unreachable
    monkeypatch.setattr(
        remote, "unreachable", lambda *a: gave_up_in.append(threading.current_thread().name) or real(*a)
    )

    # fsspec caches clients by their options, not by the endpoint (read from the environment): this server
    # gets clients of its own, and no later test gets one of the dead server's
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with moto_s3("hsstore-gone", tmp_path / "moto.log") as bucket:
            url = f"{bucket}/s.zarr"
            s = Store.create(url)
            vid = new_variant(s)
            for seed in range(3):
                write_unit(s, vid, [4, 5], seed=seed)
            reader = Store.open(url).reader(vid)
            assert verify(Store.open(url)).ok
            ds = HiddenStateDataset(url)
            ds[0], ds[1]  # in order: sample 2 is fetched ahead
            ds._lookahead().ahead[2].result()
            kill_server(bucket)
            with pytest.raises(StoreUnreachable, match="did not answer .* not known to be damaged") as e:
                reader.read_tokens(reader.ref(0))
            assert not isinstance(e.value, CorruptData)
            assert ds[2]["key"] == ds.keys[2]  # fetched before the server went: read from there
            gave_up_in.clear()
            with pytest.raises(StoreUnreachable, match="did not answer"):
                ds[3]  # its fetch ahead met the dead server
            assert gave_up_in and threading.main_thread().name not in gave_up_in, gave_up_in
            r = run_cli("verify", url)
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(errors) == 1 and "did not answer" in errors[0], r.stderr
    assert "checksum" not in r.stderr and "problem" not in r.stdout + r.stderr


def test_a_bucket_that_vanished_mid_build_is_named_with_its_fix(s3: str) -> None:
    """A build whose bucket was deleted under it advised "Free space (or raise the file-size limit)": the write's
    failure names the missing bucket and says to create it or choose another --store."""
    import boto3

    from hsstore.core.errors import HsstoreError
    from hsstore.storage.writer import UnitWriter
    from hsstore.testing.factories import make_samples, make_states, store_with_unit

    bucket = f"vanish-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    store, vid, _, _ = store_with_unit(f"s3://{bucket}/s.zarr", [4, 5], hidden=32, chunk=16)
    writer = UnitWriter(store, vid, writer_id="w2")
    for o in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=o["Key"])
    client.delete_bucket(Bucket=bucket)
    samples = make_samples([6, 7], seed=1)
    with pytest.raises(HsstoreError) as e:
        writer.write(samples, make_states(samples, 32, "bf16", [0, 1, 2]))
    msg = str(e.value)
    assert (
        e.value.exit_code == 1
        and "\n" not in msg
        and bucket in msg
        and "does not exist" in msg
        and "create the bucket" in msg
    ), msg
    assert "free space" not in msg.lower() and "file-size limit" not in msg, msg


@pytest.mark.parametrize("doc", ["variant", "array"])
def test_verify_names_unreadable_metadata_on_s3(s3: str, doc: str) -> None:
    """The same tree check on an object store: non-JSON in a variant's (or an array's) zarr.json, with no
    commit records, is a problem naming the key (it verified OK)."""
    from helpers import garbage_metadata

    from hsstore.testing.factories import crashed_unit, store_with_unit

    url = f"{s3}/{uuid.uuid4().hex[:8]}/meta.zarr"
    s, vid, _, _ = store_with_unit(url, [6, 9, 4], seed=4, hidden=16, chunk=8)
    crashed_unit(s, vid, [3], seed=5)
    key = garbage_metadata(s.io, vid, doc, commits=False)
    result = verify(Store.open(url))
    assert not result.ok and any(key in p.what for p in result.problems), (key, result.problems)
