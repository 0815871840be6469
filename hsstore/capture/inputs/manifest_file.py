"""The build manifest (TOML): typed tables (hsstore.core.schema.manifest), value rules, relative paths,
CLI overrides. No I/O besides reading the file."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from hsstore.core.dtypes import parse_dtype
from hsstore.core.errors import BadInput
from hsstore.core.leakage import check_no_leak
from hsstore.core.paths import expand_user
from hsstore.core.precision_names import PRECISIONS
from hsstore.core.schema.manifest import FINAL_NORM, TABLES, Manifest, ManifestFile
from hsstore.storage.codecs import CHOICES as CODECS

BACKENDS = ("torch", "fla")
FORMATS = ("auto", "sharegpt", "openai", "text", "prompt_completion")
TOO_LONG = ("truncate", "skip")
ATTENTION = ("sdpa", "eager", "flash_attention_2", "flex_attention")
# a manifest file larger than this is not a manifest (a wrong path, a data file passed by mistake)
MAX_MANIFEST_BYTES = 1 << 20

__all__ = ["FINAL_NORM", "Manifest", "check_layers_in_model", "load_manifest", "parse_backend", "parse_device",
           "resolve_layers", "validate"]


def _err(source: str, msg: str) -> BadInput:
    return BadInput(f"{source}: {msg}")


def parse_device(dev: str) -> str:
    if dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit()):
        return dev
    raise BadInput(f"unknown device {dev!r}; use cpu, cuda or cuda:N")


def parse_backend(b: str) -> str:
    if b not in BACKENDS:
        raise BadInput(f"unknown backend {b!r}; choose one of {', '.join(BACKENDS)}")
    return b


def parse_layers(source: str, layers: Any) -> dict[str, list[int]]:
    if not isinstance(layers, dict) or set(layers) - {"aux", "target"}:
        raise _err(source, "[model] layers must be a table with keys aux and target, e.g. { aux = [1, 2], target = [3] }")
    out: dict[str, list[int]] = {}
    for role in ("aux", "target"):
        ids = layers.get(role, [])
        if not isinstance(ids, list) or not all((isinstance(i, int) and not isinstance(i, bool)) or i == FINAL_NORM
                                                for i in ids):
            raise _err(source, f"[model] layers.{role} must be a list of integers (or \"{FINAL_NORM}\"), got {ids!r}")
        if len(set(ids)) != len(ids):
            raise _err(source, f"[model] layers.{role} lists a layer twice: {ids}")
        out[role] = list(ids)
    if not out["target"]:
        raise _err(source, "[model] layers.target is empty; name the layer the drafter predicts, e.g. target = [3]")
    if not out["aux"] and not out["target"]:
        raise _err(source, "[model] layers is empty; name aux and target layers")
    both = sorted(set(out["aux"]) & set(out["target"]), key=str)
    if both:
        raise _err(source, f"layer(s) {both} are both aux and target; a target layer must not leak into the "
                           "conditioning layers — remove it from aux")
    return out


def resolve_layers(layers: dict[str, list], num_layers: int, model: str) -> dict[str, list[int]]:
    """Range-check decoder layer ids and give the final norm its stored id, ``num_layers``."""
    check_layers_in_model(layers, num_layers, model)
    out = {role: [num_layers if i == FINAL_NORM else i for i in ids] for role, ids in layers.items()}
    check_no_leak(out.get("aux", []), out.get("target", []), num_layers,
                  f"drop layer {num_layers - 1} from aux or target layer {num_layers - 1} instead of final_norm")
    return out


def check_layers_in_model(layers: dict[str, list], num_layers: int, model: str) -> None:
    for role, ids in layers.items():
        bad = [i for i in ids if i != FINAL_NORM and not 0 <= i < num_layers]
        if bad:
            raise BadInput(f"layer(s) {bad} in layers.{role} are out of range: {model} has {num_layers} decoder layers "
                           f"(valid 0..{num_layers - 1}; layer i is the output of decoder layer i; "
                           f"the state after the final norm is named \"{FINAL_NORM}\")")


def _read_toml(p: Path, source: str) -> dict[str, Any]:
    if not p.is_file():
        raise BadInput(f"manifest {source!r} does not exist; pass a TOML file such as manifests/tiny.toml")
    if p.stat().st_size > MAX_MANIFEST_BYTES:
        raise _err(source, f"is {p.stat().st_size:,} bytes; a manifest is a small TOML file (pass the manifest, "
                           "not a data file)")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise _err(source, f"malformed TOML: {e}") from None
    except UnicodeDecodeError:
        raise _err(source, "is not UTF-8 text") from None


def _check_keys(source: str, raw: dict[str, Any]) -> None:
    """Unknown tables and keys, named with what is allowed (the schema's own fields)."""
    unknown_tables = set(raw) - set(TABLES)
    if unknown_tables:
        raise _err(source, f"unknown table(s) {sorted(unknown_tables)}; allowed: {sorted(TABLES)}")
    for table, record in TABLES.items():
        got = raw.get(table, {})
        if not isinstance(got, dict):
            raise _err(source, f"[{table}] must be a table, got {got!r}")
        keys = set(record.__struct_fields__)
        unknown = set(got) - keys
        if unknown:
            raise _err(source, f"unknown key(s) {sorted(unknown)} in [{table}] (typo?); allowed: {sorted(keys)}")


def _require(source: str, raw: dict[str, Any]) -> None:
    model, data = raw.get("model", {}), raw.get("data", {})
    if "path" not in model:
        raise _err(source, "[model] path is missing; e.g. path = \"builtin:tiny-qwen3_5\"")
    if "layers" not in model:
        raise _err(source, "[model] layers is missing; e.g. layers = { aux = [1, 2], target = [3] }")
    parse_layers(source, model["layers"])  # the layer rules, with their own messages, before types
    if not data.get("files"):
        raise _err(source, "[data] files is missing or empty; e.g. files = [\"conversations.jsonl\"]")


def load_manifest(path: str | Path) -> Manifest:
    """The resolved manifest at ``path``: strict types, unknown keys refused, paths made absolute."""
    p, source = Path(expand_user(str(path))), str(path)
    raw = _read_toml(p, source)
    _check_keys(source, raw)
    _require(source, raw)
    f = ManifestFile.from_dict(raw, source, BadInput, toml=True)
    base = p.resolve().parent

    def resolve(x: str) -> str:
        x = expand_user(x)  # "~/data.jsonl" is the home folder's, as in a shell, not "<manifest dir>/~"
        return x if ("://" in x or Path(x).is_absolute() or not x) else os.path.normpath(base / x)

    files = f.data.files if isinstance(f.data.files, list) else [f.data.files]
    model, data, build, store = f.model, f.data, f.build, f.store
    m = Manifest(
        source=source, model_path=model.path if model.path.startswith("builtin:") else resolve(model.path),
        layers=model.layers.to_dict(), data_files=[resolve(x) for x in files], store_path=resolve(store.path),
        config_overrides=dict(model.config), seed=model.seed, trust_remote_code=model.trust_remote_code,
        init_device=model.init_device, attn_implementation=model.attn_implementation, data_format=data.format,
        max_length=data.max_length, too_long=data.too_long, backends=list(build.backends),
        dtypes=list(build.dtypes), devices=list(build.devices), gpus_per_rank=build.gpus_per_rank,
        token_budget=build.token_budget, unit_tokens=build.unit_tokens, allow_unhealthy=build.allow_unhealthy,
        codec=store.codec, precision=store.precision,
    )
    return validate(m, need_store=False)


def validate(m: Manifest, need_store: bool = True) -> Manifest:
    """Value checks shared by the manifest and CLI overrides (``need_store``: the store path must be set;
    a manifest may leave it to ``--store``)."""
    if m.data_format not in FORMATS:
        raise BadInput(f"unknown data format {m.data_format!r}; choose one of {', '.join(FORMATS)}")
    if m.too_long not in TOO_LONG:
        raise BadInput(f"[data] too_long = {m.too_long!r}; choose truncate or skip")
    if m.max_length < 2:
        raise BadInput(f"[data] max_length = {m.max_length}; it must be at least 2")
    if m.attn_implementation not in ATTENTION:
        raise BadInput(f"unknown attn_implementation {m.attn_implementation!r}; choose one of {', '.join(ATTENTION)}")
    if m.init_device not in ("cpu", "device"):
        raise BadInput(f"[model] init_device = {m.init_device!r}; choose cpu or device")
    if m.codec not in CODECS:
        raise BadInput(f"unknown compression {m.codec!r}; choose one of {', '.join(CODECS)}")
    if m.precision is not None and m.precision not in PRECISIONS:
        raise BadInput(f"[store] precision = {m.precision!r}; choose one of {', '.join(PRECISIONS)} (or leave it out "
                       "to store the states as computed)")
    if m.token_budget < m.max_length:
        raise BadInput(f"[build] token_budget ({m.token_budget}) must be at least [data] max_length ({m.max_length})")
    for b in m.backends:
        parse_backend(b)
    for d in m.dtypes:
        try:
            parse_dtype(d)
        except ValueError as e:
            raise BadInput(str(e)) from None
    for dev in m.devices:
        parse_device(dev)
    if not (m.backends and m.dtypes and m.devices):
        raise BadInput("[build] backends, dtypes and devices must each name at least one value")
    for key, values in (("backends", m.backends), ("dtypes", [parse_dtype(d) for d in m.dtypes]), ("devices", m.devices)):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:  # one variant would be built twice over (bf16 and bfloat16 are one dtype)
            raise BadInput(f"[build] {key} names {twice[0]!r} twice ({values}); list each once")
    if m.gpus_per_rank < 1:
        raise BadInput(f"[build] gpus_per_rank = {m.gpus_per_rank}; it must be 1 or more")
    if m.gpus_per_rank > 1 and m.devices != ["cuda"]:
        raise BadInput(f"[build] gpus_per_rank = {m.gpus_per_rank} spreads the model over that many GPUs of each rank; "
                       f"set devices = [\"cuda\"] (got {m.devices}) — the GPUs are picked from the local rank")
    if m.gpus_per_rank > 1 and m.init_device == "device":
        raise BadInput("[model] init_device = \"device\" draws random weights on one GPU; with gpus_per_rank > 1 the "
                       "model is drawn on the CPU: set init_device = \"cpu\"")
    if m.unit_tokens is not None and m.unit_tokens < 1:
        raise BadInput(f"[build] unit_tokens = {m.unit_tokens}; it must be 1 or more (or left out for ~1 GiB units)")
    if need_store and not m.store_path:
        raise BadInput(f"{m.source}: [store] path is missing; e.g. path = \"out/tiny.zarr\" (or pass --store)")
    return m.replace(dtypes=[parse_dtype(d) for d in m.dtypes])
