from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# idle OpenMP threads sleep instead of spinning (read when torch loads: set before the first import of it, here
# and in every child): two xdist workers' thread pools share two cores, and spinning threads burned ~20 % of a
# build's CPU time under that load (docs/testing.md). How threads wait changes no result.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from helpers import run_cli, shared_dir, write_manifest  # noqa: E402

from hsstore.capture.model.kernels import force_backend  # noqa: E402
from hsstore.testing.bench import moto_s3  # noqa: E402

# models loaded in this process run on the CPU, where fla's triton kernels cannot: bind transformers'
# reference kernels even where fla is installed (backend-specific tests build in subprocesses)
force_backend("torch")


_launched = {"n": 0}
_popen_init = subprocess.Popen.__init__


def _counting_init(self: subprocess.Popen, args: object, *a: object, **k: object) -> None:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)  # type: ignore[call-overload]
    if argv and os.path.basename(str(argv[0])).startswith(("python", "torchrun")) and "moto.server" not in argv:
        _launched["n"] += 1
    _popen_init(self, args, *a, **k)


subprocess.Popen.__init__ = _counting_init  # type: ignore[method-assign]  # counted, see _count_launches


@pytest.fixture(autouse=True)
def _count_launches(request: pytest.FixtureRequest):
    """How many Python processes each test started through subprocess (its fixtures' included, the moto S3
    server not), for the summary below: interpreter starts were most of the suite's cost, and
    docs/testing.md says which tests need them."""
    before, t0 = _launched["n"], os.times()
    yield
    t1 = os.times()
    cpu = sum(t1[:4]) - sum(t0[:4])  # this process's and its reaped children's user + system seconds
    request.node.user_properties += [("python_launches", _launched["n"] - before), ("cpu_seconds", cpu)]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``process`` run first on both xdist workers (order otherwise kept): they are the long ones (a
    minute or more of wall time each, much of it waiting on their processes), and collected last —
    ``tests/scenarios``, ``tests/storage`` — they left one worker running the S3 or SIGKILL test alone while the other
    had nothing left. ``--dist worksteal`` (scripts/test.sh) first gives each worker one contiguous half of the
    tests, so each half begins with every other process test, then its share of the ~1,200 short ones, which fill
    in behind; a worker that runs out takes half of the other's queue (xdist's default "load" sent the first 1/8
    of the tests, all of these, to one worker)."""
    procs = [i for i in items if i.get_closest_marker("process") is not None]
    rest = [i for i in items if i.get_closest_marker("process") is None]
    first_half = len(items) // 2 - len(procs[0::2])  # the short tests in the first worker's half
    items[:] = procs[0::2] + rest[:first_half] + procs[1::2] + rest[first_half:] if first_half >= 0 else procs + rest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The Python processes the tests started, which tests not marked ``process`` did, and where the CPU
    time went (not counting session fixtures, which are set up before any test's own fixtures)."""
    counts: dict[str, int] = {}
    cpu: dict[str, float] = {}
    marked: set[str] = set()
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) == "teardown":
                counts[r.nodeid] = dict(r.user_properties).get("python_launches", 0)
                cpu[r.nodeid] = dict(r.user_properties).get("cpu_seconds", 0.0)
                if "process" in r.keywords:
                    marked.add(r.nodeid)
    if not counts:
        return
    unmarked = sorted((n, t) for t, n in counts.items() if n and t not in marked)
    line = (
        f"python processes started by tests: {sum(counts.values())} ({sum(counts[t] for t in marked)} by "
        f"tests marked process); unmarked tests that started some: {len(unmarked)}"
    )
    terminalreporter.write_line(line)
    for n, t in unmarked[::-1][:20]:
        terminalreporter.write_line(f"  {n:3d}  {t}")
    terminalreporter.write_line(
        f"CPU seconds of the tests (with their processes): {sum(cpu.values()):.0f}, "
        f"{sum(cpu[t] for t in marked):.0f} in tests marked process; the most:"
    )
    for t, c in sorted(cpu.items(), key=lambda kv: -kv[1])[: int(os.environ.get("HSSTORE_TOP_CPU", 15))]:
        terminalreporter.write_line(f"  {c:6.1f}  {t}")


def _build_tiny(d: Path) -> None:
    m = write_manifest(d / "m.toml", dtypes='["bf16", "fp32"]', layers="{ aux = [0, 1], target = [3] }")
    r = run_cli("build", str(m), "--limit", "40", "--quiet")
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store built by the CLI from the bundled data: tiny hybrid model, bf16 and fp32 variants."""
    return shared_dir(tmp_path_factory, "tiny", _build_tiny) / "store.zarr"


@pytest.fixture(scope="session")
def attn_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store of one tiny llama in three variants: bf16 with sdpa and with eager attention (two
    kernels of one recipe, the kind of pair diff exists for) and the fp32 sdpa floor."""
    return shared_dir(tmp_path_factory, "attn", _build_attn) / "store.zarr"


def _build_attn(d: Path) -> None:
    layers = "{ aux = [0, 1], target = [3] }"
    sdpa = write_manifest(d / "sdpa.toml", model="builtin:tiny-llama", dtypes='["bf16", "fp32"]', layers=layers)
    eager = write_manifest(
        d / "eager.toml",
        model="builtin:tiny-llama",
        dtypes='["bf16"]',
        layers=layers,
        extra_model='attn_implementation = "eager"',
    )
    for m in (sdpa, eager):
        r = run_cli("build", str(m), "--limit", "40", "--quiet")
        assert r.returncode == 0, r.stderr


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A moto S3 server on 127.0.0.1 and a bucket (tests need s3fs and moto, the test extras); AWS_*
    variables point every client (and child) at it."""
    pytest.importorskip("s3fs", reason="s3fs is part of the test extras (pip install -e '.[test]')")
    with moto_s3("hsstore-test", tmp_path_factory.mktemp("moto") / "moto.log") as url:
        yield url
