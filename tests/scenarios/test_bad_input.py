"""The bad-input catalogue (docs/errors.md): every row is one clear line, exit 2, nothing committed."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from helpers import DATA, REPO, new_variant, run_main, write_manifest, write_unit

from hsstore import Store
from hsstore.cli.main import main
from hsstore.core.errors import StoreNotFound


def _m(tmp: Path, **kw) -> list[str]:
    return ["build", str(write_manifest(tmp / "m.toml", store=str(tmp / "s.zarr"), **kw)), "--quiet"]


def _raw(tmp: Path, text: str) -> list[str]:
    (tmp / "m.toml").write_text(text)
    return ["build", str(tmp / "m.toml")]


def _local_model(tmp: Path, chat_template: bool | str, arch: str = "tiny-llama") -> str:
    import torch
    from transformers import AutoModelForCausalLM

    from hsstore.capture.model.builtin import builtin_config, builtin_tokenizer

    d = tmp / "model"
    tok = builtin_tokenizer()
    if isinstance(chat_template, str):
        tok.chat_template = chat_template
    elif not chat_template:
        tok.chat_template = None
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(builtin_config(arch, vocab_size=len(tok))).save_pretrained(d)
    tok.save_pretrained(d)
    for f in d.glob("chat_template*"):
        if not chat_template:
            f.unlink()
    return str(d)


def _lying_config(tmp: Path, arch: str = "tiny-llama", **fields: object) -> str:
    """A tiny local checkpoint (of builtin ``arch``) whose config.json states ``fields`` its weights do not have."""
    import json

    d = _local_model(tmp, True, arch)
    cfg = json.loads((Path(d) / "config.json").read_text())
    cfg.update(fields)
    (Path(d) / "config.json").write_text(json.dumps(cfg))
    return d


def _deep_header_model(tmp: Path) -> str:
    """A tiny local checkpoint whose model.safetensors header is 100,000 nested lists (a few hundred KB)."""
    d = _local_model(tmp, True)
    header = b"[" * 100000 + b"]" * 100000
    (Path(d) / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    return d


def _empty_vocab_model(tmp: Path) -> str:
    """A local model whose tokenizer is a BPE with no vocabulary: only its special tokens, and a chat template."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from hsstore.capture.model.builtin import CHAT_TEMPLATE

    d = _local_model(tmp, True)
    for f in Path(d).glob("tokenizer*"):
        f.unlink()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.BPE(vocab={}, merges=[])),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.save_pretrained(d)
    return d


def _two_variant_store(tmp: Path) -> str:
    s = Store.create(tmp / "v.zarr")
    for dtype in ("bf16", "fp32"):
        write_unit(s, new_variant(s, dtype=dtype), [4])
    return str(tmp / "v.zarr")


def _other_layers_store(tmp: Path) -> tuple[str, str]:
    s = Store.create(tmp / "l.zarr")
    a = new_variant(s, dtype="bf16", layers={"aux": [0], "target": [2]})
    b = new_variant(s, dtype="fp32", layers={"aux": [1], "target": [2]})
    for vid in (a, b):
        write_unit(s, vid, [4])
    return f"{tmp / 'l.zarr'}#{a}", f"{tmp / 'l.zarr'}#{b}"


def _disjoint_store(tmp: Path) -> tuple[str, str]:
    s = Store.create(tmp / "d.zarr")
    a, b = new_variant(s, dtype="bf16"), new_variant(s, dtype="fp32")
    for vid, seed in ((a, 1), (b, 2)):
        write_unit(s, vid, [4], seed=seed)
    return f"{tmp / 'd.zarr'}#{a}", f"{tmp / 'd.zarr'}#{b}"


def _two_model_store(tmp: Path) -> tuple[str, str]:
    from helpers import LAYERS, provenance

    from hsstore.storage.names import another_model_allowed

    s = Store.create(tmp / "two-models.zarr")
    vids = []
    for name in ("model-a", "model-b"):
        prov = provenance("bf16")
        prov["recipe"]["model"] = {"name": name, "fingerprint": f"{name}-fingerprint"}
        with another_model_allowed("test"):  # a store of two models, as --another-model makes
            vids.append(s.create_variant(prov, LAYERS, 16, "bf16", "zstd", 64))
        write_unit(s, vids[-1], [4])
    return f"{tmp / 'two-models.zarr'}#{vids[0]}", f"{tmp / 'two-models.zarr'}#{vids[1]}"


def _fla_kernels_variant(tmp: Path) -> str:
    from helpers import LAYERS, provenance

    s = Store.create(tmp / "fla.zarr")
    prov = provenance("bf16")
    prov["environment"]["kernels"] = {
        "chunk_gated_delta_rule": "fla",
        "causal_conv1d": "causal_conv1d",
        "attention": "sdpa",
    }
    prov["environment"]["batching"] = {
        "padding_side": "right",
        "token_budget": 512,
        "attention_mask": True,
        "order": "length-descending",
    }
    vid = s.create_variant(prov, LAYERS, 64, "bf16", "zstd", 64)
    write_unit(s, vid, [8])
    return f"{tmp / 'fla.zarr'}#{vid}"


def _fp8_store(tmp: Path) -> str:
    """A store with a bf16 variant and its FP8 twin (convert)."""
    from hsstore.storage.convert import convert

    convert(_two_variant_store(tmp) + "#dtype=bf16", "fp8-e4m3")
    return str(tmp / "v.zarr")


def _future_store(tmp: Path) -> str:
    p = tmp / "f.zarr"
    Store.create(p)
    meta = json.loads((p / "zarr.json").read_text())
    meta["attributes"]["hsstore"]["format_version"] = "9.0"
    (p / "zarr.json").write_text(json.dumps(meta))
    return str(p)


def _a_file(tmp: Path) -> str:
    (tmp / "f").write_text("x")
    return str(tmp / "f")


def _plain_dir(tmp: Path) -> str:
    (tmp / "plain").mkdir()
    (tmp / "plain" / "notes.txt").write_text("x")
    return str(tmp / "plain")


CASES = {
    "manifest-missing": (lambda t: ["build", str(t / "nope.toml")], "manifest .* does not exist"),
    "manifest-malformed-toml": (lambda t: _raw(t, "[model\npath = 1"), "malformed TOML"),
    "manifest-unknown-key": (
        lambda t: _m(t, extra_model="layrs = 1"),
        r"unknown key\(s\) \['layrs'\] in \[model\] \(typo\?\)",
    ),
    "manifest-unknown-table": (lambda t: _raw(t, "[modle]\npath='x'"), r"unknown table\(s\) \['modle'\]"),
    "manifest-no-model-path": (
        lambda t: _raw(t, "[model]\nlayers={target=[1]}\n[data]\nfiles=['x']\n[store]\npath='s'"),
        r"\[model\] path is missing",
    ),
    "model-dir-missing": (lambda t: _m(t, model=str(t / "no-model")), "model directory .* does not exist"),
    "model-dir-no-config": (
        lambda t: (t / "empty-model").mkdir() or _m(t, model=str(t / "empty-model")),
        "has no config.json",
    ),
    "builtin-unknown": (lambda t: _m(t, model="builtin:tiny-gpt5"), "unknown builtin model 'tiny-gpt5'"),
    "layer-out-of-range": (
        lambda t: _m(t, layers="{ aux = [1], target = [9] }"),
        r"layer\(s\) \[9\] .* out of range: .* has 4 decoder layers",
    ),
    "layer-aux-and-target": (lambda t: _m(t, layers="{ aux = [1, 3], target = [3] }"), "both aux and target"),
    "layer-target-derives-from-aux": (
        lambda t: _m(t, layers='{ aux = [0, 3], target = ["final_norm"] }'),
        r"target final_norm is RMSNorm of aux layer 3 .* leaks into the conditioning layers; drop layer 3 from aux",
    ),
    "layer-aux-is-norm-of-target": (
        lambda t: _m(t, layers='{ aux = [1, "final_norm"], target = [3] }'),
        r"aux final_norm is RMSNorm of target layer 3 .* leaks",
    ),
    "config-layers-not-in-weights": (
        lambda t: _m(t, model=_lying_config(t, num_hidden_layers=1000000), layers="{ aux = [1], target = [2] }"),
        r"config.json says num_hidden_layers = 1000000, but the weight files hold 4 decoder layers",
    ),
    "config-layers-not-in-weights-hybrid": (  # its config's own check (layer_types) ran first, inside the tokenizer's load
        lambda t: _m(
            t, model=_lying_config(t, "tiny-qwen3_5", num_hidden_layers=1000000), layers="{ aux = [1], target = [2] }"
        ),
        r"config.json says num_hidden_layers = 1000000, but the weight files hold 4 decoder layers",
    ),
    "config-layers-float-not-in-weights": (
        lambda t: _m(t, model=_lying_config(t, num_hidden_layers=1e6), layers="{ aux = [1], target = [2] }"),
        r"config.json says num_hidden_layers = 1000000, but the weight files hold 4 decoder layers",
    ),
    "config-intermediate-not-in-weights": (
        lambda t: _m(t, model=_lying_config(t, intermediate_size=12345), layers="{ aux = [1], target = [2] }"),
        r"config.json says intermediate_size = 12345, but the weight files hold .*; fix config.json",
    ),
    "config-fields-inconsistent": (
        lambda t: _m(
            t,
            model=_lying_config(t, "tiny-qwen3_5", layer_types=["full_attention"] * 5),
            layers="{ aux = [1], target = [2] }",
        ),
        r"^error: [^\\]*config.json of .* is not valid: .*layer_types.*; fix config.json",
    ),
    "config-hidden-not-in-weights": (
        lambda t: _m(t, model=_lying_config(t, hidden_size=4096), layers="{ aux = [1], target = [2] }"),
        r"config.json says hidden_size = 4096, but the embedding in the weight files is \d+ x 64",
    ),
    "config-vocab-not-in-weights": (
        lambda t: _m(t, model=_lying_config(t, vocab_size=10**9), layers="{ aux = [1], target = [2] }"),
        r"config.json says vocab_size = 1000000000, but the embedding in the weight files is \d+ x 64",
    ),
    "builtin-override-too-large": (
        lambda t: _m(t, extra_model="config = { hidden_size = 1000000000 }"),
        r"builtin:tiny-qwen3_5 with these config overrides .* needs .*, more than the .* memory budget",
    ),
    "builtin-override-too-many-layers": (
        lambda t: _m(t, extra_model="config = { num_hidden_layers = 100000000 }"),
        r"builtin:tiny-qwen3_5 with these config overrides .* more than the .* memory budget",
    ),
    "weights-header-nested": (
        lambda t: _m(t, model=_deep_header_model(t), layers="{ aux = [1], target = [2] }"),
        r"weight file '.*model\.safetensors' is not a whole safetensors file",
    ),
    "tokenizer-empty-vocabulary": (
        lambda t: _m(t, model=_empty_vocab_model(t), layers="{ aux = [1], target = [2] }"),
        r"the tokenizer encodes plain text .* to 0 token\(s\), none of them an ordinary one",
    ),
    "layer-target-empty": (lambda t: _m(t, layers="{ aux = [1], target = [] }"), "layers.target is empty"),
    "layer-not-int": (lambda t: _m(t, layers='{ aux = ["1"], target = [2] }'), "must be a list of integers"),
    "layer-final-norm-typo": (
        lambda t: _m(t, layers='{ aux = [1], target = ["final_nrom"] }'),
        'must be a list of integers \\(or "final_norm"\\)',
    ),
    "layer-final-norm-aux-and-target": (
        lambda t: _m(t, layers='{ aux = ["final_norm"], target = ["final_norm"] }'),
        "both aux and target",
    ),
    "data-file-missing": (lambda t: _m(t, files=[str(t / "none.jsonl")]), "data file .* does not exist"),
    "data-file-type-unknown": (
        lambda t: (t / "d.csv").write_text("a\n") and _m(t, files=[str(t / "d.csv")]),
        "unknown file type '.csv'",
    ),
    "data-format-unknown": (lambda t: _m(t, extra_data='format = "alpaca"'), "unknown data format 'alpaca'"),
    "data-no-usable-rows": (
        lambda t: (t / "e.jsonl").write_text('{"text": ""}\n{"foo": 1}\n') and _m(t, files=[str(t / "e.jsonl")]),
        "no usable rows",
    ),
    "data-file-empty": (
        lambda t: (t / "e.jsonl").write_bytes(b"") or _m(t, files=[str(t / "e.jsonl")]),
        r"data file '.*e\.jsonl' is empty",
    ),
    "data-file-not-utf8": (
        lambda t: (
            (t / "l.jsonl").write_bytes('{"text": "caf\xe9"}\n'.encode("latin-1")) and _m(t, files=[str(t / "l.jsonl")])
        ),
        r"data file '.*l\.jsonl' is not UTF-8 text \(byte 0xe9 at line 1\)",
    ),
    "data-file-not-rows": (
        lambda t: (t / "o.json").write_text('{"data": [{"text": "a"}]}') and _m(t, files=[str(t / "o.json")]),
        r"data file '.*o\.json' holds one JSON object \(keys \['data'\]\), not rows",
    ),
    "data-file-nested-too-deep": (
        lambda t: (t / "n.json").write_text("[" * 100000 + "]" * 100000) and _m(t, files=[str(t / "n.json")]),
        r"data file '.*n\.json' is nested too deeply to parse \(more than \d+ levels\)",
    ),
    "manifest-nested-too-deep": (
        lambda t: _raw(t, "[model]\npath = " + "[" * 100000 + "]" * 100000 + "\n"),
        r"m\.toml: nests arrays or tables deeper than \d+ levels",
    ),
    "data-file-number-too-long": (
        lambda t: (
            (t / "n.json").write_text('[{"text": "a", "n": ' + "1" * 5000 + "}]") and _m(t, files=[str(t / "n.json")])
        ),
        r"data file '.*n\.json' is neither JSON nor JSON Lines \(a number longer than \d+ digits",
    ),
    "manifest-number-too-long": (
        lambda t: _raw(t, "[model]\nseed = " + "1" * 5000 + "\n"),
        r"m\.toml: malformed TOML: Exceeds the limit \(\d+ digits\)",
    ),
    "chat-template-no-end-of-turn": (
        lambda t: _m(
            t,
            model=_local_model(t, chat_template="{% for m in messages %}{{ m.content }}\n{% endfor %}"),
            layers="{ aux = [1], target = [2] }",
        ),
        "writes no special token after an assistant reply",
    ),
    "chat-template-cannot-render": (
        lambda t: _m(
            t,
            model=_local_model(t, chat_template="{{ raise_exception('only tools') }}"),
            layers="{ aux = [1], target = [2] }",
        ),
        r"cannot render a plain user/assistant exchange \(TemplateError: only tools\)",
    ),
    "chat-without-template": (
        lambda t: _m(t, model=_local_model(t, chat_template=False), layers="{ aux = [1], target = [2] }"),
        "no chat template",
    ),
    "backend-unknown": (lambda t: _m(t) + ["--backend", "triton"], "unknown backend 'triton'"),
    "dtype-unknown": (lambda t: _m(t) + ["--dtype", "int8"], "unknown dtype 'int8'"),
    "device-unknown": (lambda t: _m(t) + ["--device", "tpu"], "unknown device 'tpu'"),
    "fla-not-installed": (
        lambda t: _m(t) + ["--backend", "fla"],
        "backend 'fla' needs the flash-linear-attention kernels",
    ),
    "cuda-without-gpu": (lambda t: _m(t) + ["--device", "cuda"], "no CUDA GPU is visible"),
    # (transformers 5.25 with `kernels` installed fetched a flash-attn kernel from the Hub instead: remote code,
    # a network call, and here a traceback)
    "attn-package-missing": (
        lambda t: _m(t, extra_model='attn_implementation = "flash_attention_2"'),
        r"attention 'flash_attention_2' needs the flash_attn package, which is not installed "
        r"here \(transformers would fetch a kernel from the Hugging Face Hub instead",
    ),
    "gpus-per-rank-on-cpu": (
        lambda t: _m(t) + ["--gpus-per-rank", "2"],
        r'gpus_per_rank = 2 spreads the model .* set devices = \["cuda"\]',
    ),
    "gpus-per-rank-zero": (lambda t: _m(t, extra_build="gpus_per_rank = 0"), "gpus_per_rank = 0; it must be 1 or more"),
    "gpus-per-rank-device-init": (
        lambda t: _m(t, extra_model='init_device = "device"') + ["--gpus-per-rank", "2", "--device", "cuda"],
        'init_device = "device" draws random weights on one GPU',
    ),
    "manifest-wrong-type-bool": (
        lambda t: _m(t, extra_model='trust_remote_code = "false"'),
        r"\[model\] trust_remote_code = 'false': expected a boolean",
    ),
    "manifest-wrong-type-int": (
        lambda t: _m(t, extra_model="seed = 1.5"),
        r"\[model\] seed = 1.5: expected an integer",
    ),
    "config-override-negative": (
        lambda t: _m(t, extra_model="config = { hidden_size = -64 }"),
        "hidden_size = -64 .*expected a positive integer",
    ),
    "config-override-unknown-key": (
        lambda t: _m(t, extra_model="config = { hiden_size = 128 }"),
        "unknown config key 'hiden_size'",
    ),
    "token-budget-too-small": (lambda t: _m(t, max_length=4096), r"token_budget \(2048\) must be at least"),
    "store-non-hsstore-dir": (
        lambda t: _m(t) + ["--store", _plain_dir(t)],
        "non-empty directory that is not an hsstore store",
    ),
    "store-is-a-file": (lambda t: ["info", _a_file(t)], "is a file, not a store directory"),
    "store-unwritable": (lambda t: _m(t) + ["--store", "/proc/hsstore-test.zarr"], "cannot create store directory"),
    "store-not-hsstore": (lambda t: ["info", _plain_dir(t)], "is not an hsstore store"),
    "store-missing": (lambda t: ["info", str(t / "missing.zarr")], "no store at"),
    "store-unknown-format": (lambda t: ["info", _future_store(t)], "format version 9.0"),
    "selector-no-match": (
        lambda t: ["diff", _two_variant_store(t) + "#dtype=fp16", _two_variant_store(t) + "#dtype=bf16"],
        "matches no variant",
    ),
    "selector-ambiguous": (
        lambda t: ["diff", _two_variant_store(t), _two_variant_store(t) + "#dtype=bf16"],
        "holds 2 variants",
    ),
    "store-command-with-selector": (
        lambda t: ["verify", str(t / "s.zarr") + "#dtype=bf61"],
        r"hsstore verify reads a whole store, not one variant: pass '.*s\.zarr' without '#dtype=bf61'",
    ),
    "selector-unknown-key": (
        lambda t: ["diff", _two_variant_store(t) + "#dtyp=bf16", _two_variant_store(t) + "#dtype=fp32"],
        r"selector 'dtyp=bf16': unknown key 'dtyp'; did you mean 'dtype'\? valid keys: .*backend.*dtype",
    ),
    "selector-traversal": (
        lambda t: ["diff", _two_variant_store(t) + "#../../etc", _two_variant_store(t)],
        "neither a variant id prefix",
    ),
    "diff-layer-sets-differ": (lambda t: ["diff", *_other_layers_store(t)], "layer sets differ"),
    "diff-no-shared-samples": (lambda t: ["diff", *_disjoint_store(t)], "share no samples"),
    "diff-floor-is-a-or-b": (
        lambda t: [
            "diff",
            _two_variant_store(t) + "#dtype=bf16",
            _two_variant_store(t) + "#dtype=fp32",
            "--floor",
            _two_variant_store(t) + "/#dtype=fp32",
        ],
        "is B itself",
    ),
    "diff-different-models": (
        lambda t: ["diff", *_two_model_store(t)],
        "states of different models: recipe.model.fingerprint",
    ),
    "diff-device-unknown": (
        lambda t: [
            "diff",
            _two_variant_store(t) + "#dtype=bf16",
            _two_variant_store(t) + "#dtype=fp32",
            "--device",
            "tpu",
        ],
        "unknown device 'tpu'",
    ),
    "diff-cuda-without-gpu": (
        lambda t: [
            "diff",
            _two_variant_store(t) + "#dtype=bf16",
            _two_variant_store(t) + "#dtype=fp32",
            "--device",
            "cuda",
        ],
        "no CUDA GPU is visible",
    ),
    "check-floor-is-target": (
        lambda t: [
            "check",
            "builtin:tiny-llama",
            _two_variant_store(t) + "#dtype=bf16",
            "--floor",
            _two_variant_store(t) + "#dtype=bf16",
        ],
        "is the checked variant itself",
    ),
    "check-kernels-not-bound": (
        lambda t: ["check", "builtin:tiny-qwen3_5", _fla_kernels_variant(t)],
        "binds other kernels than variant .*'torch' here, 'fla' recorded",
    ),
    "check-audit-hidden-size": (
        lambda t: ["check", "builtin:tiny-llama", _two_variant_store(t) + "#dtype=bf16", "--floor", "live"],
        r"builtin:tiny-llama has hidden_size \d+, variant .* stores states of "
        "width 16: this model cannot produce them",
    ),
    "check-audit-backend-unknown": (
        lambda t: ["check", "builtin:tiny-llama", _two_variant_store(t) + "#dtype=bf16", "--backend", "jax"],
        "--backend 'jax': choose one of torch, fla",
    ),
    "check-audit-token-budget": (
        lambda t: ["check", "builtin:tiny-llama", _two_variant_store(t) + "#dtype=bf16", "--token-budget", "0"],
        "--token-budget 0: must be 1 or more",
    ),
    "import-audit-no-model": (
        lambda t: [
            "import",
            "eagle",
            str(t),
            "--store",
            str(t / "s.zarr"),
            "--tokenizer",
            "builtin:tiny-llama",
            "--audit",
            "2",
        ],
        "--audit N recomputes samples with the model",
    ),
    "diff-align-b-not-native": (
        lambda t: ["diff", _two_variant_store(t) + "#dtype=bf16", _two_variant_store(t) + "#dtype=fp32", "--align"],
        "has no known capture point",
    ),
    "diff-samples-and-fraction": (
        lambda t: [
            "diff",
            _two_variant_store(t) + "#dtype=bf16",
            _two_variant_store(t) + "#dtype=fp32",
            "--samples",
            "2",
            "--fraction",
            "0.5",
        ],
        "not both",
    ),
    "precision-unknown": (
        lambda t: _m(t) + ["--precision", "fp4"],
        r"\[store\] precision = 'fp4'; choose one of fp8-e4m3",
    ),
    "plan-store-nested": (
        lambda t: [
            "plan",
            *_m(t)[1:2],
            "--limit",
            "2",
            "--store",
            str(Path(_two_variant_store(t)) / "variants" / "x.zarr"),
        ],
        r"store path '.*v\.zarr/variants/x\.zarr' is inside the hsstore store '.*v\.zarr'",
    ),
    "plan-attn-package-missing": (
        lambda t: [
            "plan",
            *_m(t, extra_model='attn_implementation = "flash_attention_2"')[1:2],
            "--limit",
            "2",
            "--calibrate",
            "1",
        ],
        r"attention 'flash_attention_2' needs the flash_attn package",
    ),
    "plan-sample-and-limit": (
        lambda t: ["plan", *_m(t)[1:2], "--sample", "10", "--limit", "5"],
        "--sample and --limit do not combine",
    ),
    "convert-unknown-precision": (
        lambda t: ["convert", _two_variant_store(t) + "#dtype=bf16", "--precision", "int8"],
        "unknown storage precision 'int8'",
    ),
    "output-folder-missing": (
        lambda t: [
            "diff",
            _two_variant_store(t) + "#dtype=bf16",
            _two_variant_store(t) + "#dtype=fp32",
            "--json",
            str(t / "no-dir" / "r.json"),
        ],
        r"--json '.*r\.json': folder '.*no-dir' does not exist",
    ),
    "output-is-a-link": (
        lambda t: (
            (t / "r.json").symlink_to(_a_file(t))
            or [
                "diff",
                _two_variant_store(t) + "#dtype=bf16",
                _two_variant_store(t) + "#dtype=fp32",
                "--json",
                str(t / "r.json"),
            ]
        ),
        r"--json '.*r\.json' is a symbolic link \(to '.*/f'\); hsstore does not write through links",
    ),
    "output-inside-store": (
        lambda t: [
            "diff",
            _two_variant_store(t) + "#dtype=bf16",
            _two_variant_store(t) + "#dtype=fp32",
            "--json",
            str(t / "v.zarr" / "zarr.json"),
        ],
        r"--json '.*v\.zarr/zarr\.json' is inside the hsstore store '.*v\.zarr'; hsstore writes reports",
    ),
    "output-empty-path": (
        lambda t: ["diff", _two_variant_store(t) + "#dtype=bf16", _two_variant_store(t) + "#dtype=fp32", "--json", ""],
        r"--json is an empty path \(''\); name the file or folder to write",
    ),
    "export-folder-empty": (
        lambda t: ["export", _two_variant_store(t) + "#dtype=bf16", "eagle", ""],
        r"export folder is an empty path \(''\); name the file or folder to write",
    ),
    "vocab-map-out-empty": (
        lambda t: [
            "vocab-map",
            _two_variant_store(t) + "#dtype=bf16",
            "--size",
            "4",
            "--target-vocab-size",
            "300",
            "--out",
            "",
        ],
        r"vocab-map folder is an empty path \(''\); name the file or folder to write",
    ),
    "output-is-an-input": (
        lambda t: [
            "check",
            _local_model(t, True),
            _two_variant_store(t) + "#dtype=bf16",
            "--json",
            str(t / "model" / "config.json"),
        ],
        r"--json '.*model/config\.json' is a file of the model '.*model', which this command reads",
    ),
    "import-store-inside-source": (
        lambda t: (lambda d: ["import", "modelopt", d, "--store", d + "/s.zarr", "--tokenizer", "builtin:tiny-llama"])(
            _plain_dir(t)
        ),
        r"store '.*/s\.zarr' and the import folder '.*' lie one inside the other",
    ),
    "outputs-name-one-file": (
        lambda t: [
            "diff",
            _two_variant_store(t) + "#dtype=bf16",
            _two_variant_store(t) + "#dtype=fp32",
            "--json",
            str(t / "r.png"),
            "--plot",
            str(t / "." / "r.png"),
        ],
        r"--json and --plot both name '.*r\.png'; the second would replace the first",
    ),
    "plot-unknown-type": (
        lambda t: [
            "diff",
            _two_variant_store(t) + "#dtype=bf16",
            _two_variant_store(t) + "#dtype=fp32",
            "--plot",
            str(t / "p.txt"),
        ],
        r"--plot '.*p\.txt': unknown file type '\.txt'",
    ),
    "threshold-not-a-number": (
        lambda t: [
            "diff",
            _two_variant_store(t) + "#dtype=bf16",
            _two_variant_store(t) + "#dtype=fp32",
            "--max-rel",
            "nan",
        ],
        r"--max-rel nan: must be a number >= 0",
    ),
    "noise-not-positive": (
        lambda t: ["check", "builtin:tiny-llama", _two_variant_store(t) + "#dtype=bf16", "--noise", "-1"],
        r"--noise -1.0: must be a positive number",
    ),
    "selector-key-twice": (
        lambda t: ["diff", _two_variant_store(t) + "#dtype=bf16,dtype=fp32", _two_variant_store(t) + "#dtype=fp32"],
        "names 'dtype' twice",
    ),
    "count-below-one": (
        lambda t: ["export", _two_variant_store(t) + "#dtype=bf16", "eagle", str(t / "e"), "--limit", "-1"],
        r"Invalid value for '--limit': .*greater than or equal to 1 \(see hsstore export --help\)",
    ),
    "gc-grace-not-seconds": (
        lambda t: ["gc", _two_variant_store(t), "--grace", "nan"],
        r"--grace nan: must be a number of seconds >= 0",
    ),
    "check-model-missing": (
        lambda t: ["check", str(t / "no-model"), _two_variant_store(t) + "#dtype=bf16"],
        "model directory .*no-model' does not exist",
    ),
    "check-model-not-a-model": (
        lambda t: (
            (t / "fake").mkdir()
            or (t / "fake" / "config.json").write_text("{}")
            and ["check", str(t / "fake"), _two_variant_store(t) + "#dtype=bf16"]
        ),
        r"cannot load a model from '.*fake': .*; pass a save_pretrained folder",
    ),
    "export-folder-unwritable": (
        lambda t: ["export", _two_variant_store(t) + "#dtype=bf16", "eagle", "/proc/hsstore-export"],
        "cannot create export folder '/proc/hsstore-export'",
    ),
    "vocab-map-out-is-a-file": (
        lambda t: [
            "vocab-map",
            _two_variant_store(t) + "#dtype=bf16",
            "--size",
            "4",
            "--out",
            _a_file(t),
            "--target-vocab-size",
            "300",
        ],
        r"cannot write .*/f: (File exists|Not a directory)",
    ),
    "tokenizer-beyond-vocabulary": (
        lambda t: _m(t, extra_model="config = { vocab_size = 10 }"),
        r"the tokenizer gives token id \d+, but builtin:tiny-qwen3_5 embeds only 10 tokens",
    ),
    "build-list-names-twice": (
        lambda t: _m(t) + ["--dtype", "bf16", "--dtype", "bfloat16"],
        r"\[build\] dtypes names 'bf16' twice",
    ),
    "convert-already-quantized": (
        lambda t: ["convert", _fp8_store(t) + "#precision=fp8-e4m3", "--precision", "fp8-e4m3"],
        "already stored as fp8-e4m3",
    ),
}


_run = run_main


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_clear_line_exit_2_nothing_committed(case: str, tmp_path: Path, capsys):
    make_args, pattern = CASES[case]
    code, err = _run(make_args(tmp_path), capsys)
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err
    store = tmp_path / "s.zarr"
    if store.exists():
        assert Store.open(store).variants == []


def test_catalogue_documents_every_case():
    doc = (REPO / "docs" / "errors.md").read_text()
    missing = [c for c in CASES if f"`{c}`" not in doc]
    assert not missing, f"docs/errors.md lacks rows for {missing}"
    assert len(CASES) >= 20


def test_debug_flag_shows_the_traceback(tmp_path: Path, capsys):
    old = sys.argv
    sys.argv = ["hsstore", "--debug", "info", str(tmp_path / "missing")]
    try:
        with pytest.raises(StoreNotFound, match="no store at"):
            main()
    finally:
        sys.argv = old


def test_usage_error_exits_2(capsys):
    code, err = _run(["build"], capsys)
    assert code == 2 and "Missing argument" in err
    assert DATA.exists()
