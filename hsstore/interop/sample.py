"""One sample read from another tool's cache, checked; and the safe ways to open their files.

Pickled formats (``torch.save``) are opened only with ``torch.load(weights_only=True)``: tensors and
plain containers, never arbitrary objects. Every file's bytes are hashed (xxh3_128) as they are read,
so the import record names exactly what was imported.
"""

from __future__ import annotations

import io
import os
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import torch
import xxhash

from hsstore.core.batching import check_fits, memory_budget
from hsstore.core.dtypes import name_of
from hsstore.core.errors import BadInput, ResourceLimit
from hsstore.core.outputs import byte_size

MAX_FILE_BYTES = 64 << 30  # one sample's file; anything larger is not a per-sample cache file
IN_FLIGHT = 4  # samples an import may hold at once per budget share (read-ahead, and a copy while written)
MAX_INFLATE_RATIO = 64  # bf16/fp32 states compress ~1.1-3x; a gzip member inflating further is a bomb
MIN_INFLATE_CAP = 64 * 10**6  # ... unless it stays this small (tiny files compress their zip headers well)


@dataclass(frozen=True)
class FileDigest:
    """A source file as read: its path relative to the import folder, size and xxh3_128 of its bytes."""

    rel: str
    size: int
    xxh3: str
    mtime_ns: int = 0


@dataclass
class SourceSample:
    """A sample as another tool stored it: tokens, loss mask, states by slot (aux slots, then target)."""

    name: str  # what error messages call it (a relative path)
    input_ids: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # uint8 [T], 0/1
    aux: torch.Tensor | None  # [T, n_aux, H]
    target: torch.Tensor  # [T, H]
    files: list[FileDigest] = field(default_factory=list)
    claims: dict[str, Any] = field(default_factory=dict)  # what the file says about itself (e.g. prenorm)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.target.shape[-1])

    @property
    def dtype(self) -> str:
        return name_of(self.target.dtype)

    @property
    def n_aux(self) -> int:
        return 0 if self.aux is None else int(self.aux.shape[1])


def read_bytes(root: Path, rel: str) -> tuple[bytes, FileDigest]:
    """A file's bytes and digest (refusing special files and absurd sizes)."""
    path = root / rel
    try:
        st = path.stat()
        if not path.is_file():
            raise BadInput(f"{rel}: not a regular file; an import folder holds only the tool's sample files")
        if st.st_size > MAX_FILE_BYTES:
            raise BadInput(f"{rel}: {st.st_size} bytes is not one sample's file (limit {MAX_FILE_BYTES})")
        check_fits(
            st.st_size,
            f"{rel}: reading its {st.st_size} bytes",
            "import on a machine with more memory or raise the budget",
            share=IN_FLIGHT,
        )
        data = path.read_bytes()
    except OSError as e:
        raise BadInput(f"{rel}: cannot read ({e.strerror or e}); check the folder's permissions") from None
    return data, FileDigest(rel, len(data), xxhash.xxh3_128_hexdigest(data), st.st_mtime_ns)


def load_torch(data: bytes, rel: str) -> dict[str, Any]:
    """A ``torch.save``'d dict (``.gz``: gzip-compressed first) through ``torch.load(weights_only=True)``."""
    if rel.endswith(".gz"):
        data = inflate(data, rel)
    check_zip_members(data, rel)
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols of foreign files: not for users
            warnings.simplefilter("ignore")
            obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, ... for foreign bytes
        raise BadInput(
            f"{rel}: not a plain torch.save file of tensors (torch.load(weights_only=True) refused "
            f"it: {_why(e)}); hsstore never unpickles arbitrary objects"
        ) from None
    if not isinstance(obj, dict):
        raise BadInput(f"{rel}: holds a {type(obj).__name__}, not a dict of tensors; is this the right format?")
    return obj


def check_zip_members(data: bytes, rel: str) -> None:
    """Refuse a torch.save zip whose members declare more bytes than ``inflate_cap`` allows, before torch.load
    allocates them: torch.save stores members uncompressed, but its reader also inflates deflated ones, so a
    200 KB file of deflated zeros becomes a 200 MB tensor (and 2 MB, 2 GB) — the members' declared sizes
    are what the reader allocates. Anything that is not a readable zip is left to torch.load to name."""
    if not data.startswith(b"PK\x03\x04"):
        return
    try:
        members = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        return
    declared = sum(m.file_size for m in members)
    cap = inflate_cap(len(data))
    if declared > cap:
        raise ResourceLimit(
            f"{rel}: its zip members inflate to {byte_size(declared)} from {byte_size(len(data))} (past "
            f"{byte_size(cap)}: more than {MAX_INFLATE_RATIO}x, or beyond the memory budget): a "
            "decompression bomb, not a sample (torch.save writes members uncompressed); remove it"
        )


def inflate_cap(compressed: int) -> int:
    """The most bytes a gzip file of ``compressed`` bytes may inflate to: a plausible ratio, within budget."""
    return min(memory_budget() // IN_FLIGHT, max(MIN_INFLATE_CAP, MAX_INFLATE_RATIO * compressed))


def inflate(data: bytes, rel: str) -> bytes:
    """gzip ``data`` decompressed a bounded piece at a time: refused (ResourceLimit) as soon as it passes
    ``inflate_cap`` — a 3 MB file that inflates to 3 GB never gets to allocate it."""
    cap = inflate_cap(len(data))
    out: list[bytes] = []
    total = 0
    rest = data
    try:
        while rest:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # one gzip member; members may follow
            while True:
                piece = d.decompress(rest, 1 << 20)
                total += len(piece)
                if total > cap:
                    raise ResourceLimit(
                        f"{rel}: inflates past {byte_size(cap)} from {byte_size(len(data))} (more than "
                        f"{MAX_INFLATE_RATIO}x, or beyond the memory budget): a decompression bomb, "
                        "not a sample; remove it or import the uncompressed .ckpt"
                    )
                out.append(piece)
                rest = d.unconsumed_tail
                if d.eof or not (rest or piece):
                    break
            if not d.eof:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
            rest = d.unused_data.lstrip(b"\0")
    except (OSError, EOFError, zlib.error) as e:
        raise BadInput(f"{rel}: not a gzip file ({e}); .gz files must be gzip-compressed torch.save files") from None
    return b"".join(out)


def _why(e: Exception) -> str:
    """The line of torch's long weights-only refusal that says what was refused."""
    lines = [line.strip() for line in str(e).splitlines()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            rest = line.split("WeightsUnpickler error:", 1)[1].strip() or next((x for x in lines[i + 1 :] if x), "")
            return rest.split(" was not an allowed global")[0][:160]
    first = next((line for line in lines if line), "")
    return f"{type(e).__name__}: {first}"[:160]


@overload
def tensor(obj: dict[str, Any], key: str, rel: str, optional: Literal[False] = False) -> torch.Tensor: ...
@overload
def tensor(obj: dict[str, Any], key: str, rel: str, optional: bool) -> torch.Tensor | None: ...
def tensor(obj: dict[str, Any], key: str, rel: str, optional: bool = False) -> torch.Tensor | None:
    """``obj[key]`` as a tensor, or a one-line error naming the file and the keys it has."""
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise BadInput(f"{rel}: no {key!r} (keys: {', '.join(sorted(map(str, obj)))}); is this the right --format?")
    t = obj[key]
    if not isinstance(t, torch.Tensor):
        raise BadInput(f"{rel}: {key!r} is a {type(t).__name__}, not a tensor")
    check_declared(t, rel, key)
    return t


def check_declared(t: torch.Tensor, rel: str, key: str) -> None:
    """Refuse a tensor whose declared shape is not backed by its file's bytes, before anything copies it:
    a sparse or other non-dense layout, a view with zero or overlapping strides (a 2 KB file declaring
    20 M tokens), or more bytes than the memory budget."""
    if t.layout != torch.strided:
        raise BadInput(
            f"{rel}: {key!r} is a {str(t.layout).replace('torch.', '')} tensor; sample files hold dense "
            "tensors (save it with .to_dense())"
        )
    declared = t.numel() * t.element_size()
    held = t.untyped_storage().nbytes()
    if declared > held:
        raise ResourceLimit(
            f"{rel}: {key!r} declares shape {tuple(t.shape)} ({byte_size(declared)}) over only "
            f"{byte_size(held)} of data (a view with repeated strides); save it with .contiguous()"
        )
    check_fits(
        declared,
        f"{rel}: {key!r} of shape {tuple(t.shape)}",
        "import on a machine with more memory or raise the budget",
        share=IN_FLIGHT,
    )


def _flat(x: torch.Tensor | np.ndarray | None, what: str, rel: str) -> torch.Tensor:
    """A tensor of integers or bools from a tensor or array (Arrow rows may hold strings or nulls)."""
    if not isinstance(x, torch.Tensor):
        a = np.asarray(x) if x is not None else None
        if a is None or a.dtype.kind not in "iub":
            kind = "null" if a is None else "mixed or null values" if a.dtype.kind == "O" else f"{a.dtype} values"
            raise BadInput(f"{rel}: {what} holds {kind}, not integers; the row is not a tokenized sample")
        x = a
    t = torch.as_tensor(x)
    return t.reshape(-1) if t.dim() == 2 and t.shape[0] == 1 else t  # tools add a batch dim of 1


def tokens(
    ids: torch.Tensor | np.ndarray | None, mask: torch.Tensor | np.ndarray | None, rel: str
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (int32) and a 0/1 loss mask (uint8) from whatever integer/bool tensors a tool wrote."""
    ids_t, mask_t = _flat(ids, "input_ids", rel), _flat(mask, "loss_mask", rel)
    if ids_t.dim() != 1 or mask_t.dim() != 1 or ids_t.shape != mask_t.shape:
        raise BadInput(
            f"{rel}: input_ids {tuple(ids_t.shape)} and loss_mask {tuple(mask_t.shape)} must be one "
            "sequence each, of equal length"
        )
    if (
        ids_t.is_floating_point()
        or ids_t.is_complex()
        or ids_t.dtype == torch.bool
        or mask_t.is_floating_point()
        or mask_t.is_complex()
    ):
        raise BadInput(f"{rel}: input_ids ({ids_t.dtype}) and loss_mask ({mask_t.dtype}) must be integer tensors")
    if ids_t.numel() == 0:
        raise BadInput(f"{rel}: an empty sample (0 tokens)")
    if int(ids_t.min()) < 0 or int(ids_t.max()) >= 2**31:
        raise BadInput(f"{rel}: token ids outside 0..2^31-1 (min {int(ids_t.min())}, max {int(ids_t.max())})")
    m = mask_t.to(torch.int64)
    if bool(((m != 0) & (m != 1)).any()):
        raise BadInput(f"{rel}: loss_mask holds values other than 0 and 1 ({sorted(set(m.tolist()))[:5]})")
    return ids_t.to(torch.int32).numpy().copy(), m.to(torch.uint8).numpy().copy()


def states(t: torch.Tensor, length: int, rel: str, key: str) -> torch.Tensor:
    """A ``[T, W]`` (or ``[1, T, W]``) float tensor of ``length`` rows, contiguous."""
    if t.dim() == 3 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 2 or t.shape[0] != length:
        raise BadInput(f"{rel}: {key} has shape {tuple(t.shape)}; expected [{length}, hidden] for {length} tokens")
    try:
        name_of(t.dtype)
    except ValueError:
        raise BadInput(f"{rel}: {key} is {t.dtype}; hsstore stores bf16, fp16 or fp32 states") from None
    return t.contiguous()


def split_aux(t: torch.Tensor, hidden: int, rel: str, key: str) -> torch.Tensor:
    """``[T, n*H]`` concatenated aux states as ``[T, n, H]``."""
    if t.shape[-1] % hidden:
        raise BadInput(f"{rel}: {key} width {t.shape[-1]} is not a multiple of the hidden size {hidden}")
    return t.reshape(t.shape[0], t.shape[-1] // hidden, hidden)


def walk(root: Path, suffixes: tuple[str, ...]) -> list[str]:
    """Relative paths of the files under ``root`` ending in one of ``suffixes``, sorted."""
    out = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(suffixes):
                out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def check_vocab(s: SourceSample, vocab: int) -> None:
    """BadInput if ``s`` holds a token id outside a vocabulary of ``vocab`` ids (another tokenizer's cache)."""
    top = int(s.input_ids.max())
    if top >= vocab:
        raise BadInput(
            f"{s.name}: token id {top} is outside the tokenizer's vocabulary ({vocab}); the cache "
            "was made with another tokenizer — pass the target model's --tokenizer"
        )
