"""The build manifest and its rules, in one place: the TOML file's tables as typed records (keys, types and
defaults), the rules of the document (tables, required keys, layers), the allowed values and the value
rules of a resolved ``Manifest`` (a CLI override is held to the same rules), and the layer rules that need
the model's layer count (``resolve_layers``, called once the model is known). Types are checked strictly
(``trust_remote_code = "false"`` is an error, not True). Which codecs exist is the store's registry, passed in.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

import msgspec

from hsstore.core.errors import BadInput
from hsstore.core.layer_numbering import check_no_leak
from hsstore.core.precision_names import PRECISIONS
from hsstore.core.schema.record import Record

# --- ``[generate]``: the manifest's table of regeneration (the target rewrites the replies before capture), its

# template kwargs: scalars, or lists of them
TemplateValue = int | float | str | bool | list[int | float | str | bool]
ENGINES = ("model", "openai")
TURNS = ("last", "all")
REASONING = ("keep", "drop")


class GenerateTable(Record):
    """``[generate]``: the target regenerates the replies before their states are captured
    (hsstore.capture.generate). ``engine = "model"``: the target itself, in this process, through transformers
    ``generate``; ``"openai"``: an OpenAI-compatible server at ``url`` serving the same model. ``turns``: the
    last assistant turn (rows without one are prompts) or every assistant turn in order. ``temperature`` 0
    is greedy. ``reasoning = "drop"``: a reply's leading <think>...</think> stays in the sequence but out of
    the loss mask. ``drop_cut``: drop replies cut at ``max_new_tokens`` (kept, and counted, by default)."""

    engine: str = "model"
    url: str | None = None
    turns: str = "last"
    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    n: int = 1
    stop: list[str] = []
    chat_template_kwargs: dict[str, TemplateValue] = {}
    reasoning: str = "keep"
    drop_cut: bool = False
    concurrency: int = 8  # openai: requests in flight
    timeout_s: float = 300.0  # openai: per request
    retries: int = 3  # openai: attempts after the first, per request

    def __post_init__(self) -> None:
        if self.url is not None:  # one spelling of a base URL: with a trailing "/" it keyed other checkpoints
            msgspec.structs.force_setattr(self, "url", self.url.rstrip("/"))


def check_generate(g: GenerateTable) -> None:
    """The value rules of ``[generate]`` (one line naming the key and what it takes)."""
    if g.engine not in ENGINES:
        raise BadInput(f"[generate] engine = {g.engine!r}; choose one of {', '.join(ENGINES)}")
    if g.engine == "openai" and not (g.url or "").startswith(("http://", "https://")):
        raise BadInput(
            '[generate] engine = "openai" needs url, the server\'s base URL, e.g. url = "http://127.0.0.1:8000/v1"'
        )
    if g.engine == "model" and g.url is not None:
        raise BadInput('[generate] url is for engine = "openai"; the in-process engine ("model") takes none')
    if g.turns not in TURNS:
        raise BadInput(f"[generate] turns = {g.turns!r}; choose last or all")
    if g.reasoning not in REASONING:
        raise BadInput(f"[generate] reasoning = {g.reasoning!r}; choose keep or drop")
    for key, value, low in (
        ("max_new_tokens", g.max_new_tokens, 1),
        ("n", g.n, 1),
        ("concurrency", g.concurrency, 1),
        ("top_k", g.top_k, 0),
        ("retries", g.retries, 0),
        ("seed", g.seed, 0),
    ):
        if value < low:
            raise BadInput(f"[generate] {key} = {value}; it must be at least {low}")
    if not 0 <= g.temperature <= 10 or not 0 < g.top_p <= 1 or not g.timeout_s > 0:
        raise BadInput(
            f"[generate] temperature ({g.temperature}) must be in [0, 10], top_p ({g.top_p}) in (0, 1] "
            f"and timeout_s ({g.timeout_s}) above 0"
        )
    if g.n > 1 and g.temperature == 0:
        raise BadInput(
            f"[generate] n = {g.n} with temperature = 0 (greedy) gives {g.n} identical replies; set a "
            "temperature above 0, or n = 1"
        )
    if any(not isinstance(x, str) or not x for x in g.stop):
        raise BadInput("[generate] stop must be a list of non-empty strings")


BACKENDS = ("torch", "fla")
DATA_FORMATS = ("auto", "sharegpt", "openai", "text", "prompt_completion")
TOO_LONG = ("truncate", "skip")
ATTENTION = ("sdpa", "eager", "flash_attention_2", "flex_attention")
INIT_DEVICES = ("cpu", "device")
# the output of the model's final norm (what lm_head sees; transformers' last hidden_states entry): a named
# capture beside the decoder layers, stored under layer id num_layers
FINAL_NORM = "final_norm"
LayerId = int | Literal["final_norm"]
# overrides of a builtin model's config: scalars, or lists of them (e.g. layer_types)
ConfigValue = int | float | str | bool | list[int | float | str | bool]


class LayerSpec(Record):
    """``layers = { aux = [1, 2], target = [3] }`` as written (``"final_norm"`` allowed)."""

    target: list[LayerId]
    aux: list[LayerId] = []


class ModelTable(Record):
    path: str
    layers: LayerSpec
    config: dict[str, ConfigValue] = {}
    seed: int = 0
    trust_remote_code: bool = False
    init_device: str = "cpu"
    attn_implementation: str = "sdpa"


class DataTable(Record):
    files: list[str] | str
    format: str = "auto"
    max_length: int = 2048
    too_long: str = "truncate"


class BuildTable(Record):
    backends: list[str] = msgspec.field(default_factory=lambda: ["torch"])
    dtypes: list[str] = msgspec.field(default_factory=lambda: ["bf16"])
    devices: list[str] = msgspec.field(default_factory=lambda: ["cpu"])
    gpus_per_rank: int = 1  # >1: one model spread over that many GPUs
    token_budget: int = 16384
    unit_tokens: int | None = None  # None: as many tokens as make about 1 GiB of states
    allow_unhealthy: bool = False
    label: str | None = None  # the variant's human label (a build that makes one variant)
    another_model: bool = False  # let a model into a store that holds another one


class StoreTable(Record):
    path: str = ""
    codec: str = "shuffle-zstd"
    precision: str | None = None  # None: states stored as computed; "fp8-e4m3": quantized (hsstore.core.quant)


class ManifestFile(Record):
    """The TOML document: four tables (and an optional [generate]), unknown tables and keys refused."""

    model: ModelTable
    data: DataTable
    build: BuildTable = BuildTable()
    store: StoreTable = StoreTable()
    generate: GenerateTable | None = None


# table name -> its record (the allowed keys of each table are its fields)
TABLES: dict[str, type[Record]] = {
    "model": ModelTable,
    "data": DataTable,
    "build": BuildTable,
    "store": StoreTable,
    "generate": GenerateTable,
}


class Manifest(Record):
    """A resolved manifest: absolute paths, one flat record the build reads (every value comes from a
    ``ManifestFile``, whose tables hold the defaults, or from a CLI override)."""

    source: str
    model_path: str
    layers: dict[str, list[LayerId]]  # {"aux": [...], "target": [...]} as written
    data_files: list[str]
    store_path: str
    config_overrides: dict[str, Any]
    seed: int
    trust_remote_code: bool
    init_device: str
    attn_implementation: str
    data_format: str
    max_length: int
    too_long: str
    backends: list[str]
    dtypes: list[str]
    devices: list[str]
    gpus_per_rank: int
    token_budget: int
    unit_tokens: int | None
    allow_unhealthy: bool
    codec: str
    precision: str | None = None
    label: str | None = None
    another_model: bool = False
    generate: GenerateTable | None = None  # None: the replies in the data are captured as they are

    def with_overrides(self, **changes: Any) -> Manifest:
        """CLI options override the manifest; None (or an empty list) means "not given"."""
        return self.replace(**{k: v for k, v in changes.items() if v is not None and v != []})

    def with_generate(self, **changes: Any) -> Manifest:
        """CLI options override ``[generate]`` keys (None: not given); any given one turns regeneration on."""
        given = {k: v for k, v in changes.items() if v is not None and v != []}
        if not given:
            return self
        base = self.generate.to_dict() if self.generate is not None else {}
        return self.replace(generate=GenerateTable.from_dict({**base, **given}, "build options", BadInput))


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


def parse_layers(source: str, layers: Any) -> dict[str, list[LayerId]]:
    """``[model] layers`` as written, held to the layer rules: lists of distinct ids (or "final_norm"), a
    target, no layer both aux and target (a target leaking into the conditioning layers)."""
    if not isinstance(layers, dict) or set(layers) - {"aux", "target"}:
        raise _err(
            source, "[model] layers must be a table with keys aux and target, e.g. { aux = [1, 2], target = [3] }"
        )
    out: dict[str, list[LayerId]] = {}
    for role in ("aux", "target"):
        ids = layers.get(role, [])
        if not isinstance(ids, list) or not all(
            (isinstance(i, int) and not isinstance(i, bool)) or i == FINAL_NORM for i in ids
        ):
            raise _err(source, f'[model] layers.{role} must be a list of integers (or "{FINAL_NORM}"), got {ids!r}')
        if len(set(ids)) != len(ids):
            raise _err(source, f"[model] layers.{role} lists a layer twice: {ids}")
        out[role] = list(ids)
    if not out["target"]:
        raise _err(source, "[model] layers.target is empty; name the layer the drafter predicts, e.g. target = [3]")
    both = sorted(set(out["aux"]) & set(out["target"]), key=str)
    if both:
        raise _err(
            source,
            f"layer(s) {both} are both aux and target; a target layer must not leak into the "
            "conditioning layers — remove it from aux",
        )
    return out


def resolve_layers(layers: dict[str, list[Any]], num_layers: int, model: str) -> dict[str, list[int]]:
    """Range-check decoder layer ids and give the final norm its stored id, ``num_layers``."""
    check_layers_in_model(layers, num_layers, model)
    out = {role: [num_layers if i == FINAL_NORM else i for i in ids] for role, ids in layers.items()}
    check_no_leak(
        out.get("aux", []),
        out.get("target", []),
        num_layers,
        f"drop layer {num_layers - 1} from aux or target layer {num_layers - 1} instead of final_norm",
    )
    return out


def check_layers_in_model(layers: dict[str, list[Any]], num_layers: int, model: str) -> None:
    """Every decoder layer id of ``layers`` exists in ``model`` (of ``num_layers`` decoder layers)."""
    for role, ids in layers.items():
        bad = [i for i in ids if i != FINAL_NORM and not 0 <= i < num_layers]
        if bad:
            raise BadInput(
                f"layer(s) {bad} in layers.{role} are out of range: {model} has {num_layers} decoder layers "
                f"(valid 0..{num_layers - 1}; layer i is the output of decoder layer i; "
                f'the state after the final norm is named "{FINAL_NORM}")'
            )


def _check_keys(source: str, raw: dict[str, Any]) -> None:
    """Unknown tables and keys, named with what is allowed (the tables' own fields)."""
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
        raise _err(source, '[model] path is missing; e.g. path = "builtin:tiny-qwen3_5"')
    if "layers" not in model:
        raise _err(source, "[model] layers is missing; e.g. layers = { aux = [1, 2], target = [3] }")
    parse_layers(source, model["layers"])  # the layer rules, with their own messages, before types
    if not data.get("files"):
        raise _err(source, '[data] files is missing or empty; e.g. files = ["conversations.jsonl"]')


def parse_manifest_file(raw: dict[str, Any], source: str) -> ManifestFile:
    """The TOML document ``raw`` (from ``source``) as typed tables: unknown tables and keys, missing keys,
    layer rules and wrong types are one line naming the key (BadInput)."""
    _check_keys(source, raw)
    _require(source, raw)
    return ManifestFile.from_dict(raw, source, BadInput, toml=True)


def check_manifest(m: Manifest, codecs: Collection[str], need_store: bool = True) -> Manifest:
    """``m`` held to every value rule (the manifest's values and CLI overrides alike), dtypes spelled the one
    way (bfloat16 -> bf16). ``codecs``: the compressions the store knows. ``need_store``: the store path must
    be set (a manifest may leave it to ``--store``)."""
    _check_values(m, codecs)
    dtypes = _check_runs(m)
    _check_build(m)
    if m.generate is not None:
        check_generate(m.generate)
    if need_store and not m.store_path:
        raise BadInput(f'{m.source}: [store] path is missing; e.g. path = "out/tiny.zarr" (or pass --store)')
    return m.replace(dtypes=dtypes)


def _check_values(m: Manifest, codecs: Collection[str]) -> None:
    if m.data_format not in DATA_FORMATS:
        raise BadInput(f"unknown data format {m.data_format!r}; choose one of {', '.join(DATA_FORMATS)}")
    if m.too_long not in TOO_LONG:
        raise BadInput(f"[data] too_long = {m.too_long!r}; choose truncate or skip")
    if m.max_length < 2:
        raise BadInput(f"[data] max_length = {m.max_length}; it must be at least 2")
    if m.attn_implementation not in ATTENTION:
        raise BadInput(f"unknown attn_implementation {m.attn_implementation!r}; choose one of {', '.join(ATTENTION)}")
    if m.init_device not in INIT_DEVICES:
        raise BadInput(f"[model] init_device = {m.init_device!r}; choose cpu or device")
    if m.codec not in codecs:
        raise BadInput(f"unknown compression {m.codec!r}; choose one of {', '.join(codecs)}")
    if m.precision is not None and m.precision not in PRECISIONS:
        raise BadInput(
            f"[store] precision = {m.precision!r}; choose one of {', '.join(PRECISIONS)} (or leave it out "
            "to store the states as computed)"
        )
    if m.token_budget < m.max_length:
        raise BadInput(f"[build] token_budget ({m.token_budget}) must be at least [data] max_length ({m.max_length})")


def _check_runs(m: Manifest) -> list[str]:
    """Backends, dtypes and devices: known, at least one each, none twice; the dtypes in their one spelling."""
    from hsstore.core.dtypes import parse_dtype  # (numpy: not at import, so `hsstore --help` stays light)

    for b in m.backends:
        parse_backend(b)
    try:
        dtypes = [parse_dtype(d) for d in m.dtypes]
    except ValueError as e:
        raise BadInput(str(e)) from None
    for dev in m.devices:
        parse_device(dev)
    if not (m.backends and m.dtypes and m.devices):
        raise BadInput("[build] backends, dtypes and devices must each name at least one value")
    for key, values in (("backends", m.backends), ("dtypes", dtypes), ("devices", m.devices)):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:  # one variant would be built twice over (bf16 and bfloat16 are one dtype)
            raise BadInput(f"[build] {key} names {twice[0]!r} twice ({values}); list each once")
    return dtypes


def _check_build(m: Manifest) -> None:
    if m.gpus_per_rank < 1:
        raise BadInput(f"[build] gpus_per_rank = {m.gpus_per_rank}; it must be 1 or more")
    if m.gpus_per_rank > 1 and m.devices != ["cuda"]:
        raise BadInput(
            f"[build] gpus_per_rank = {m.gpus_per_rank} spreads the model over that many GPUs of each rank; "
            f'set devices = ["cuda"] (got {m.devices}) — the GPUs are picked from the local rank'
        )
    if m.gpus_per_rank > 1 and m.init_device == "device":
        raise BadInput(
            '[model] init_device = "device" draws random weights on one GPU; with gpus_per_rank > 1 the '
            'model is drawn on the CPU: set init_device = "cpu"'
        )
    if m.unit_tokens is not None and m.unit_tokens < 1:
        raise BadInput(f"[build] unit_tokens = {m.unit_tokens}; it must be 1 or more (or left out for ~1 GiB units)")
    _check_label(m)


def _check_label(m: Manifest) -> None:
    """A label names one variant: a build given one makes one (one backend, dtype and device)."""
    from hsstore.core.schema.store_records import LABEL_PATTERN

    if m.label is None:
        return
    if not LABEL_PATTERN.match(m.label):
        raise BadInput(
            f"label {m.label!r} is not a label: use letters, digits, '_', '-' and '.' (at most 64, starting "
            "with a letter or digit), e.g. sdpa-bf16"
        )
    runs = len(m.backends) * len(m.dtypes) * len(m.devices)
    if runs > 1:
        raise BadInput(
            f"--label {m.label!r} names one variant but this build makes {runs} (backends {m.backends}, "
            f"dtypes {m.dtypes}, devices {m.devices}); build one at a time, e.g. --dtype {m.dtypes[0]}"
        )
