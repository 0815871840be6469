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

import json
from pathlib import Path
from typing import Any

from hsstore.core.errors import BadInput
from hsstore.core.schema.imported import UNKNOWN, ExportRecord, ImportSource
from hsstore.core.schema.record import UNSET
from hsstore.core.schema.provenance import (Environment, Kernels, LayerRoles, ModelIdentity, Provenance, Recipe,
                                            TokenizerIdentity)
from hsstore.core.layer_numbering import FINAL_NORM
from hsstore.interop.formats.interface import Format
from hsstore.interop.import_records import untrusted_because
from hsstore.interop.sample import SourceSample

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
        raise BadInput(f"tokenizer {path!r} is not a folder; pass the target model's folder (tokenizer.json, "
                       "tokenizer_config.json) or builtin:NAME")
    tok = spec.tokenizer()
    # the cache's tokens were rendered by another tool, on a day hsstore does not know: no pinned chat_date
    ident = spec.tokenizer_identity(tok).replace(chat_date=UNSET).to_dict()
    return ident, len(tok)


def model_identity(model: str | None, num_layers: int | None, hidden_size: int) -> dict[str, Any]:
    """The model part of the recipe: a native build's identity when ``model`` has weights; the config's
    part with weights ``unknown`` when it has only a config; only the shape when no model is given."""
    if model is None:
        if num_layers is None:
            raise BadInput("the number of decoder layers is unknown: pass --model DIR (the target's folder with "
                           "config.json) or --num-layers N")
        return {"name": UNKNOWN, "model_type": UNKNOWN, "num_layers": int(num_layers), "hidden_size": hidden_size,
                "config_fingerprint": UNKNOWN, "fingerprint": UNKNOWN}
    from hsstore.capture.model.spec import WEIGHT_SUFFIXES, ModelSpec, config_fingerprint, text_config

    spec = ModelSpec(model)
    spec.check()
    config = spec.config(len(spec.tokenizer())) if spec.builtin is not None else spec.config()
    tc = text_config(config)
    if int(tc.hidden_size) != hidden_size:
        raise BadInput(f"the files hold states of width {hidden_size}, but {model!r} has hidden_size "
                       f"{int(tc.hidden_size)}: another model's cache, or the wrong --model")
    if num_layers is not None and int(num_layers) != int(tc.num_hidden_layers):
        raise BadInput(f"--num-layers {num_layers} contradicts {model!r} ({int(tc.num_hidden_layers)} layers)")
    has_weights = spec.builtin is not None or any(
        p.is_file() and p.name.endswith(WEIGHT_SUFFIXES) for p in Path(model).iterdir())
    if has_weights:
        return spec.identity(config).to_dict()  # exactly a native build's: require= and diff match it
    return {"path": model, "name": Path(model).resolve().name, "model_type": tc.model_type,
            "num_layers": int(tc.num_hidden_layers), "hidden_size": int(tc.hidden_size),
            "config_fingerprint": config_fingerprint(config), "fingerprint": UNKNOWN}  # no weights: unknown


def unknown_environment(dtype: str) -> Environment:
    """How the states were computed, as far as a foreign cache tells: only the dtype."""
    from hsstore import __version__

    return Environment(device=UNKNOWN, device_name=UNKNOWN, dtype=dtype, backend=UNKNOWN,
                       kernels=Kernels(**{k: UNKNOWN for k in KERNEL_FAMILIES}),
                       versions={**{k: UNKNOWN for k in VERSIONS}, "hsstore": __version__},  # hsstore: the importer's
                       flags={k: UNKNOWN for k in FLAGS}, host=UNKNOWN)  # batching: absent (not known)


def imported_provenance(source: ImportSource, tokenizer: dict[str, Any], model: dict[str, Any],
                        layers: dict[str, list[int]], dtype: str) -> Provenance:
    """The whole provenance of an imported variant (its id hashes every field but ``source.path``)."""
    known = source.capture != "unknown"
    # final_norm absent = unknown (an int id under an unknown capture may be either)
    final_norm = FINAL_NORM in source.layers if known or FINAL_NORM in source.layers else UNSET
    recipe = Recipe(model=ModelIdentity.from_dict(model, "imported model identity"),
                    tokenizer=TokenizerIdentity.from_dict(tokenizer, "imported tokenizer identity"),
                    layers=LayerRoles(aux=layers["aux"], target=layers["target"]),
                    capture="decoder_layer_output" if known else UNKNOWN, final_norm=final_norm, truncation=UNKNOWN)
    return Provenance(recipe=recipe, environment=unknown_environment(dtype), source=source)


def restored_provenance(record: ExportRecord, layers: dict[str, list[int]], dtype: str, hidden_size: int,
                        tokenizer: dict[str, Any], model: dict[str, Any] | None) -> Provenance | str:
    """The provenance an hsstore export recorded for its files (its variant's, with ``recipe.layers`` the
    exported slots), or why it does not describe this import: the files' dtype or width, the slots, the
    ``--tokenizer`` (the content keys hash it) or a ``--model`` given differ from the record's. The record
    itself must already be trusted (import_records.untrusted_because)."""
    prov = json.loads(json.dumps(record.provenance))
    recipe, env = prov.get("recipe", {}), prov.get("environment", {})
    if layers != {"aux": record.slots.get("aux", []), "target": record.slots.get("target", [])}:
        return f"the files' layers {layers} are not the exported slots {record.slots}"
    if env.get("dtype") != dtype or recipe.get("model", {}).get("hidden_size") != hidden_size:
        return (f"the files hold {dtype} states of width {hidden_size}, the record "
                f"{env.get('dtype')} of width {recipe.get('model', {}).get('hidden_size')}")
    if recipe.get("tokenizer", {}).get("fingerprint") != tokenizer["fingerprint"]:
        return "--tokenizer is not the tokenizer of the exported variant (its content keys would differ)"
    if model is not None and model.get("fingerprint") not in (UNKNOWN, recipe.get("model", {}).get("fingerprint")):
        return "--model is not the model of the exported variant"
    recipe["layers"] = {"aux": list(layers["aux"]), "target": list(layers["target"])}
    env.pop("storage", None)  # the files hold the states as read (a converted variant's, decoded): not its codes
    try:
        return Provenance.from_dict(prov, "the export record's provenance", BadInput)
    except BadInput as e:
        return f"its provenance does not decode ({e})"


def variant_provenance(fmt: Format, root: Path, sidecar: ExportRecord | None, source: ImportSource,
                       tok: dict[str, Any], model: dict[str, Any], model_given: bool,
                       layers: dict[str, list[int]], probe: SourceSample,
                       jobs: int) -> tuple[Provenance, bool, str | None]:
    """(the variant's provenance, whether restored from hsstore's export record, why a record was not
    trusted): a folder hsstore exported, its record sealed and its files the ones the record
    fingerprints, keeps the exported variant's provenance; anything else gets the imported one (unknowns)."""
    imported = imported_provenance(source, tok, model, layers, probe.dtype)
    if sidecar is None:
        return imported, False, None
    why = untrusted_because(fmt, root, sidecar, jobs)
    restored = restored_provenance(sidecar, layers, probe.dtype, probe.hidden_size, tok,
                                   model if model_given else None) if why is None else why
    if isinstance(restored, str):
        return imported, False, f"the export record {str(fmt.sidecar(root))!r} is ignored: {restored}"
    return restored, True, None

