"""Compiled loops are an optimisation: numba's run where their machine code cannot be saved; the C library is built
once per CPU and loaded from the cache after, and where no compiler builds it torch's ops serve."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
CHECK = """
import warnings
import numpy as np, torch
from hsstore.compare.kernel import Workspace, compiled_kernel, token_sums
from hsstore.core.quant import _compiled_kernel, dequantize_bf16_bits
codes = np.arange(256, dtype=np.uint8).reshape(4, 64)
a = dequantize_bf16_bits(codes, np.full((4, 1), 2.0, np.float32))
b = dequantize_bf16_bits(codes, np.full((4, 1), 2.0, np.float32), compiled=False)
assert (a == b).all()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert compiled_kernel() is False
assert len(caught) == 1 and "C loops of diff, check and audit were not built" in str(caught[0].message), [str(w.message) for w in caught]
x = torch.tensor([[0.0, -2.5, 1.0], [0.0, 0.0, 3.0]])
ts = token_sums([x], [torch.zeros_like(x)], Workspace("cpu", compiled=True))
assert ts.differing[0].tolist() == [2, 1] and ts.max_abs[0].tolist() == [2.5, 3.0], ts
print("ok", _compiled_kernel()._cached)
"""


def _tiny_files_only() -> None:
    """Files up to 256 bytes (what tempfile's probe writes); a larger write fails with EFBIG."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256, resource.RLIM_INFINITY))


@pytest.mark.process  # a file-size limit is set on a process of its own
def test_loops_run_where_their_machine_code_cannot_be_saved(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
        "HSSTORE_CACHE_DIR": str(tmp_path / "native"),
        "PYTHONPATH": str(REPO),
    }
    r = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, preexec_fn=_tiny_files_only, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    # numba's save failed, so its loops were compiled in process; the C library could not be written at all, so the
    # diff's torch ops served (with one warning)
    assert r.stdout.split() == ["ok", "False"]


def _fresh_loops(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    from hsstore.compare import kernel

    monkeypatch.setenv("HSSTORE_CACHE_DIR", str(cache))
    monkeypatch.setattr(kernel, "_kernel", None)


def _diff_once() -> list[float]:
    from hsstore.compare.kernel import Workspace, token_sums

    x = torch.tensor([[0.0, -2.5, 1.0], [0.0, 0.0, 3.0]])
    ts = token_sums([x], [torch.zeros_like(x)], Workspace("cpu", compiled=True))
    return ts.differing[0].tolist()


def test_the_c_loops_are_built_once_and_then_loaded_even_without_a_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hsstore.compare import kernel
    from hsstore.core.jit import library_path

    _fresh_loops(monkeypatch, tmp_path / "cache")
    built = library_path(kernel.SOURCE)
    assert not built.exists()
    assert kernel.compiled_kernel() and _diff_once() == [2, 1]
    assert built.is_file() and sorted(p.name for p in built.parent.iterdir()) == [built.name, built.name + ".xxh64"]
    stamp = built.stat().st_mtime_ns
    monkeypatch.setattr(kernel, "_kernel", None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler at all
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert kernel.compiled_kernel() and _diff_once() == [2, 1]  # loaded from the cache, not built again
    assert built.stat().st_mtime_ns == stamp


def test_a_damaged_cached_library_is_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hsstore.compare import kernel
    from hsstore.core.jit import library_path

    _fresh_loops(monkeypatch, tmp_path / "cache")
    built = library_path(kernel.SOURCE)
    built.parent.mkdir(parents=True)
    built.write_bytes(b"\x7fELF cut short")
    assert kernel.compiled_kernel() and _diff_once() == [2, 1]
    assert built.stat().st_size > 1000


def test_a_cache_folder_that_cannot_be_written_builds_a_library_for_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hsstore.compare import kernel

    (tmp_path / "a-file").write_text("")
    _fresh_loops(monkeypatch, tmp_path / "a-file" / "cache")  # mkdir fails: NotADirectoryError
    assert kernel.compiled_kernel() and _diff_once() == [2, 1]


def test_without_a_compiler_torchs_ops_serve_with_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hsstore.compare import kernel

    _fresh_loops(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    with pytest.warns(UserWarning, match=r"C loops of diff, check and audit were not built \(no C compiler found"):
        assert kernel.compiled_kernel() is False
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert kernel.compiled_kernel() is False
    assert again == []  # one warning a process, not one a sample
    assert _diff_once() == [2, 1]


def test_a_compiler_that_fails_is_named_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hsstore.compare import kernel

    cc = tmp_path / "broken-cc"
    cc.write_text("#!/bin/sh\necho 'broken-cc: cannot exec the assembler' >&2\nexit 1\n")
    cc.chmod(0o755)
    _fresh_loops(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("CC", str(cc))
    with pytest.warns(UserWarning, match="broken-cc could not compile kernel.c: broken-cc: cannot exec the assembler"):
        assert kernel.compiled_kernel() is False


def test_a_cached_library_cut_short_is_built_again_not_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library file cut short (a crash before it reached the disk) killed every process that mapped it (SIGBUS):
    its bytes are checked against the hash kept beside it first."""
    from hsstore.compare import kernel
    from hsstore.core.jit import library_path

    _fresh_loops(monkeypatch, tmp_path / "cache")
    assert kernel.compiled_kernel()
    built = library_path(kernel.SOURCE)
    cut = built.with_name("cut")  # a new file in its place, as a later process finds it (this one maps the old)
    cut.write_bytes(built.read_bytes()[:5000])
    os.replace(cut, built)
    monkeypatch.setattr(kernel, "_kernel", None)
    assert kernel.compiled_kernel() and _diff_once() == [2, 1]
    assert built.stat().st_size > 5000


def test_a_cache_folder_others_may_write_is_never_loaded_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library planted where another user could write (a shared cache folder) would run as whoever loads it: such a
    folder is not used; the library is built privately and nothing is written there."""
    from hsstore.compare import kernel
    from hsstore.core.jit import library_path

    _fresh_loops(monkeypatch, tmp_path / "cache")
    planted = library_path(kernel.SOURCE)
    planted.parent.mkdir(parents=True)
    planted.parent.chmod(0o777)
    (planted.parent / "planted.c").write_text(
        "#include <stdlib.h>\n__attribute__((constructor)) static void f(void) { abort(); }\n"
    )
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(planted), str(planted.parent / "planted.c")], check=True)
    from hsstore.core.jit import _digest

    (planted.parent / (planted.name + ".xxh64")).write_text(_digest(planted.read_bytes()))  # even with its hash
    before = sorted(p.name for p in planted.parent.iterdir())
    assert kernel.compiled_kernel() and _diff_once() == [2, 1]  # (loading the planted one would abort)
    assert sorted(p.name for p in planted.parent.iterdir()) == before


def test_cc_is_split_as_a_shell_would_and_one_that_is_not_there_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hsstore.compare import kernel

    _fresh_loops(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("CC", "env cc")  # a wrapper with arguments, as `ccache gcc`
    assert kernel.compiled_kernel() and _diff_once() == [2, 1]
    _fresh_loops(monkeypatch, tmp_path / "other-cache")
    monkeypatch.setenv("CC", "no-such-cc -O2")
    with pytest.warns(UserWarning, match=r"\$CC='no-such-cc -O2' is not a command here"):
        assert kernel.compiled_kernel() is False


def test_a_compiler_that_writes_nothing_or_hangs_is_given_up_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CC=true`` exits 0 and writes no library; a compiler that hangs is stopped (its children too) after
    ``COMPILE_SECONDS``; either way one warning, and torch's ops serve."""
    from hsstore.compare import kernel
    from hsstore.core import jit

    _fresh_loops(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("CC", "true")
    with pytest.warns(UserWarning, match="could not compile kernel.c: exit 0 and no library written"):
        assert kernel.compiled_kernel() is False
    hang = tmp_path / "hang-cc"
    hang.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {tmp_path / 'child'}\nwait\n")
    hang.chmod(0o755)
    _fresh_loops(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("CC", str(hang))
    monkeypatch.setattr(jit, "COMPILE_SECONDS", 1)
    with pytest.warns(UserWarning, match="did not compile kernel.c in 1 s"):
        assert kernel.compiled_kernel() is False
    child = int((tmp_path / "child").read_text())
    for _ in range(100):  # (killed at once; reaped by init a moment later)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the compiler's child {child} outlived the timeout")


def test_whatever_keeps_the_loops_from_loading_falls_back_to_torch_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Errors the loader did not expect crashed the diff (exit 1, a traceback): a hash file of garbage, CC with an
    unbalanced quote, a compiler writing Latin-1 to stderr, a library without the loops' symbols, no home folder."""
    from hsstore.compare import kernel
    from hsstore.core.jit import library_path

    _fresh_loops(monkeypatch, tmp_path / "cache")
    assert kernel.compiled_kernel()
    built = library_path(kernel.SOURCE)
    built.with_name(built.name + ".xxh64").write_bytes(b"\xff\xfe")  # not even UTF-8: built again
    monkeypatch.setattr(kernel, "_kernel", None)
    assert kernel.compiled_kernel() and _diff_once() == [2, 1]

    latin1 = tmp_path / "latin1-cc"
    latin1.write_text("#!/bin/sh\nprintf 'erreur: \\351chec\\n' >&2\nexit 1\n")
    empty = tmp_path / "empty-cc"  # compiles an empty file wherever -o says: a library without the symbols
    empty.write_text(
        '#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n'
        'printf "int unrelated;\\n" | cc -x c -shared -fPIC -o "$out" -\n'
    )
    for script in (latin1, empty):
        script.chmod(0o755)
    cases = [
        ("CC", "gcc '-O2", "does not parse as a command"),
        ("CC", str(latin1), "could not compile kernel.c: erreur"),
        ("CC", str(empty), "AttributeError: .*undefined symbol: hsstore_fused_rows"),
    ]
    for n, (var, value, said) in enumerate(cases):
        _fresh_loops(monkeypatch, tmp_path / f"cache-{n}")
        monkeypatch.setenv(var, value)
        with pytest.warns(UserWarning, match=said):
            assert kernel.compiled_kernel() is False
        assert _diff_once() == [2, 1]
    monkeypatch.delenv("CC")
    monkeypatch.delenv("HSSTORE_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(kernel, "_kernel", None)
    monkeypatch.setattr(
        Path, "home", lambda: (_ for _ in ()).throw(RuntimeError("Could not determine home directory."))
    )
    with pytest.warns(UserWarning, match="no cache folder: Could not determine home directory"):
        assert kernel.compiled_kernel() is False


def test_the_cache_folder_is_absolute_and_its_tilde_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hsstore.core.jit import cache_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HSSTORE_CACHE_DIR", "relative/cache")
    assert cache_dir() == tmp_path / "relative" / "cache"
    monkeypatch.setenv("HSSTORE_CACHE_DIR", "~/hcache")
    assert cache_dir() == Path.home() / "hcache"
