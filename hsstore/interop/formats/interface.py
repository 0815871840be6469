"""What every cache format provides: list its samples, read one, write one — and atomic file writes."""

from __future__ import annotations

import errno
import io
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import xxhash

from hsstore.core.errors import WRITE_FIXES, BadInput, WriteFailed, write_cause
from hsstore.interop.sample import (
    FileDigest,
    SourceSample,
    load_torch,
    read_bytes,
    split_aux,
    states,
    tensor,
    tokens,
    walk,
)
from hsstore.storage.fileio import replace_file

if TYPE_CHECKING:
    import numpy as np

    from hsstore.core.schema.reports import FormatName

TMP_SUFFIX = ".hsstore-tmp"  # never matches a tool's suffix (.ckpt, .pt, .safetensors), removed on failure


# errors that say the place is wrong (a file where a folder belongs, no permission), not that writing failed
PLACE_ERRORS = frozenset({errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS})


def write_failed(path: Path, e: OSError) -> BadInput | WriteFailed:
    """The error for a failed write to ``path``: a place that cannot take the file is bad input (exit 2);
    an I/O fault (a full disk, a quota, a failing device) is exit 1, the OS error named."""
    if e.errno in PLACE_ERRORS:
        return BadInput(f"cannot write {path}: {e.strerror or e}; choose a writable folder")
    cause = write_cause(e)
    return WriteFailed(
        f"writing {path} failed: {e.strerror or e}; the export is not complete (no partial file is "
        f"left). {WRITE_FIXES[cause]} and re-run the same command",
        cause,
    )


def atomic_write(root: Path, rel: str, data: bytes) -> FileDigest:
    """Write ``data`` to ``root/rel`` all or nothing (storage.fileio.replace_file: an fsync'd temporary
    file renamed over it): a reader sees the whole file or none."""
    path = root / rel
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, data, f".{path.name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")
    except OSError as e:
        raise write_failed(path, e) from None
    return FileDigest(rel, len(data), xxhash.xxh3_128_hexdigest(data))


def torch_bytes(obj: dict[str, Any] | dict[int, int]) -> bytes:
    """``torch.save(obj)`` as bytes (the zip format every torch since 1.6 reads, mmap-able)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class FormatWriter:
    """Writes one sample per call; ``finish`` completes what spans samples (e.g. speculators' Arrow table)."""

    def __init__(self, root: Path, compress: bool = False) -> None:
        self.root = root
        self.compress = compress

    def rel(self, index: int, key: str) -> str:
        raise NotImplementedError

    def write(
        self,
        index: int,
        key: str,
        ids: torch.Tensor,
        mask: torch.Tensor,
        aux: torch.Tensor | None,
        target: torch.Tensor,
        claims: dict[str, Any],
    ) -> FileDigest:
        """``ids``/``mask`` int64 ``[T]``, ``aux`` ``[T, n, H]`` (or None), ``target`` ``[T, H]``."""
        raise NotImplementedError

    def finish(self, n_samples: int) -> list[FileDigest]:
        return []


class Format:
    """A cache layout of another tool: slots per token are ``n_aux`` aux states (if ``has_aux``) and a target."""

    name: FormatName  # each format's own
    tool = ""
    has_aux = True
    layout = ""  # one line for --help and the README: where the files are and what they hold
    loader = ""  # the tool's code that reads this layout
    suffixes: tuple[str, ...] = ()  # how the names of the files of this layout end
    exported = re.compile(r"(?!)")  # relative paths an export of this layout writes (and a re-export may remove)

    def items(self, root: Path) -> list[str]:
        """The samples under ``root``, in the tool's own order (sorted paths or row indices)."""
        raise NotImplementedError

    def read(self, root: Path, item: str) -> SourceSample:
        raise NotImplementedError

    def writer(self, root: Path, compress: bool = False) -> FormatWriter:
        raise NotImplementedError

    def shared_files(self, root: Path) -> list[str]:
        """Files every sample depends on (speculators' Arrow table), hashed once per import."""
        return []

    def sidecar(self, root: Path) -> Path:
        """Where ``hsstore export`` records what the files hold (a file the tool's loader ignores)."""
        return root / "hsstore-export.json"

    def check_dir(self, root: Path) -> None:
        if not root.is_dir():
            raise BadInput(f"{self.name} cache folder {str(root)!r} does not exist or is not a folder")


class TorchDictFormat(Format):
    """A layout of one ``torch.save`` dict per sample file (EAGLE, Model-Optimizer, SpecForge): the files
    ending in ``suffixes``, each read with ``torch.load(weights_only=True)``; the dict holds ``input_ids``,
    ``loss_mask``, the target under ``target_key`` and (when the layout has them) the aux states
    concatenated along the last axis under ``aux_key``."""

    suffixes: tuple[str, ...] = ()
    target_key = ""
    aux_key: str | None = None

    def items(self, root: Path) -> list[str]:
        self.check_dir(root)
        return walk(root, self.suffixes)

    def load(self, root: Path, item: str) -> tuple[dict[str, Any], FileDigest]:
        """The sample file's dict and the digest of its bytes."""
        data, digest = read_bytes(root, item)
        return load_torch(data, item), digest

    def sample_states(
        self, obj: dict[str, Any], item: str
    ) -> tuple[np.ndarray, np.ndarray, torch.Tensor | None, torch.Tensor]:
        """(input ids, loss mask, aux states [T, n, H] or None, target [T, H]) of a loaded dict, checked."""
        ids, mask = tokens(tensor(obj, "input_ids", item), tensor(obj, "loss_mask", item), item)
        target = states(tensor(obj, self.target_key, item), len(ids), item, self.target_key)
        if self.aux_key is None:
            return ids, mask, None, target
        aux = states(tensor(obj, self.aux_key, item), len(ids), item, self.aux_key)
        if aux.dtype != target.dtype:
            raise BadInput(f"{item}: {self.aux_key} is {aux.dtype} but {self.target_key} {target.dtype}")
        return ids, mask, split_aux(aux, target.shape[-1], item, self.aux_key), target
