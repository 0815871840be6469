"""Records about files a build reads: a stamp (what the filesystem says) and a content hash."""

from __future__ import annotations

from hsstore.core.schema.record import Record


class FileStamp(Record):
    """Device, inode, size and the two timestamps: equal stamps before and after = the same file, untouched
    (a program can restore mtime but not ctime; hsstore still never trusts a stamp in place of a hash)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int


class HashedFile(Record):
    """A file's size and xxh3_128 content hash, with the stamp it had while it was hashed."""

    size: int
    xxh3_128: str
    stamp: FileStamp
