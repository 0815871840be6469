"""The target model of a recipe: builtin or a local HF directory — its identity, tokenizer and loading."""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hsstore.capture.inputs.lossmask import chat_date
from hsstore.capture.model.builtin import GENERATOR_VERSION, builtin_config, builtin_tokenizer
from hsstore.core.errors import BadInput, BuildFailed, HsstoreError, one_line
from hsstore.core.flops import ForwardShape
from hsstore.core.keys import file_hash, fingerprint, hash_files, stamp
from hsstore.core.nesting import loads_bounded
from hsstore.core.schema.provenance import ModelIdentity, TokenizerIdentity
from hsstore.core.schema.store_records import FileStamp, HashedFile

# --- A local model's weight files, checked before any store is made: each file whole (a safetensors file ends

MAX_HEADER_BYTES = 100 << 20


def index_shards(index: Path) -> list[str]:
    """The shard file names a sharded checkpoint's ``*.index.json`` maps its weights to."""
    try:
        wmap = loads_bounded(index.read_bytes()[: 64 << 20]).get("weight_map", {})
    except (OSError, ValueError, AttributeError) as e:
        raise BadInput(
            f"{index} is not a readable weight index ({type(e).__name__}); re-download the checkpoint"
        ) from None
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise BadInput(f"{index}: weight_map is not a table of tensor name -> shard file; re-download the checkpoint")
    return sorted(set(wmap.values()))


def check_safetensors(path: Path) -> None:
    """BadInput unless ``path`` is a whole safetensors file: its header parses and its tensors end exactly
    where the file does (a truncated download or a foreign file is named here, before any store is made)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            header = loads_bounded(f.read(n)) if 0 < n <= min(size - 8, 100 << 20) else None
        ends = (
            [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
            if isinstance(header, dict)
            else None
        )
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        ends = None
    if ends is None or 8 + n + max(ends, default=0) != size:
        raise BadInput(
            f"weight file {str(path)!r} is not a whole safetensors file (truncated or damaged?); "
            "re-download or re-save the checkpoint"
        )


def check_torch_file(path: Path) -> None:
    """BadInput unless ``path`` is a whole torch checkpoint: the zip torch.save writes (since 1.6) with its
    pickle, every member's CRC checked (one read, like hashing it), or a legacy pickle (not checkable
    without loading it: accepted). Found here, before any store is made, not by the worker."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if head != b"PK\x03\x04":
            ok = head[:1] == b"\x80"  # a pickle of protocol 2 or later: the legacy format
        else:
            with zipfile.ZipFile(path) as z:
                ok = any(n.endswith("data.pkl") for n in z.namelist()) and z.testzip() is None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        ok = False
    if not ok:
        raise BadInput(
            f"weight file {str(path)!r} is not a whole torch checkpoint (truncated or damaged?); "
            "re-download or re-save the checkpoint"
        )


LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
MAX_HEADER_BYTES = 100 << 20


def _safetensors_header(path: Path) -> dict[str, Any]:
    """Tensor name -> {"shape", "dtype"} from a safetensors file's header (nothing else is read)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n <= MAX_HEADER_BYTES:
            return {}
        header = loads_bounded(f.read(n))
    return (
        {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
        if isinstance(header, dict)
        else {}
    )


def weight_shapes(files: list[Path]) -> tuple[set[str], dict[str, list[int]]]:
    """(every tensor name the weight files or their index name, shapes of those in safetensors headers)."""
    names: set[str] = set()
    shapes: dict[str, list[int]] = {}
    for p in files:
        try:
            if p.name.endswith(".safetensors"):
                for k, v in _safetensors_header(p).items():
                    names.add(k)
                    if isinstance(v.get("shape"), list):
                        shapes[k] = v["shape"]
            elif p.name.endswith(".index.json"):
                wmap = loads_bounded(p.read_bytes()[:MAX_HEADER_BYTES]).get("weight_map", {})
                names |= set(wmap) if isinstance(wmap, dict) else set()
        except (OSError, ValueError, AttributeError):
            continue  # a damaged file is named by ModelSpec.weight_files' own checks
    return names, shapes


def raw_text_config(config_json: Path) -> Any:
    """The text model's fields of ``config.json`` as written (``text_config`` of a multimodal one), read without
    transformers (whose own checks would blame whatever loaded it first, e.g. the tokenizer); None if unreadable."""
    try:
        raw = loads_bounded(config_json.read_bytes()[:MAX_HEADER_BYTES])
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    nested = raw.get("text_config")
    text = nested if isinstance(nested, dict) else raw
    return SimpleNamespace(
        **{
            k: int(v) if isinstance(v, float) and v.is_integer() else v
            for k, v in text.items()
            if isinstance(k, str) and k.isidentifier()
        }
    )


def check_config_matches_weights(tc: Any, files: list[Path], model: str) -> None:
    """BadInput when the config's decoder layers, hidden size, vocabulary or MLP width differ from what the weight
    files hold (each field named, with what the weights hold)."""
    names, shapes = weight_shapes(files)
    layer_ids = {int(m.group(1)) for n in names for m in [LAYER_RE.search(n)] if m}
    want = _count(getattr(tc, "num_hidden_layers", None))
    if layer_ids and want is not None and want != max(layer_ids) + 1:
        raise BadInput(
            f"{model}: config.json says num_hidden_layers = {want}, but the weight files hold "
            f"{max(layer_ids) + 1} decoder layers (layers.0 .. layers.{max(layer_ids)}); fix config.json "
            "or use the checkpoint it belongs to"
        )
    hidden, vocab = _count(getattr(tc, "hidden_size", None)), _count(getattr(tc, "vocab_size", None))
    embed = next((s for n, s in sorted(shapes.items()) if n.endswith("embed_tokens.weight") and len(s) == 2), None)
    for what, value, held in (("hidden_size", hidden, 1), ("vocab_size", vocab, 0)):
        if embed is not None and value is not None and value != embed[held]:
            raise BadInput(
                f"{model}: config.json says {what} = {value}, but the embedding in the weight files is "
                f"{embed[0]} x {embed[1]}; fix config.json or use the checkpoint it belongs to"
            )
    inter = _count(getattr(tc, "intermediate_size", None))
    up = next(
        (
            (n, s)
            for n, s in sorted(shapes.items())
            if n.endswith(("mlp.up_proj.weight", "mlp.gate_proj.weight")) and len(s) == 2
        ),
        None,
    )
    if up is not None and inter is not None and inter != up[1][0]:
        raise BadInput(
            f"{model}: config.json says intermediate_size = {inter}, but the weight files hold an MLP "
            f"{up[1][0]} wide ({up[0]} is {up[1][0]} x {up[1][1]}); fix config.json or use the checkpoint it "
            "belongs to"
        )


def _count(v: Any) -> int | None:
    """A config count as an int (1e6 written as a float counts too); None when it is no count."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v if isinstance(v, int) else None


# weight files and the index that maps tensors to them: all of it decides what gets loaded
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)


# config fields that say how a model was loaded, not what it computes (they change on load)
RUNTIME_CONFIG_KEYS = frozenset(
    {
        "transformers_version",
        "_name_or_path",
        "dtype",
        "torch_dtype",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "attn_implementation",
        "use_cache",
        "architectures",
        "_commit_hash",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
    }
)


def config_fingerprint(config: Any) -> str:
    """Fingerprint of what a config computes (runtime/loading fields left out)."""
    return fingerprint({k: v for k, v in config.to_dict().items() if k not in RUNTIME_CONFIG_KEYS})


def text_config(config: Any) -> Any:
    """The language-model part of a (possibly multimodal) config."""
    return getattr(config, "text_config", None) or config


def check_vocabulary(config: Any, top_id: int, model: str) -> None:
    """BadInput when a token id (or the pad id) is beyond the model's embedding: the tokenizer is not this
    model's (or a ``vocab_size`` override is too small), which would fail deep in the forward pass."""
    vocab = getattr(text_config(config), "vocab_size", None)
    if isinstance(vocab, int) and not isinstance(vocab, bool) and top_id >= vocab:
        raise BadInput(
            f"the tokenizer gives token id {top_id}, but {model} embeds only {vocab} tokens (config "
            "vocab_size): the tokenizer is not this model's, or a vocab_size override is too small; "
            "pass the model's own tokenizer (or a vocab_size of at least the tokenizer's size)"
        )


@dataclass(frozen=True)
class ModelSpec:
    """What the manifest's [model] table names."""

    path: str
    config_overrides: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    trust_remote_code: bool = False
    # builtins only: where random weights are drawn. "cpu" (default) gives the same weights on every
    # device; "device" draws them on the build device in its dtype (for 27B-shaped benchmarks that do
    # not fit a CPU init) — then weights differ across devices, and the identity says so.
    init_device: str = "cpu"

    @property
    def builtin(self) -> str | None:
        return self.path[len("builtin:") :] if self.path.startswith("builtin:") else None

    def check(self) -> None:
        if self.builtin is None:
            p = Path(self.path)
            if p.exists() and not p.is_dir():
                raise BadInput(
                    f"model path {self.path!r} is a file, not a model directory; set [model] path to the "
                    "folder that holds config.json and the weights"
                )
            if not p.is_dir():
                raise BadInput(
                    f"model directory {self.path!r} does not exist; set [model] path to a local HF model "
                    "directory or a builtin (builtin:tiny-qwen3_5, builtin:tiny-llama)"
                )
            if not (p / "config.json").is_file():
                raise BadInput(
                    f"model directory {self.path!r} has no config.json; point [model] path at the folder "
                    "that holds config.json and the weights"
                )
            raw = raw_text_config(p / "config.json")  # before transformers reads it (a tokenizer's load does)
            if raw is not None:
                files = [f for f in p.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES)]
                check_config_matches_weights(raw, files, self.path)

    def tokenizer(self) -> Any:
        if self.builtin is not None:
            return builtin_tokenizer()
        from transformers import AutoTokenizer

        self.check()
        try:
            return AutoTokenizer.from_pretrained(self.path, trust_remote_code=self.trust_remote_code)
        except Exception as e:
            self._config_or_bad_input()  # a config transformers refuses fails the tokenizer's load too: say so
            raise BadInput(f"cannot load a tokenizer from {self.path!r}: {one_line(e)}") from None

    def _config_or_bad_input(self) -> Any:
        """transformers' config of this local model, or BadInput naming config.json and what it says is wrong."""
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(self.path, trust_remote_code=self.trust_remote_code)
        except Exception as e:
            raise BadInput(
                f"config.json of {self.path!r} is not valid: {one_line(e)}; fix config.json (its fields "
                "must agree with each other and with the weights) or use the checkpoint it belongs to"
            ) from None

    def config(self, vocab_size: int | None = None, drawn: bool = True) -> Any:
        """The model's config (``drawn=False``: only read, never drawn into weights, e.g. by ``hsstore plan``,
        so a builtin's size is not held against this machine's memory budget)."""
        if self.builtin is not None:
            return builtin_config(
                self.builtin, self.config_overrides, vocab_size or 320, drawn and self.init_device == "cpu"
            )

        self.check()
        if self.config_overrides:
            raise BadInput("[model] config overrides only apply to builtin models; remove `config` or use builtin:")
        config = self._config_or_bad_input()
        files = [p for p in Path(self.path).iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)]
        check_config_matches_weights(text_config(config), files, self.path)  # before any model is built
        return config

    def weight_files(self) -> list[Path]:
        """The weight files (and their index) of a local model directory, by name; [] for builtins."""
        if self.builtin is not None:
            return []
        files = sorted(
            (p for p in Path(self.path).iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)),
            key=lambda p: p.name,
        )
        if not any(not p.name.endswith(".index.json") for p in files):
            raise BadInput(f"model directory {self.path!r} holds no weight files ({', '.join(WEIGHT_SUFFIXES[:-1])})")
        for p in files:
            if p.name.endswith(".safetensors"):
                check_safetensors(p)
            elif p.name.endswith((".bin", ".pt", ".pth")):
                check_torch_file(p)
        for index in (p for p in files if p.name.endswith(".index.json")):
            missing = sorted(set(index_shards(index)) - {p.name for p in files})
            if missing:  # an interrupted download or copy: found now, not by the worker after the store is made
                raise BadInput(
                    f"{index} names weight shard(s) {missing[:3]} that are not in {self.path!r} (a download "
                    "or copy not finished?); complete the checkpoint and re-run"
                )
        return files

    def hash_weights(self) -> dict[str, HashedFile]:
        """Every weight file's content hash, computed now (hsstore.core.keys: never cached)."""
        files = self.weight_files()
        hashed = hash_files(files)
        return {p.name: hashed[str(p)] for p in files}

    def identity(self, config: Any, weights: Mapping[str, HashedFile] | None = None) -> ModelIdentity:
        """What makes the weights these weights. Builtins: name, seed, generator and config. Local
        directories: config and the weight files' names, sizes and content hashes (``weights``, from
        ``hash_weights``; hashed here when not given) — the path is informational and the name is made
        from the content, so a byte-identical copy anywhere is the same model."""
        tc = text_config(config)
        ident: dict[str, Any] = {
            "model_type": tc.model_type,
            "num_layers": int(tc.num_hidden_layers),
            "hidden_size": int(tc.hidden_size),
            "config_fingerprint": config_fingerprint(config),
        }
        if self.builtin is not None:  # unchanged since format 1.0: builtin variant ids stay the same
            ident.update(
                name=self.path, seed=self.seed, generator_version=GENERATOR_VERSION, init_device=self.init_device
            )
            ident["fingerprint"] = fingerprint(ident)
        else:
            hashed = self.hash_weights() if weights is None else weights
            ident["weights"] = {n: {"size": h.size, "xxh3_128": h.xxh3_128} for n, h in sorted(hashed.items())}
            ident["fingerprint"] = fingerprint(ident)
            ident["name"] = f"{ident['model_type']}-{ident['fingerprint'][:12]}"
        return ModelIdentity.from_dict({"path": self.path, **ident}, "model identity", BuildFailed)

    def check_unchanged(self, stamps: Mapping[str, FileStamp]) -> None:
        """BuildFailed unless the weight files are still those hashed (``stamps`` from ``hash_weights``):
        called after loading, so the loaded bytes are the hashed ones."""
        now = {p.name: stamp(p) for p in self.weight_files()}
        changed = sorted(n for n in set(now) | set(stamps) if now.get(n) != stamps.get(n))
        if changed:
            raise BuildFailed(
                f"model file(s) {changed} in {self.path!r} changed after they were hashed for this build "
                "(a copy or download running?); nothing was written — re-run when the model is complete"
            )

    def tokenizer_identity(self, tokenizer: Any) -> TokenizerIdentity:
        if self.builtin is not None:
            parts = {"tokenizer_json": tokenizer.backend_tokenizer.to_str(), "builtin": True}
        else:
            parts = {
                name: file_hash(Path(self.path) / name)
                for name in TOKENIZER_FILES
                if (Path(self.path) / name).is_file()
            }
        parts["chat_template"] = getattr(tokenizer, "chat_template", None) or ""
        parts["special_tokens"] = json.loads(json.dumps(tokenizer.special_tokens_map, default=str))
        day = chat_date(parts["chat_template"])  # the pinned day its chat rows are rendered with, if it prints one
        return TokenizerIdentity(
            fingerprint=fingerprint(parts),
            vocab_size=len(tokenizer),
            has_chat_template=bool(parts["chat_template"]),
            **({"chat_date": day} if day else {}),
        )

    def load(self, dtype: Any, device: str | Sequence[str], attn_implementation: str | None) -> Any:
        """The model in eval mode on ``device`` in ``dtype``; given several devices, its decoder layers
        are spread over them in contiguous stages (see hsstore.capture.model.placement)."""
        from hsstore.capture.model.kernels import require_attention

        require_attention(attn_implementation, "install it, or use sdpa attention")  # (before transformers fetches one)
        devices = [device] if isinstance(device, str) else list(device)
        spread = len(devices) > 1
        if spread:
            from hsstore.capture.model import placement

            placement.require_accelerate()
        if self.builtin is not None:
            model = self._draw_builtin(dtype, devices, attn_implementation)
        else:
            model = self._from_folder(dtype, devices, attn_implementation)
        if spread:
            placement.follow_current_device(model, int(text_config(model.config).num_hidden_layers))
        return model.eval()

    def _draw_builtin(self, dtype: Any, devices: list[str], attn_implementation: str | None) -> Any:
        """A builtin model's weights drawn from its seed (on the CPU or the device), placed on ``devices``."""
        import torch

        spread = len(devices) > 1
        config = self.config(len(builtin_tokenizer()))
        if attn_implementation:
            config._attn_implementation = attn_implementation
        torch.manual_seed(self.seed)
        if self.init_device == "device":
            if spread:
                raise BadInput(
                    '[model] init_device = "device" draws weights on one GPU; a model spread over '
                    'several GPUs is drawn on the CPU: set init_device = "cpu"'
                )
            with torch.device(devices[0]):
                return _from_config(config, dtype=dtype)
        with torch.device("cpu"):
            model = _from_config(config, dtype=torch.float32)
        model = model.to(dtype=dtype, device="cpu" if spread else devices[0])
        if spread:
            from hsstore.capture.model import placement

            dmap = placement.device_map(model, int(text_config(config).num_hidden_layers), devices)
            model = placement.require_accelerate().dispatch_model(model, device_map=dmap, force_hooks=True)
        return model

    def _from_folder(self, dtype: Any, devices: list[str], attn_implementation: str | None) -> Any:
        """A save_pretrained folder's weights (checked first) loaded onto ``devices``; a folder that does
        not load is one line naming it."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers import logging as hf_logging

        # its "Loading weights" bar: the build's status line says it instead (unannotated in transformers)
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        dmap = None
        if len(devices) > 1:
            from hsstore.capture.model import placement

            config = self.config()
            with torch.device("meta"):  # names and sizes only: no memory, no weights read
                skeleton = _from_config(config, trust_remote_code=self.trust_remote_code)
            dmap = placement.device_map(skeleton, int(text_config(config).num_hidden_layers), devices)
        self.check()
        try:
            model = AutoModelForCausalLM.from_pretrained(
                self.path,
                dtype=dtype,
                trust_remote_code=self.trust_remote_code,
                attn_implementation=attn_implementation,
                device_map=dmap,
            )
        except Exception as e:  # not a model folder, damaged or foreign weights (safetensors' own errors too)
            if isinstance(e, HsstoreError):
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BadInput(
                f"cannot load a model from {self.path!r}: {first}; pass a save_pretrained folder "
                "(config.json and its weights)"
            ) from None
        # transformers declares PreTrainedModel.to @wraps(nn.Module.to): mypy reads the unbound signature (self first)
        return model if dmap is not None else model.to(devices[0])  # type: ignore[arg-type]


# --- The cost shape of a capture forward (hsstore.core.flops.ForwardShape) read off a model skeleton on


def _from_config(config: Any, **kwargs: Any) -> Any:
    """``AutoModelForCausalLM.from_config(config, **kwargs)``: unannotated in transformers, so called here."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config, **kwargs)  # type: ignore[no-untyped-call]


def forward_shape(config: Any, deepest: int, trust_remote_code: bool = False) -> ForwardShape:
    """What decoder layers ``0..deepest`` of ``config``'s model execute per token (``deepest`` = the
    number of layers: all of them, then the final norm)."""
    import torch

    from hsstore.capture.model.placement import decoder_layers

    tc = text_config(config)
    n = int(tc.num_hidden_layers)
    with torch.device("meta"):  # shapes only: no memory, no initialization
        model = _from_config(config, trust_remote_code=trust_remote_code)
    run = list(decoder_layers(model, n))[: min(deepest, n - 1) + 1]
    params = sum(p.numel() for layer in run for p in layer.parameters())
    kinds = list(getattr(tc, "layer_types", None) or ["full_attention"] * n)[: len(run)]
    heads = int(tc.num_attention_heads)
    head_dim = int(getattr(tc, "head_dim", None) or tc.hidden_size // heads)
    linear = (
        int(getattr(tc, "linear_num_value_heads", 0) or 0)
        * int(getattr(tc, "linear_key_head_dim", 0) or 0)
        * int(getattr(tc, "linear_value_head_dim", 0) or 0)
    )
    return ForwardShape(
        layer_params=int(params),
        attention_layers=sum(k != "linear_attention" for k in kinds),
        attention_width=heads * head_dim,
        linear_layers=sum(k == "linear_attention" for k in kinds),
        linear_state=linear,
    )
