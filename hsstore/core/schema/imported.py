"""Records of imported caches: the ``source`` block of an imported variant's provenance and the import
records kept under ``variants/<vid>/builds/`` (which files, with which hashes, became which samples)."""

from __future__ import annotations

from typing import Literal

from hsstore.core.schema.record import UNSET, Record, UnsetType

UNKNOWN = "unknown"  # a fact the source files do not record; never guessed


class ImportSource(Record):
    """Where an imported variant came from and what the user stated about it (``provenance.source``).

    ``layers`` are the ids of the files' state slots as stated (aux slots in file order, then the target),
    in the tool's numbering under ``capture``: ``output`` (id i = output of decoder layer i), ``input``
    (id i = state entering layer i = output of i-1, vLLM) or ``unknown``; ``final_norm`` = post-norm.
    ``claims`` are what the files say of themselves (Model-Optimizer's ``hidden_states_prenorm``).
    """

    tool: str
    format: str
    path: str
    layers: list[int | str]
    capture: Literal["output", "input", "unknown"]
    stated_by: Literal["user", "hsstore-export"]
    claims: dict[str, bool] = {}


class ImportEntry(Record):
    """One imported sample: the tool's item (path or row), its content key, and its files as
    ``[relative path, size, mtime_ns, xxh3_128]``."""

    item: str
    key: str
    files: list[tuple[str, int, int, str]]


class ImportChunk(Record):
    """The samples of one import step (written after their unit committed; ``unit`` None when every
    sample was already committed). ``context`` fingerprints files all samples share (speculators' Arrow
    table): a resumed import trusts these entries only while it is unchanged."""

    kind: Literal["import-chunk"]
    run: str
    seq: int
    format: str
    context: str
    unit: str | None
    entries: list[ImportEntry]
    created: str


class ImportDone(Record):
    """An import run that finished: counts, and fingerprints of the keys and of every file's hash."""

    kind: Literal["import"]
    complete: bool
    run: str
    tool: str
    format: str
    path: str
    n_items: int
    n_samples: int
    n_written: int
    n_present: int
    n_duplicates: int
    n_skipped_bad: int
    n_missing: int
    keys_fingerprint: str
    files_fingerprint: str
    finished_at: str


class ExportRecord(Record):
    """What ``hsstore export`` wrote (``hsstore-export.json`` in the folder; beside it for EAGLE): the
    variant and its provenance, and each state slot's layer in hsstore's ids and in the tool's numbering
    (``tool_capture``), so ``hsstore import`` of the folder needs no statement from the user."""

    kind: Literal["hsstore-export"]
    complete: bool
    format: str
    store: str
    variant: str
    provenance: dict
    num_layers: int
    slots: dict[str, list[int]]
    tool_layers: list[int | str]
    tool_capture: Literal["output", "input", "unknown"]
    n_samples: int
    files_fingerprint: str
    exported_at: str
    # files under the folder named as the layout names an export's, and their bytes, once complete: what a
    # re-export checks before it removes any (absent from records of earlier versions)
    folder_files: int | UnsetType = UNSET
    folder_bytes: int | UnsetType = UNSET
    folder_token: str | UnsetType = UNSET  # the folder's mark (interop.folder_mark), where it keeps one
    # a fingerprint of every other field, set once complete: an import restores ``provenance`` only while the
    # record is as written (a hand-edited record is ignored) and the files match ``files_fingerprint``
    seal: str | UnsetType = UNSET
