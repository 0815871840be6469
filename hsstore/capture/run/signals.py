"""Stopping a build on SIGTERM, SIGINT or SIGHUP without leaving a worker behind.

The driver runs each worker in its own process group. The first stop signal raises ``Stopped`` in the
driver's main thread (a BaseException, so no ``except Exception`` on the way swallows it; the driver
turns it into BuildInterrupted with what was committed); on the way out the driver sends the worker's group SIGTERM, waits up to
``HSSTORE_STOP_GRACE`` seconds (default 10), then sends SIGKILL — a second signal skips the wait.
A worker whose driver is gone (even SIGKILLed) exits by itself: on Linux the kernel sends it SIGHUP
when its parent dies (PR_SET_PDEATHSIG), and everywhere a watchdog thread notices the parent pid
change within half a second; either way it removes the driver's temporary folder and exits.
A driver and worker killed together (SIGKILL to the group, an OOM kill of the job's cgroup) leave the
folder behind: it records its owner, and the next build on the host removes the folders of owners
that are gone (``sweep_stale_temps``).

Ctrl-Z (SIGTSTP) suspends the worker with the driver, and continuing the driver continues it.

A build stopped by a signal exits with 128 + the signal's number (143 SIGTERM, 130 SIGINT, 129
SIGHUP), as a shell reports a process killed by it. Committed units are never at risk: a worker
killed at any moment loses only its uncommitted unit.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypedDict

from hsstore.core.interrupt import Stopped  # one class for every command: the driver catches it from there

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
TEMP_PREFIX = "hsstore-build-"  # the driver's temporary folder (a worker removes only such a folder)
OWNER_FILE = "owner.json"  # in it: which process made it (ProcessId)
WATCH_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1


class _State(TypedDict):
    stopping: bool  # a stop signal came
    hurry: bool  # a second one came: skip the grace period
    worker: int | None  # the running worker's pid (its process group)


_state: _State = {"stopping": False, "hurry": False, "worker": None}


def grace_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get("HSSTORE_STOP_GRACE", "10")))
    except ValueError:
        return 10.0


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """While active: the first stop signal raises Stopped in the main thread; later ones make
    ``stop_worker`` skip its grace period. Outside the main thread (a library caller's thread) it does
    nothing: Python delivers signals to the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if _state["stopping"]:
            _state["hurry"] = True
            return
        _state["stopping"] = True
        raise Stopped(signum)

    _state.update({"stopping": False, "hurry": False})
    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    old[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, _suspend)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _state.update({"stopping": False, "hurry": False})


def _suspend(signum: int, frame: FrameType | None) -> None:
    """Ctrl-Z: the worker (in its own process group, out of the terminal's reach) is stopped with the
    driver, and continued when the driver is (``fg``, ``bg``, SIGCONT)."""
    worker = _state["worker"]
    if worker is not None:
        _signal_group(worker, signal.SIGSTOP)
    signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTSTP)  # the driver stops here until it is continued
    signal.signal(signal.SIGTSTP, _suspend)
    if worker is not None:
        _signal_group(worker, signal.SIGCONT)


def run_worker(argv: Sequence[str], env: dict[str, str]) -> int:
    """Run a worker in its own process group and wait for it; if the wait ends by an exception (a stop
    signal, anything), stop the worker before passing the exception on."""
    proc = subprocess.Popen(list(argv), env=env, start_new_session=True)
    _state["worker"] = proc.pid
    try:
        return proc.wait()
    finally:
        if proc.returncode is None:
            stop_worker(proc)
        _state["worker"] = None


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the worker's group, the grace period (cut short by a second stop signal), then SIGKILL."""
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds()
    while proc.poll() is None and time.monotonic() < deadline and not _state["hurry"]:
        try:
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)  # whatever is left of the group, the worker's children too
    proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def exit_with_parent(parent_pid: int, temp: str | os.PathLike[str] | None = None) -> None:
    """In a worker: exit at once on SIGTERM (the driver stopping it), and exit removing the driver's
    temporary folder ``temp`` when the driver is gone. The kernel reports the parent's death as SIGHUP
    (PR_SET_PDEATHSIG), a signal of its own: it can come while the dying driver's other threads still
    hold its pid, so the worker cannot tell it from a stop by asking for its parent's pid."""

    def leave(code: int) -> None:
        if temp is not None and Path(temp).name.startswith(TEMP_PREFIX):
            shutil.rmtree(temp, ignore_errors=True)
        os._exit(code)

    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))
    signal.signal(signal.SIGHUP, lambda signum, frame: leave(128 + signum))
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGHUP), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still works
    if os.getppid() != parent_pid:  # the driver died before the line above
        leave(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(WATCH_SECONDS)
        leave(1)

    threading.Thread(target=watch, name="hsstore-parent-watchdog", daemon=True).start()


# --- The driver's temporary folder: it names its owner, so a folder whose owner was killed outright is removed


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def process_id(pid: int) -> dict[str, Any]:
    """What names process ``pid`` beyond its number: the host, this boot, the pid namespace and when the process
    started (clock ticks since boot; None where /proc does not say)."""
    stat = _read(f"/proc/{pid}/stat")
    try:
        started = int(stat.rsplit(")", 1)[1].split()[19]) if stat else None  # field 22, starttime
    except (IndexError, ValueError):
        started = None
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = None
    return {
        "host": socket.gethostname(),
        "boot": _read("/proc/sys/kernel/random/boot_id"),
        "pidns": pidns,
        "pid": pid,
        "started": started,
    }


def owner_gone(owner: Any, here: dict[str, Any] | None = None) -> bool:
    """Whether the process ``owner`` (a ``process_id``) has certainly ended: in this host's boot and pid namespace,
    no such pid, or a pid now taken by a later process. Anything this process cannot tell (another host, boot,
    container or sandbox sharing the folder and the host name, an unreadable record) counts as alive: a reboot
    cannot be told from another sandbox's boot, so a folder left by one stays. ``here``: this process's
    ``process_id`` (read once by a caller judging many owners)."""
    here = here or process_id(os.getpid())
    if not isinstance(owner, dict) or any(owner.get(k) != here[k] for k in ("host", "boot", "pidns")):
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    now = process_id(pid)["started"]
    return owner.get("started") is not None and now is not None and now != owner["started"]


def sweep_stale_temps(folder: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove the driver folders (``TEMP_PREFIX``*) in ``folder`` (default: the temporary folder) whose owner is
    gone (``owner_gone``); returns the removed paths. A folder without a readable owner record (being made, or
    by hsstore before it wrote one) and anything that is not a real folder stay."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(folder or tempfile.gettempdir()))
    except OSError:
        return removed
    here = process_id(os.getpid())
    for entry in entries:
        if not entry.name.startswith(TEMP_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        raw = _read(os.path.join(entry.path, OWNER_FILE))
        try:
            owner = json.loads(raw) if raw else None
        except ValueError:
            owner = None
        if owner_gone(owner, here):
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                removed.append(entry.path)
    return removed


@contextmanager
def owned_temp() -> Iterator[str]:
    """A new driver folder in the temporary folder, naming this process as its owner; removed on the way out."""
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, ignore_cleanup_errors=True) as tmp:
        Path(tmp, OWNER_FILE).write_text(json.dumps(process_id(os.getpid())))
        yield tmp
