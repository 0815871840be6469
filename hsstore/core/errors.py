"""One error hierarchy for hsstore; every message names the offending thing and the fix."""

from __future__ import annotations

import errno
from collections.abc import Sequence


class HsstoreError(Exception):
    """Root of every error hsstore raises on purpose."""

    exit_code = 2
    multiline = False  # the CLI prints a message on one line (newlines in names escaped) unless this is set

    def one_line(self) -> str:
        """The message as the CLI prints it: a newline or carriage return in a path or a name is escaped, so
        one error is one line (a multiline message, e.g. a provenance mismatch's table, is kept as it is)."""
        return str(self) if self.multiline else escape_controls(str(self))


def escape_controls(text: str) -> str:
    """``text`` with line breaks and other control characters written as escapes (``\\n``, ``\\x1b``)."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def one_line(e: BaseException) -> str:
    """Another library's error text on one line (its line breaks and indentation joined as single spaces), to
    quote inside hsstore's own one-line message."""
    return " ".join(str(e).split())


class BadInput(HsstoreError, ValueError):
    """The user handed hsstore something it cannot use (exit 2)."""


class StoreNotFound(BadInput, FileNotFoundError):
    """A path that is not an hsstore store."""


class UnsupportedFormat(BadInput):
    """A store written by an hsstore of an unknown major format version."""


class SelectorError(BadInput, LookupError):
    """A variant selector that matches no variant, or several."""


class ProvenanceMismatch(HsstoreError):
    """Two provenances differ in fields that can change numbers.

    ``differences`` holds ``(field, store_value, required_value)`` for every differing field.
    """

    exit_code = 1
    multiline = True

    def __init__(
        self, differences: list[tuple[str, object, object]], what: str = "store", notes: Sequence[str] = ()
    ) -> None:
        self.differences = differences
        lines = [f"{field}: {a!r} ({what}) != {b!r} (required)" for field, a, b in differences]
        super().__init__(
            f"provenance mismatch in {len(differences)} field(s):\n  "
            + "\n  ".join(lines)
            + "\n(pass allow_drift=[field, ...] to accept a named field)"
            + "".join(f"\n{n}" for n in notes)
        )


class CorruptData(HsstoreError, IOError):
    """Committed data that fails a checksum, a size check or a key check."""

    exit_code = 1


class CheckFailed(HsstoreError):
    """A check the user asked for failed (diff bound, verify)."""

    exit_code = 1


class BuildFailed(HsstoreError, RuntimeError):
    """A build step failed after its inputs were accepted (write error, NaN states, a dead worker)."""

    exit_code = 1


class BuildInterrupted(BuildFailed):
    """A build, convert, export or import stopped by a signal (SIGTERM, SIGINT, SIGHUP): exit status 128 +
    the signal's number."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class WriteFailed(BuildFailed):
    """Writing to the store failed (a full disk, a file-size limit, an I/O error); nothing was committed.
    ``cause`` (a key of ``WRITE_FIXES``, None when not known) chooses the fix a message advises."""

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class StoreGone(HsstoreError):
    """The object store's bucket does not exist (deleted while a command ran, or a typo in the URL) (exit 1)."""

    exit_code = 1


# what to do about a failed write, by its cause (the advice ends where "and re-run …" follows)
WRITE_FIXES = {
    "disk_full": "Free space on the store's disk (or raise its quota), or choose another --store,",
    "file_too_large": "Raise the file-size limit (ulimit -f: this process's RLIMIT_FSIZE), or run where none is set,",
    "permission": "The store is not writable by this process (permissions, a read-only file system, or credentials "
    "the store refuses): fix that or choose another --store,",
    "no_bucket": "The bucket does not exist (deleted, or a typo in the URL): create the bucket or choose another "
    "--store,",
    "network": "The store did not answer: check the network and the server,",
    None: "Fix the cause named above,",
}
_ERRNO_CAUSES = {
    errno.ENOSPC: "disk_full",
    errno.EDQUOT: "disk_full",
    errno.EFBIG: "file_too_large",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.EROFS: "permission",
}


def write_cause(e: BaseException) -> str | None:
    """The cause of a failed write (a key of ``WRITE_FIXES``), from the error or one it was raised from: the
    operating system's errno, or an object store's refusal (a missing bucket, access denied)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, StoreGone) or "NoSuchBucket" in type(cur).__name__ or "bucket does not exist" in str(cur):
            return "no_bucket"
        if isinstance(cur, WriteFailed) and cur.cause is not None:
            return cur.cause
        if isinstance(cur, PermissionError) or type(cur).__name__ in ("AccessDenied", "Forbidden"):
            return "permission"
        if isinstance(cur, OSError) and cur.errno in _ERRNO_CAUSES:
            return _ERRNO_CAUSES[cur.errno]
        if isinstance(cur, (ConnectionError, TimeoutError)):
            return "network"
        cur = cur.__cause__ or cur.__context__
    return None


class ResourceLimit(BadInput):
    """An input that would need more memory, time or output than hsstore allows itself (a size bomb, a
    template that loops, a config that does not match its weights): refused before the work starts (exit 2)."""


class OutputFailed(HsstoreError, OSError):
    """Writing a report to stdout or a file failed (a full disk, a file-size limit, a closed pipe) (exit 1)."""

    exit_code = 1


class StoreUnreachable(HsstoreError, ConnectionError):
    """A remote store did not answer (the connection dropped, timed out or was refused) after bounded
    retries: the data is not known to be damaged, the network is (exit 1)."""

    exit_code = 1
