"""The target model of a recipe: builtin or a local HF directory — its identity, tokenizer and loading."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsstore.capture.model.builtin import GENERATOR_VERSION, builtin_config, builtin_tokenizer
from hsstore.capture.inputs.chatdate import chat_date
from hsstore.capture.model.weight_files import raw_text_config, check_config_matches_weights, check_safetensors, check_torch_file, index_shards
from hsstore.core.canonical import fingerprint
from hsstore.core.errors import BadInput, BuildFailed, HsstoreError, one_line
from hsstore.core.filehash import file_hash, hash_files, stamp
from hsstore.core.schema.files import FileStamp, HashedFile
from hsstore.core.schema.provenance import ModelIdentity, TokenizerIdentity

# weight files and the index that maps tensors to them: all of it decides what gets loaded
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json",
)


# config fields that say how a model was loaded, not what it computes (they change on load)
RUNTIME_CONFIG_KEYS = frozenset({
    "transformers_version", "_name_or_path", "dtype", "torch_dtype", "_attn_implementation",
    "_attn_implementation_autoset", "attn_implementation", "use_cache", "architectures", "_commit_hash",
    "output_hidden_states", "output_attentions", "return_dict",
})


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
        raise BadInput(f"the tokenizer gives token id {top_id}, but {model} embeds only {vocab} tokens (config "
                       "vocab_size): the tokenizer is not this model's, or a vocab_size override is too small; "
                       "pass the model's own tokenizer (or a vocab_size of at least the tokenizer's size)")


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
                raise BadInput(f"model path {self.path!r} is a file, not a model directory; set [model] path to the "
                               "folder that holds config.json and the weights")
            if not p.is_dir():
                raise BadInput(f"model directory {self.path!r} does not exist; set [model] path to a local HF model "
                               "directory or a builtin (builtin:tiny-qwen3_5, builtin:tiny-llama)")
            if not (p / "config.json").is_file():
                raise BadInput(f"model directory {self.path!r} has no config.json; point [model] path at the folder "
                               "that holds config.json and the weights")
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
            raise BadInput(f"config.json of {self.path!r} is not valid: {one_line(e)}; fix config.json (its fields "
                           "must agree with each other and with the weights) or use the checkpoint it belongs to") from None

    def config(self, vocab_size: int | None = None, drawn: bool = True) -> Any:
        """The model's config (``drawn=False``: only read, never drawn into weights, e.g. by ``hsstore plan``,
        so a builtin's size is not held against this machine's memory budget)."""
        if self.builtin is not None:
            return builtin_config(self.builtin, self.config_overrides, vocab_size or 320,
                                  drawn and self.init_device == "cpu")
        from transformers import AutoConfig

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
        files = sorted((p for p in Path(self.path).iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)),
                       key=lambda p: p.name)
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
                raise BadInput(f"{index} names weight shard(s) {missing[:3]} that are not in {self.path!r} (a download "
                               "or copy not finished?); complete the checkpoint and re-run")
        return files

    def hash_weights(self) -> dict[str, HashedFile]:
        """Every weight file's content hash, computed now (hsstore.core.filehash: never cached)."""
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
            ident.update(name=self.path, seed=self.seed, generator_version=GENERATOR_VERSION,
                         init_device=self.init_device)
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
            raise BuildFailed(f"model file(s) {changed} in {self.path!r} changed after they were hashed for this build "
                              "(a copy or download running?); nothing was written — re-run when the model is complete")

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
        return TokenizerIdentity(fingerprint=fingerprint(parts), vocab_size=len(tokenizer),
                                 has_chat_template=bool(parts["chat_template"]), **({"chat_date": day} if day else {}))

    def load(self, dtype: Any, device: str | Sequence[str], attn_implementation: str | None) -> Any:
        """The model in eval mode on ``device`` in ``dtype``; given several devices, its decoder layers
        are spread over them in contiguous stages (see hsstore.capture.model.placement)."""
        from hsstore.capture.model.backends import require_attention

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
        from transformers import AutoModelForCausalLM

        spread = len(devices) > 1
        config = self.config(len(builtin_tokenizer()))
        if attn_implementation:
            config._attn_implementation = attn_implementation
        torch.manual_seed(self.seed)
        if self.init_device == "device":
            if spread:
                raise BadInput("[model] init_device = \"device\" draws weights on one GPU; a model spread over "
                               "several GPUs is drawn on the CPU: set init_device = \"cpu\"")
            with torch.device(devices[0]):
                return AutoModelForCausalLM.from_config(config, dtype=dtype)
        with torch.device("cpu"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
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
        from transformers import AutoModelForCausalLM, logging as hf_logging

        hf_logging.disable_progress_bar()  # its "Loading weights" bar: the build's status line says it instead
        dmap = None
        if len(devices) > 1:
            from hsstore.capture.model import placement

            config = self.config()
            with torch.device("meta"):  # names and sizes only: no memory, no weights read
                skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=self.trust_remote_code)
            dmap = placement.device_map(skeleton, int(text_config(config).num_hidden_layers), devices)
        self.check()
        try:
            model = AutoModelForCausalLM.from_pretrained(
                self.path, dtype=dtype, trust_remote_code=self.trust_remote_code,
                attn_implementation=attn_implementation, device_map=dmap,
            )
        except Exception as e:  # not a model folder, damaged or foreign weights (safetensors' own errors too)
            if isinstance(e, HsstoreError):
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BadInput(f"cannot load a model from {self.path!r}: {first}; pass a save_pretrained folder "
                           "(config.json and its weights)") from None
        return model if dmap is not None else model.to(devices[0])
