"""The provenance of an imported variant: what is known (tokenizer, model if given, dtype, the user's
statement of layers and convention, the source) and ``"unknown"`` for everything the files do not record.

Shape (same keys as a native build, so selectors, ``info`` and ``require=`` work unchanged):

- ``recipe.layers``: hsstore ids (output of decoder layer i; ``num_layers`` = final norm) when the capture
  convention was stated, else the ids as written; ``recipe.capture``: ``decoder_layer_output`` or
  ``unknown`` (then ``hsstore diff --align`` finds which native layer each id matches);
  ``recipe.final_norm``: true / false, absent when unknown; ``max_length`` absent, ``truncation`` unknown.
- ``environment``: ``dtype`` from the files; device, kernels, backend, versions, flags: ``unknown``;
  ``batching`` absent. Every field fits the typed ``Provenance`` record (checked when built).
- ``source``: an ``ImportSource`` record (tool, format, path, stated layers and convention, claims).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from hsstore.core.errors import BadInput, CorruptData
from hsstore.core.keys import fingerprint
from hsstore.core.layer_numbering import FINAL_NORM
from hsstore.core.schema.provenance import (
    UNKNOWN,
    Environment,
    ExportRecord,
    ImportChunk,
    ImportDone,
    ImportEntry,
    ImportSource,
    Kernels,
    LayerRoles,
    ModelIdentity,
    Provenance,
    Recipe,
    TokenizerIdentity,
)
from hsstore.core.schema.record import UNSET, Record, is_set
from hsstore.interop.formats.interface import Format, atomic_write
from hsstore.interop.sample import FileDigest, SourceSample, read_bytes

if TYPE_CHECKING:
    from hsstore.storage.store import Store

# --- Import records in the store (which files became which samples) and export records beside the files.

PREFIX = "import-"
RECORD_BYTES = 1 << 20  # one import record's size: far below the record cap whatever the paths' lengths


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def entry_hash(rel: str, size: int, xxh3: str) -> int:
    return int(xxhash.xxh3_128_hexdigest(f"{rel}\t{size}\t{xxh3}".encode()), 16)


def add_hash(total: int, h: int) -> int:
    """Order-free sum of per-file hashes (mod 2^128): the same files give the same fingerprint, whatever
    order they were read in, in O(1) memory."""
    return (total + h) % (1 << 128)


class ImportLog:
    """Reads earlier import records of a variant and writes this run's."""

    def __init__(self, store: Store, vid: str, fmt: Format, root: Path, run: str) -> None:
        from hsstore.storage import layout

        self.store, self.fmt, self.root, self.run = store, fmt, root, run
        self.prefix = layout.builds_prefix(vid)
        self.seq = 0
        self.shared = [read_bytes(root, rel)[1] for rel in fmt.shared_files(root)]
        self.context = fingerprint([[d.rel, d.size, d.xxh3] for d in self.shared]) if self.shared else ""
        self.files_sum = 0
        for d in self.shared:
            self.files_sum = add_hash(self.files_sum, entry_hash(d.rel, d.size, d.xxh3))

    def _chunks(self) -> Iterable[ImportChunk]:
        for key in self.store.io.list(self.prefix):
            name = key.rsplit("/", 1)[-1]
            if not name.startswith(PREFIX) or not name.endswith(".json"):
                continue
            raw = self.store.io.get(key)
            if raw is None:
                continue
            try:
                if json.loads(raw).get("kind") != "import-chunk":
                    continue
                chunk = ImportChunk.from_json(raw, key)
            except (ValueError, AttributeError, CorruptData):
                continue  # an unreadable record only costs re-reading its files
            if chunk.format == self.fmt.name and chunk.context == self.context:
                yield chunk

    def split_known(self, items: list[str], committed: set[str]) -> tuple[list[str], list[tuple[str, str]]]:
        """(items to read, [(item, key)] already imported and unchanged since)."""
        recorded: dict[str, ImportEntry] = {}
        for chunk in self._chunks():
            for entry in chunk.entries:
                recorded[entry.item] = entry
        todo, known = [], []
        for item in items:
            e = recorded.get(item)
            if e is not None and e.key in committed and all(_unchanged(self.root, f) for f in e.files):
                known.append((item, e.key))
                for rel, size, _, xxh3 in e.files:
                    self.files_sum = add_hash(self.files_sum, entry_hash(rel, size, xxh3))
            else:
                todo.append(item)
        return todo, known

    def _put(self, name: str, record: Record) -> None:
        self.store.io.put_atomic(f"{self.prefix}{name}", json.dumps(record.to_dict()).encode())

    def chunk(self, entries: list[tuple[str, str, list[FileDigest]]], unit: str | None) -> None:
        """Record ``entries`` (written into ``unit``) in as many records as keep each near ``RECORD_BYTES``:
        17k files under a 2,000-character folder are 70 MB of JSON, which no single record may hold."""
        out: list[ImportEntry] = []
        size = 0
        for item, key, files in entries:
            out.append(ImportEntry(item=item, key=key, files=[(f.rel, f.size, f.mtime_ns, f.xxh3) for f in files]))
            size += len(item.encode()) + len(key) + sum(len(f.rel.encode()) + 80 for f in files) + 40
            for f in files:
                self.files_sum = add_hash(self.files_sum, entry_hash(f.rel, f.size, f.xxh3))
            if size >= RECORD_BYTES:
                self._put_chunk(out, unit)
                out, size = [], 0
        if out:
            self._put_chunk(out, unit)

    def _put_chunk(self, entries: list[ImportEntry], unit: str | None) -> None:
        self._put(
            f"{PREFIX}{self.run}-{self.seq:06d}.json",
            ImportChunk(
                kind="import-chunk",
                run=self.run,
                seq=self.seq,
                format=self.fmt.name,
                context=self.context,
                unit=unit,
                entries=entries,
                created=now(),
            ),
        )
        self.seq += 1

    def finish(
        self, tool: str, n_items: int, keys: set[str], counts: dict[str, int], n_bad: int, n_missing: int
    ) -> ImportDone:
        done = ImportDone(
            kind="import",
            complete=n_bad == 0,
            run=self.run,
            tool=tool,
            format=self.fmt.name,
            path=str(self.root.resolve()),
            n_items=n_items,
            n_samples=len(keys),
            n_written=counts["written"],
            n_present=counts["present"],
            n_duplicates=counts["duplicates"],
            n_skipped_bad=n_bad,
            n_missing=n_missing,
            keys_fingerprint=fingerprint(sorted(keys)),
            files_fingerprint=f"{self.files_sum:032x}",
            finished_at=now(),
        )
        self._put(f"{PREFIX}{self.run}.json", done)
        return done


def _unchanged(root: Path, f: tuple[str, int, int, str]) -> bool:
    try:
        st = os.stat(root / f[0])
    except OSError:
        return False
    return st.st_size == f[1] and st.st_mtime_ns == f[2]


def seal_of(record: ExportRecord) -> str:
    """The fingerprint of every field of an export record but its seal (what ``seal`` is set to)."""
    return fingerprint({k: v for k, v in record.to_dict().items() if k != "seal"})


def named_files(fmt: Format, root: Path) -> list[Path]:
    """Regular files under ``root`` (links not followed) named as an export of the layout names its files."""
    return [
        p
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and fmt.exported.fullmatch(p.relative_to(root).as_posix())
    ]


def folder_fingerprint(fmt: Format, root: Path, jobs: int) -> str:
    """The files fingerprint an export of ``root``'s files recorded (every file named as the layout's writer
    names them: path, size, xxh3_128), each file read once, on ``jobs`` threads."""
    from concurrent.futures import ThreadPoolExecutor

    def one(p: Path) -> int:
        d = read_bytes(root, p.relative_to(root).as_posix())[1]
        return entry_hash(d.rel, d.size, d.xxh3)

    total = 0
    with ThreadPoolExecutor(max(1, jobs), thread_name_prefix="hsstore-seal") as pool:
        for h in pool.map(one, named_files(fmt, root)):
            total = add_hash(total, h)
    return f"{total:032x}"


def untrusted_because(fmt: Format, root: Path, record: ExportRecord, jobs: int) -> str | None:
    """Why the provenance in ``record`` cannot be restored for the files under ``root`` (None: it can): the
    record was edited since the export sealed it, or the files are not the ones it wrote."""
    if not is_set(record.seal):
        return "the record has no seal (an earlier hsstore wrote it): re-export the variant to carry its provenance"
    if record.seal != seal_of(record):
        return "the record was edited since the export wrote it (its seal does not match)"
    if folder_fingerprint(fmt, root, jobs) != record.files_fingerprint:
        return "the folder's files are not the ones the export wrote (a file was changed, added or removed)"
    return None


def read_sidecar(path: Path, fmt: str, fix: str | None = None) -> ExportRecord | None:
    """The export record at ``path`` if there is one (a statement of what the files hold); BadInput naming
    ``fix`` (default: import it as the format it was exported as) if it is another format's."""
    if not path.is_file():
        return None
    rec = ExportRecord.from_json(path.read_bytes(), str(path), error=BadInput)
    if rec.format != fmt:
        raise BadInput(
            f"{path} says the folder was exported as {rec.format!r}, not {fmt!r}; "
            f"{fix or f'import it as {rec.format}: hsstore import {rec.format} ...'}"
        )
    return rec


def write_sidecar(path: Path, record: ExportRecord) -> None:
    """Write the export record beside the files, all or nothing, as the files are written (atomic_write:
    its temporary file is one a re-run cleans up, its failure the export's one-line error)."""
    atomic_write(path.parent, path.name, json.dumps(record.to_dict(), indent=1, sort_keys=True).encode())


KERNEL_FAMILIES = ("chunk_gated_delta_rule", "causal_conv1d", "attention")
# the keys of a native build's environment sub-records, each "unknown" for an import (same shape: every
# reader of native provenance reads these too)
VERSIONS = ("python", "torch", "cuda", "transformers", "fla", "causal_conv1d")
FLAGS = ("tf32_matmul", "tf32_cudnn", "float32_matmul_precision", "deterministic_algorithms")


def tokenizer_identity(path: str) -> tuple[dict[str, Any], int]:
    """(hsstore's tokenizer identity, vocabulary size) of a tokenizer folder or ``builtin:NAME``."""
    from hsstore.capture.model.spec import ModelSpec

    spec = ModelSpec(path)
    if spec.builtin is None and not Path(path).is_dir():
        raise BadInput(
            f"tokenizer {path!r} is not a folder; pass the target model's folder (tokenizer.json, "
            "tokenizer_config.json) or builtin:NAME"
        )
    tok = spec.tokenizer()
    # the cache's tokens were rendered by another tool, on a day hsstore does not know: no pinned chat_date
    ident = spec.tokenizer_identity(tok).replace(chat_date=UNSET).to_dict()
    return ident, len(tok)


def model_identity(model: str | None, num_layers: int | None, hidden_size: int) -> dict[str, Any]:
    """The model part of the recipe: a native build's identity when ``model`` has weights; the config's
    part with weights ``unknown`` when it has only a config; only the shape when no model is given."""
    if model is None:
        if num_layers is None:
            raise BadInput(
                "the number of decoder layers is unknown: pass --model DIR (the target's folder with "
                "config.json) or --num-layers N"
            )
        return {
            "name": UNKNOWN,
            "model_type": UNKNOWN,
            "num_layers": int(num_layers),
            "hidden_size": hidden_size,
            "config_fingerprint": UNKNOWN,
            "fingerprint": UNKNOWN,
        }
    from hsstore.capture.model.spec import WEIGHT_SUFFIXES, ModelSpec, config_fingerprint, text_config

    spec = ModelSpec(model)
    spec.check()
    config = spec.config(len(spec.tokenizer())) if spec.builtin is not None else spec.config()
    tc = text_config(config)
    if int(tc.hidden_size) != hidden_size:
        raise BadInput(
            f"the files hold states of width {hidden_size}, but {model!r} has hidden_size "
            f"{int(tc.hidden_size)}: another model's cache, or the wrong --model"
        )
    if num_layers is not None and int(num_layers) != int(tc.num_hidden_layers):
        raise BadInput(f"--num-layers {num_layers} contradicts {model!r} ({int(tc.num_hidden_layers)} layers)")
    has_weights = spec.builtin is not None or any(
        p.is_file() and p.name.endswith(WEIGHT_SUFFIXES) for p in Path(model).iterdir()
    )
    if has_weights:
        return spec.identity(config).to_dict()  # exactly a native build's: require= and diff match it
    return {
        "path": model,
        "name": Path(model).resolve().name,
        "model_type": tc.model_type,
        "num_layers": int(tc.num_hidden_layers),
        "hidden_size": int(tc.hidden_size),
        "config_fingerprint": config_fingerprint(config),
        "fingerprint": UNKNOWN,
    }  # no weights: unknown


def unknown_environment(dtype: str) -> Environment:
    """How the states were computed, as far as a foreign cache tells: only the dtype."""
    from hsstore import __version__

    return Environment(
        device=UNKNOWN,
        device_name=UNKNOWN,
        dtype=dtype,
        backend=UNKNOWN,
        kernels=Kernels(**{k: UNKNOWN for k in KERNEL_FAMILIES}),
        versions={**{k: UNKNOWN for k in VERSIONS}, "hsstore": __version__},  # hsstore: the importer's
        flags={k: UNKNOWN for k in FLAGS},
        host=UNKNOWN,
    )  # batching: absent (not known)


def imported_provenance(
    source: ImportSource, tokenizer: dict[str, Any], model: dict[str, Any], layers: dict[str, list[int]], dtype: str
) -> Provenance:
    """The whole provenance of an imported variant (its id hashes every field but ``source.path``)."""
    known = source.capture != "unknown"
    # final_norm absent = unknown (an int id under an unknown capture may be either)
    final_norm = FINAL_NORM in source.layers if known or FINAL_NORM in source.layers else UNSET
    recipe = Recipe(
        model=ModelIdentity.from_dict(model, "imported model identity"),
        tokenizer=TokenizerIdentity.from_dict(tokenizer, "imported tokenizer identity"),
        layers=LayerRoles(aux=layers["aux"], target=layers["target"]),
        capture="decoder_layer_output" if known else UNKNOWN,
        final_norm=final_norm,
        truncation=UNKNOWN,
    )
    return Provenance(recipe=recipe, environment=unknown_environment(dtype), source=source)


def restored_provenance(
    record: ExportRecord,
    layers: dict[str, list[int]],
    dtype: str,
    hidden_size: int,
    tokenizer: dict[str, Any],
    model: dict[str, Any] | None,
) -> Provenance | str:
    """The provenance an hsstore export recorded for its files (its variant's, with ``recipe.layers`` the
    exported slots), or why it does not describe this import: the files' dtype or width, the slots, the
    ``--tokenizer`` (the content keys hash it) or a ``--model`` given differ from the record's. The record
    itself must already be trusted (import_records.untrusted_because)."""
    prov = json.loads(json.dumps(record.provenance))
    recipe, env = prov.get("recipe", {}), prov.get("environment", {})
    if layers != {"aux": record.slots.get("aux", []), "target": record.slots.get("target", [])}:
        return f"the files' layers {layers} are not the exported slots {record.slots}"
    if env.get("dtype") != dtype or recipe.get("model", {}).get("hidden_size") != hidden_size:
        return (
            f"the files hold {dtype} states of width {hidden_size}, the record "
            f"{env.get('dtype')} of width {recipe.get('model', {}).get('hidden_size')}"
        )
    if recipe.get("tokenizer", {}).get("fingerprint") != tokenizer["fingerprint"]:
        return "--tokenizer is not the tokenizer of the exported variant (its content keys would differ)"
    if model is not None and model.get("fingerprint") not in (UNKNOWN, recipe.get("model", {}).get("fingerprint")):
        return "--model is not the model of the exported variant"
    stored = env.get("storage")
    if isinstance(stored, dict):  # without it, the provenance is its source's: the import took the source's variant
        return (
            f"the exported variant is stored in {stored.get('precision')}: its files hold the states decoded, "
            "which are neither its codes nor its source's states (to copy it, convert its source again)"
        )
    recipe["layers"] = {"aux": list(layers["aux"]), "target": list(layers["target"])}
    try:
        return Provenance.from_dict(prov, "the export record's provenance", BadInput)
    except BadInput as e:
        return f"its provenance does not decode ({e})"


def variant_provenance(
    fmt: Format,
    root: Path,
    sidecar: ExportRecord | None,
    source: ImportSource,
    tok: dict[str, Any],
    model: dict[str, Any],
    model_given: bool,
    layers: dict[str, list[int]],
    probe: SourceSample,
    jobs: int,
) -> tuple[Provenance, bool, str | None]:
    """(the variant's provenance, whether restored from hsstore's export record, why a record was not
    trusted): a folder hsstore exported, its record sealed and its files the ones the record
    fingerprints, keeps the exported variant's provenance; anything else gets the imported one (unknowns)."""
    imported = imported_provenance(source, tok, model, layers, probe.dtype)
    if sidecar is None:
        return imported, False, None
    why = untrusted_because(fmt, root, sidecar, jobs)
    restored = (
        restored_provenance(sidecar, layers, probe.dtype, probe.hidden_size, tok, model if model_given else None)
        if why is None
        else why
    )
    if isinstance(restored, str):
        return imported, False, f"the export record {str(fmt.sidecar(root))!r} is ignored: {restored}"
    return restored, True, None
