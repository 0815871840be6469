"""The build manifest (TOML) read from its file, relative paths resolved against the manifest's folder. Every
rule of the document and its values is the schema's (hsstore.core.schema.manifest); this module reads, and
names the store's codecs to the rules."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from hsstore.core.errors import BadInput
from hsstore.core.nesting import MAX_INPUT_DEPTH, TooDeep, check_depth
from hsstore.core.outputs import expand_user
from hsstore.core.schema.manifest import (  # noqa: F401
    FINAL_NORM,
    Manifest,
    check_layers_in_model,
    check_manifest,
    parse_manifest_file,
    resolve_layers,
)
from hsstore.storage.codecs import CHOICES as CODECS

# a manifest file larger than this is not a manifest (a wrong path, a data file passed by mistake)
MAX_MANIFEST_BYTES = 1 << 20

__all__ = ["FINAL_NORM", "Manifest", "check_layers_in_model", "load_manifest", "resolve_layers", "validate"]


def _err(source: str, msg: str) -> BadInput:
    return BadInput(f"{source}: {msg}")


def _read_toml(p: Path, source: str) -> dict[str, Any]:
    if not p.is_file():
        raise BadInput(f"manifest {source!r} does not exist; pass a TOML file such as manifests/tiny.toml")
    if p.stat().st_size > MAX_MANIFEST_BYTES:
        raise _err(
            source,
            f"is {p.stat().st_size:,} bytes; a manifest is a small TOML file (pass the manifest, not a data file)",
        )
    try:
        data: dict[str, Any] = check_depth(tomllib.loads(p.read_text(encoding="utf-8")))
        return data
    except tomllib.TOMLDecodeError as e:
        raise _err(source, f"malformed TOML: {e}") from None
    except (RecursionError, TooDeep):
        raise _err(
            source,
            f"nests arrays or tables deeper than {MAX_INPUT_DEPTH} levels; a manifest is a few flat "
            "tables (see manifests/tiny.toml)",
        ) from None
    except UnicodeDecodeError:
        raise _err(source, "is not UTF-8 text") from None
    except ValueError as e:  # tomllib's int() of a number with thousands of digits
        raise _err(source, f"malformed TOML: {str(e).split(';')[0]}") from None


def load_manifest(path: str | Path) -> Manifest:
    """The resolved manifest at ``path``: strict types, unknown keys refused, paths made absolute."""
    p, source = Path(expand_user(str(path))), str(path)
    f = parse_manifest_file(_read_toml(p, source), source)
    base = p.resolve().parent

    def resolve(x: str) -> str:
        x = expand_user(x)  # "~/data.jsonl" is the home folder's, as in a shell, not "<manifest dir>/~"
        return x if ("://" in x or Path(x).is_absolute() or not x) else os.path.normpath(base / x)

    files = f.data.files if isinstance(f.data.files, list) else [f.data.files]
    model, data, build, store = f.model, f.data, f.build, f.store
    m = Manifest(
        source=source,
        model_path=model.path if model.path.startswith("builtin:") else resolve(model.path),
        layers=model.layers.to_dict(),
        data_files=[resolve(x) for x in files],
        store_path=resolve(store.path),
        config_overrides=dict(model.config),
        seed=model.seed,
        trust_remote_code=model.trust_remote_code,
        init_device=model.init_device,
        attn_implementation=model.attn_implementation,
        data_format=data.format,
        max_length=data.max_length,
        too_long=data.too_long,
        backends=list(build.backends),
        dtypes=list(build.dtypes),
        devices=list(build.devices),
        gpus_per_rank=build.gpus_per_rank,
        token_budget=build.token_budget,
        unit_tokens=build.unit_tokens,
        allow_unhealthy=build.allow_unhealthy,
        codec=store.codec,
        precision=store.precision,
        label=build.label,
        another_model=build.another_model,
        generate=f.generate,
    )
    return validate(m, need_store=False)


def validate(m: Manifest, need_store: bool = True) -> Manifest:
    """``m`` held to the schema's rules with this store's codecs (hsstore.core.schema.manifest.check_manifest)."""
    return check_manifest(m, CODECS, need_store)
