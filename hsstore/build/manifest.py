"""The build manifest (TOML): strict parsing, relative paths, CLI overrides. No I/O besides reading it."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hsstore.storage.codecs import CHOICES as CODECS
from hsstore.storage.codecs import DEFAULT as DEFAULT_CODEC
from hsstore.core.dtypes import parse_dtype
from hsstore.core.errors import BadInput

BACKENDS = ("torch", "fla")
FORMATS = ("auto", "sharegpt", "openai", "text", "prompt_completion")
TOO_LONG = ("truncate", "skip")
# the output of the model's final norm (the state lm_head sees; transformers' last hidden_states entry),
# a named capture beside the decoder layers; stored under layer id num_layers
FINAL_NORM = "final_norm"
ATTENTION = ("sdpa", "eager", "flash_attention_2", "flex_attention")

_SCHEMA: dict[str, set[str]] = {
    "model": {"path", "config", "layers", "seed", "trust_remote_code", "init_device", "attn_implementation"},
    "data": {"files", "format", "max_length", "too_long"},
    "build": {"backends", "dtypes", "devices", "gpus_per_rank", "token_budget", "unit_tokens", "allow_unhealthy"},
    "store": {"path", "codec"},
}


@dataclass(frozen=True)
class Manifest:
    source: str
    model_path: str
    layers: dict[str, list[int]]
    data_files: list[str]
    store_path: str
    config_overrides: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    trust_remote_code: bool = False
    init_device: str = "cpu"
    attn_implementation: str = "sdpa"
    data_format: str = "auto"
    max_length: int = 2048
    too_long: str = "truncate"
    backends: list[str] = field(default_factory=lambda: ["torch"])
    dtypes: list[str] = field(default_factory=lambda: ["bf16"])
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    gpus_per_rank: int = 1  # >1: one model spread over that many GPUs (hsstore.build.placement)
    token_budget: int = 16384
    unit_tokens: int | None = None  # None: as many tokens as make UNIT_BYTES of states
    allow_unhealthy: bool = False
    codec: str = DEFAULT_CODEC

    def with_overrides(self, **kw: Any) -> Manifest:
        """CLI options override the manifest; None means "not given"."""
        return replace(self, **{k: v for k, v in kw.items() if v is not None and v != []})


def _err(source: str, msg: str) -> BadInput:
    return BadInput(f"{source}: {msg}")


def _int(source: str, table: str, key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _err(source, f"[{table}] {key} must be an integer, got {value!r}")
    return value


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
    return {role: [num_layers if i == FINAL_NORM else i for i in ids] for role, ids in layers.items()}


def check_layers_in_model(layers: dict[str, list], num_layers: int, model: str) -> None:
    for role, ids in layers.items():
        bad = [i for i in ids if i != FINAL_NORM and not 0 <= i < num_layers]
        if bad:
            raise BadInput(f"layer(s) {bad} in layers.{role} are out of range: {model} has {num_layers} decoder layers "
                           f"(valid 0..{num_layers - 1}; layer i is the output of decoder layer i; "
                           f"the state after the final norm is named \"{FINAL_NORM}\")")


def load_manifest(path: str | Path) -> Manifest:
    p = Path(path)
    source = str(path)
    if not p.is_file():
        raise BadInput(f"manifest {source!r} does not exist; pass a TOML file such as manifests/tiny.toml")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise _err(source, f"malformed TOML: {e}") from None
    except UnicodeDecodeError:
        raise _err(source, "is not UTF-8 text") from None
    unknown_tables = set(raw) - set(_SCHEMA)
    if unknown_tables:
        raise _err(source, f"unknown table(s) {sorted(unknown_tables)}; allowed: {sorted(_SCHEMA)}")
    for table, keys in _SCHEMA.items():
        got = raw.get(table, {})
        if not isinstance(got, dict):
            raise _err(source, f"[{table}] must be a table")
        unknown = set(got) - keys
        if unknown:
            raise _err(source, f"unknown key(s) {sorted(unknown)} in [{table}] (typo?); allowed: {sorted(keys)}")
    base = p.resolve().parent
    model, data, build, store = (raw.get(t, {}) for t in ("model", "data", "build", "store"))
    if "path" not in model:
        raise _err(source, "[model] path is missing; e.g. path = \"builtin:tiny-qwen3_5\"")
    if "layers" not in model:
        raise _err(source, "[model] layers is missing; e.g. layers = { aux = [1, 2], target = [3] }")
    if not data.get("files"):
        raise _err(source, "[data] files is missing or empty; e.g. files = [\"conversations.jsonl\"]")
    if not store.get("path"):
        raise _err(source, "[store] path is missing; e.g. path = \"out/tiny.zarr\" (or pass --store)")

    def resolve(x: str) -> str:
        return x if ("://" in x or Path(x).is_absolute()) else os.path.normpath(base / x)

    mp = str(model["path"])
    files = data["files"] if isinstance(data["files"], list) else [data["files"]]
    m = Manifest(
        source=source,
        model_path=mp if mp.startswith("builtin:") else resolve(mp),
        layers=parse_layers(source, model["layers"]),
        data_files=[resolve(str(f)) for f in files],
        store_path=resolve(str(store["path"])),
        config_overrides=dict(model.get("config", {})),
        seed=int(model.get("seed", 0)),
        trust_remote_code=bool(model.get("trust_remote_code", False)),
        init_device=str(model.get("init_device", "cpu")),
        attn_implementation=str(model.get("attn_implementation", "sdpa")),
        data_format=str(data.get("format", "auto")),
        max_length=int(data.get("max_length", 2048)),
        too_long=str(data.get("too_long", "truncate")),
        backends=list(build.get("backends", ["torch"])),
        dtypes=list(build.get("dtypes", ["bf16"])),
        devices=list(build.get("devices", ["cpu"])),
        gpus_per_rank=_int(source, "build", "gpus_per_rank", build.get("gpus_per_rank", 1)),
        token_budget=int(build.get("token_budget", 16384)),
        unit_tokens=int(build["unit_tokens"]) if "unit_tokens" in build else None,
        allow_unhealthy=bool(build.get("allow_unhealthy", False)),
        codec=str(store.get("codec", DEFAULT_CODEC)),
    )
    return validate(m)


def validate(m: Manifest) -> Manifest:
    """Value checks shared by the manifest and CLI overrides."""
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
    if m.gpus_per_rank < 1:
        raise BadInput(f"[build] gpus_per_rank = {m.gpus_per_rank}; it must be 1 or more")
    if m.gpus_per_rank > 1 and m.devices != ["cuda"]:
        raise BadInput(f"[build] gpus_per_rank = {m.gpus_per_rank} spreads the model over that many GPUs of each rank; "
                       f"set devices = [\"cuda\"] (got {m.devices}) — the GPUs are picked from the local rank")
    if m.gpus_per_rank > 1 and m.init_device == "device":
        raise BadInput("[model] init_device = \"device\" draws random weights on one GPU; with gpus_per_rank > 1 the "
                       "model is drawn on the CPU: set init_device = \"cpu\"")
    return replace(m, dtypes=[parse_dtype(d) for d in m.dtypes])
