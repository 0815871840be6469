"""``hsstore build``: manifest -> tokens -> one worker process per backend -> variants in the store.

Under torchrun (WORLD_SIZE > 1) every rank tokenizes the same inputs deterministically, takes a
disjoint token-balanced share, binds its local GPU and writes its own units; rank 0 then checks that
every sample is committed and records the build as complete.

``inline=True`` runs each worker's own code in this process (hsstore.capture.run.driver).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hsstore.capture.generate.regenerate import samples_of_rows, store_first, summary_fields
from hsstore.capture.inputs.manifest_file import validate
from hsstore.capture.model.spec import ModelSpec, check_vocabulary, text_config
from hsstore.capture.run.lineage import Lineage, agree_build_id, new_build_id, now
from hsstore.capture.run.signals import owned_temp, run_worker, stop_on_signals, sweep_stale_temps
from hsstore.core.errors import BadInput, BuildFailed, BuildInterrupted, HsstoreError
from hsstore.core.interrupt import Stopped
from hsstore.core.keys import SampleTokens
from hsstore.core.schema.build import BuildResult, InputCounts, ModelSource, VariantResult, WorkerOutcome, WorkerPlan
from hsstore.core.schema.manifest import FINAL_NORM, Manifest, resolve_layers
from hsstore.core.schema.provenance import LayerRoles, Recipe
from hsstore.core.schema.store_records import HashedFile
from hsstore.storage import layout
from hsstore.storage.names import another_model_allowed, check_label_free, check_model, labels
from hsstore.storage.store import Store

# --- Where each rank of a build runs: its rank numbers under torchrun and the devices it binds, checked


def dist() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) outside it."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def check_devices(m: Manifest, local_rank: int, world: int) -> list[str]:
    """The devices this rank builds on: ``cuda`` becomes this local rank's GPU, a GPU group is
    ``cuda:i+cuda:j``; BadInput when the machine lacks them (or the fla kernels a build asks for). A CPU
    build never imports torch here: the driver of a build only plans and waits (its worker runs the model)."""
    from hsstore.capture.model.kernels import installed

    if "fla" in m.backends and not installed("fla"):
        raise BadInput(
            "backend 'fla' needs the flash-linear-attention kernels, which are not installed here: "
            "pip install flash-linear-attention fla-core (or use --backend torch)"
        )
    out = []
    for dev in m.devices:
        if dev.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise BadInput(f"device {dev!r} requested but no CUDA GPU is visible here; use --device cpu")
            k, count = m.gpus_per_rank, torch.cuda.device_count()
            if k > 1:
                from hsstore.capture.model.placement import require_accelerate

                require_accelerate()
                first = local_rank * k
                if first + k > count:
                    raise BadInput(
                        f"gpus_per_rank = {k} on local rank {local_rank} needs GPUs {first}..{first + k - 1} "
                        f"but {count} are visible: run at most {count // k} rank(s) per node "
                        f"(torchrun --nproc-per-node {max(1, count // k)}) or lower gpus_per_rank"
                    )
                group = [f"cuda:{first + i}" for i in range(k)]
                names = {torch.cuda.get_device_name(d) for d in group}
                if len(names) > 1:
                    raise BadInput(
                        f"the GPUs of one rank group differ ({', '.join(sorted(names))}); a model spread "
                        "over GPUs must run on one kind of GPU — set CUDA_VISIBLE_DEVICES to GPUs of one model"
                    )
                dev = "+".join(group)
            elif dev == "cuda":
                dev = f"cuda:{local_rank % torch.cuda.device_count()}" if world > 1 else "cuda:0"
            elif int(dev[5:]) >= torch.cuda.device_count():
                raise BadInput(f"device {dev!r} requested but only {torch.cuda.device_count()} GPU(s) are visible")
        out.append(dev)
    return out


def barrier(group: Any) -> None:
    """Wait for every rank, letting stop signals through (a blocking gloo barrier holds them until it ends)."""
    if group is None:
        return
    work = group.barrier(async_op=True)
    while not work.is_completed():
        time.sleep(0.05)
    work.wait()


def process_group(world: int) -> Any:
    """torch.distributed over gloo when under torchrun (it carries only barriers), else None."""
    if world == 1:
        return None
    import torch.distributed

    torch.distributed.init_process_group("gloo")
    return torch.distributed


# --- Build workers run in the driver's own process: the worker process's code (hsstore.capture.run.worker.run) on

_INLINE: ContextVar[bool] = ContextVar("hsstore_inline_workers", default=False)


@contextmanager
def inline_workers() -> Iterator[None]:
    """Builds started inside run their workers inline (``driver.build``'s default becomes ``inline=True``)."""
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)


def inline_default() -> bool:
    """Whether a build that does not say runs its workers inline here."""
    return _INLINE.get()


def run_here(plan_path: str) -> int:
    """The worker of the plan at ``plan_path``, in this process: its exit code (its outcome is in the plan's
    result file, as from a worker process)."""
    from hsstore.capture.run.worker import run

    return run(WorkerPlan.from_json(Path(plan_path).read_bytes(), f"worker plan {plan_path}"))


@dataclass(frozen=True)
class Inputs:
    """What a build computes from: the model, its recipe and hashed weights, the tokenized samples."""

    spec: ModelSpec
    recipe: Recipe
    weights: dict[str, HashedFile]  # weight file name -> content hash and stamp ({} for builtins)
    samples: list[SampleTokens]
    report: Any  # hsstore.capture.inputs.tokenizing.InputReport
    pad_id: int
    regenerated: Any = None  # [generate]: hsstore.capture.generate.regenerate.Regenerated


def plan_inputs(
    m: Manifest, limit: int | None, quiet: bool = True, rows: Any = None, drawn: bool = True, **to: Any
) -> Inputs:
    """Validate the model and layers, tokenize the inputs (``rows``: these of the data files' rows, e.g. a
    sample, as ``load_rows`` yields them; default all), hash the weights (``quiet=False``: a status line
    at each of those phases; ``drawn=False``: the model is only planned, never drawn here; ``to``: samples_of_rows')."""
    from hsstore.capture.run.progress import status

    spec = ModelSpec(m.model_path, m.config_overrides, m.seed, m.trust_remote_code, m.init_device)
    spec.check()
    status(f"loading the tokenizer and config of {m.model_path}", quiet)
    tok = spec.tokenizer()
    config = spec.config(len(tok), drawn)
    layers = resolve_layers(m.layers, int(text_config(config).num_hidden_layers), m.model_path)
    tok_id = spec.tokenizer_identity(tok)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0))
    files = spec.weight_files() if spec.builtin is None else []
    if files:
        status(f"hashing the model's weights ({len(files)} file(s), {_mb(files)})", quiet)
    weights = spec.hash_weights()  # every build: a variant only gets states of weights hashed for it
    status(f"tokenizing {len(m.data_files)} data file(s) ({_mb(m.data_files)})", quiet or bool(m.generate and to))
    if m.generate is not None and to.get("store") is not None:  # a build's replies: not for a store it cannot join
        check_model_joins(m, spec.identity(config, weights).to_dict())
    samples, report, regen = samples_of_rows(
        m, spec, tok, tok_id, spec.identity(config, weights), rows, limit, pad, quiet, **to
    )
    recipe = Recipe(
        model=spec.identity(config, weights),
        tokenizer=tok_id,
        layers=LayerRoles(**layers),
        capture="decoder_layer_output",  # layer i = raw output of decoder layer i (pre final norm)
        # layer num_layers, when listed, is the final norm's output (a named capture, see manifest.FINAL_NORM)
        final_norm=any(i == FINAL_NORM for ids in m.layers.values() for i in ids),
        max_length=m.max_length,
        truncation=m.too_long,
        **({"generation": regen.generation} if regen is not None else {}),
    )
    check_vocabulary(config, max([pad, *(int(s.input_ids.max()) for s in samples if s.length)]), m.model_path)
    return Inputs(spec, recipe, weights, samples, report, pad, regen)


def _mb(paths: Sequence[Any]) -> str:
    """The total size of the files (or folders) at ``paths``, e.g. "12.3 MB"."""
    total = 0
    for p in map(Path, paths):
        try:
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
        except OSError:
            continue
    return f"{total / 1e6:,.1f} MB"


def share(lengths: Sequence[int], token_budget: int, rank: int, world: int) -> tuple[list[int], list[list[int]]]:
    """This rank's samples (indices into ``lengths``) and its batches (indices into those samples).

    One global batch plan, then whole batches per rank: a sample is always computed in the same batch,
    so states are bit-identical whatever the world size or however often a build resumed."""
    from hsstore.core.batching import token_budget_batches
    from hsstore.core.partition import balanced_by_tokens

    batches = token_budget_batches(lengths, token_budget)
    mine = balanced_by_tokens([sum(lengths[i] for i in b) for b in batches], world)[rank]
    samples = [i for b in mine for i in batches[b]]
    local, pos = [], 0
    for b in mine:
        local.append(list(range(pos, pos + len(batches[b]))))
        pos += len(batches[b])
    return samples, local


def worker_plan(
    m: Manifest,
    inp: Inputs,
    backend: str,
    devices: list[str],
    batches: list[list[int]],
    tmp: str,
    rank: int,
    quiet: bool,
) -> WorkerPlan:
    """The plan of the ``backend`` worker of this rank (its files live in ``tmp``)."""
    name = os.path.join(tmp, f"{backend}-r{rank}")
    return WorkerPlan(
        backend=backend,
        store=m.store_path,
        recipe=inp.recipe,
        model=ModelSource(**asdict(inp.spec)),
        weight_stamps={n: h.stamp for n, h in inp.weights.items()},
        samples_file=os.path.join(tmp, "samples.npz"),
        batches=batches,
        runs=[(d, dev) for d in m.dtypes for dev in devices],
        attn_implementation=m.attn_implementation,
        token_budget=m.token_budget,
        unit_tokens=m.unit_tokens,
        codec=m.codec,
        precision=m.precision,
        allow_unhealthy=m.allow_unhealthy,
        pad_id=inp.pad_id,
        writer_prefix=f"r{rank}-",
        label=m.label,
        another_model="build" if m.another_model else None,
        quiet=quiet,
        result=f"{name}.result.json",
        progress=f"{name}.variants",
        parent_pid=os.getpid(),
    )


@dataclass
class Context:
    """One rank's build: where it runs and what it has done so far (named when the build ends early)."""

    store: str
    rank: int
    world: int
    devices: list[str]
    inline: bool = False  # workers run in this process (hsstore.capture.run.worker.run), not in their own
    keys: list[str] = field(default_factory=list)  # this rank's sample keys, once planned
    variants: list[str] = field(default_factory=list)  # the variants its workers opened, in order
    lineage: Lineage | None = None  # its build records, once the store is open

    def committed(self) -> dict[str, int]:
        """Variant -> how many of this rank's samples are committed now."""
        from hsstore.storage.store import Store

        store = Store.open(self.store)
        return {v: sum(1 for k in self.keys if k in store.reader(v, refresh=True).refs) for v in self.variants}

    def stopped(self, sig: str) -> str:
        """What a stopped build says: what is committed, and how to resume."""
        if not self.variants:
            return (
                f"interrupted by {sig} before any variant was written; nothing was committed — run the same "
                "command again to build"
            )
        share = " (this rank's share)" if self.world > 1 else ""
        try:
            what = "; ".join(
                f"variant {v}: {n} of {len(self.keys)} samples{share} committed" for v, n in self.committed().items()
            )
        except HsstoreError as e:
            what = f"the store could not be read back ({e})"
        return (
            f"interrupted by {sig}; the worker was stopped. {what} — committed units are intact; re-run the "
            "same command to resume"
        )

    def ended(self, outcome: str, error: BaseException) -> None:
        """Record a failed or interrupted build; never masks ``error`` (a record that cannot be written is
        left unwritten: the start record then stands for a build that did not end cleanly)."""
        if self.lineage is None:
            return
        try:
            committed = self.committed()
        except Exception:  # noqa: BLE001 - the store may be what failed
            committed = {}
        msg = str(error) if isinstance(error, HsstoreError) else f"{type(error).__name__}: {error}"
        try:
            self.lineage.end(outcome, committed=committed, error=msg)
        except Exception:  # noqa: BLE001 - see above
            pass


def _run_worker(plan: WorkerPlan, ctx: Context) -> list[VariantResult]:
    """Run one worker to its end (stopped with the build on a signal) and return its variants."""
    plan_path = plan.result.replace(".result.json", ".plan.json")
    Path(plan_path).write_text(json.dumps(plan.to_dict()))
    env = dict(os.environ)
    for k in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "TORCHELASTIC_RUN_ID",
    ):
        env.pop(k, None)  # the worker is a plain process, not a member of the process group
    try:
        code = (
            run_here(plan_path)
            if ctx.inline
            else run_worker([sys.executable, "-m", "hsstore.capture.run.worker", plan_path], env)
        )
    finally:
        opened = Path(plan.progress).read_text().split() if Path(plan.progress).exists() else []
        ctx.variants += [v for v in opened if v not in ctx.variants]
    try:
        raw = Path(plan.result).read_bytes()
    except OSError:
        raise BuildFailed(
            f"the {plan.backend} worker died (exit {code}) before reporting; "
            "committed units are intact — re-run the same command to resume"
        ) from None
    outcome = WorkerOutcome.from_json(raw, f"the {plan.backend} worker's result", BuildFailed)
    if outcome.error is not None:
        raise (BadInput if outcome.exit_code == 2 else BuildFailed)(outcome.error)
    return outcome.results


def build(
    m: Manifest, limit: int | None = None, quiet: bool = False, space_check: bool = True, inline: bool | None = None
) -> BuildResult:
    """Run the whole build; returns the summary printed at the end. Every build started on an open store
    leaves its records there (hsstore.capture.run.lineage), whatever its end. SIGTERM, SIGINT or SIGHUP stop it
    (and its worker) with BuildInterrupted, exit status 128 + the signal (hsstore.capture.run.signals).
    ``space_check``: refuse, before the store is made and any model loads, a build whose estimated size
    exceeds the free space of a local store's filesystem (hsstore.capture.plan.plan_sizes.check_space).
    ``inline``: run the workers in this process (default: as ``inline.inline_workers()`` says, else not)."""
    from hsstore.capture.model.kernels import require_attention
    from hsstore.capture.run.progress import status

    t0 = time.time()
    m = validate(m)
    status(f"planning {m.source}: checking devices", quiet)
    rank, world, local_rank = dist()
    inline = inline_default() if inline is None else inline
    require_attention(m.attn_implementation, 'install it, or set [model] attn_implementation = "sdpa"')
    ctx = Context(m.store_path, rank, world, check_devices(m, local_rank, world), inline)
    with stop_on_signals():
        try:
            return _build(m, limit, quiet, ctx, t0, space_check)
        except Stopped as s:
            err = BuildInterrupted(s.signum, ctx.stopped(str(s)))
            ctx.ended("interrupted", err)
            raise err from None
        except BaseException as e:
            ctx.ended("failed", e)
            raise


def _checked_inputs(
    m: Manifest, limit: int | None, quiet: bool, ctx: Context, space_check: bool, early: Store | None, build_id: str
) -> Inputs:
    """The build's inputs (``plan_inputs``), checked before the store is made, a model loads or a worker starts:
    the space the build needs (``space_check``), then the store's model and labels. A store a regenerating build
    made first (``early``) is discarded when it is refused before a reply was saved in it."""
    try:
        inp = plan_inputs(m, limit, quiet or ctx.rank != 0, store=early, build_id=build_id, world=ctx.world)
        if space_check:
            from hsstore.capture.plan.plan_sizes import check_space

            check_space(m, inp)  # before the store is made, a model loads or a worker starts
        check_joining(m, inp.recipe.to_dict())  # the store's model and labels: before any state is written
    except BaseException:
        if early is not None:  # refused before a reply was saved: the store it made is not left behind
            early.discard_if_unused()
        raise
    return inp


def _build(m: Manifest, limit: int | None, quiet: bool, ctx: Context, t0: float, space_check: bool) -> BuildResult:
    from hsstore.storage.store import Store

    started = now()
    early, build_id = store_first(m), new_build_id()  # a regenerating build checkpoints replies as it goes
    inp = _checked_inputs(m, limit, quiet, ctx, space_check, early, build_id)
    store = early or Store.create(m.store_path)  # a bad store path fails before any model runs
    before = set(store.variant_ids())
    group = process_group(ctx.world)
    try:
        mine, batches = share([s.length for s in inp.samples], m.token_budget, ctx.rank, ctx.world)
        ctx.keys = [inp.samples[i].key for i in mine]
        ctx.lineage = Lineage.begin(
            store,
            m.store_path,
            m,
            build_id=agree_build_id(group, ctx.rank, build_id),
            rank=ctx.rank,
            world=ctx.world,
            recipe=inp.recipe,
            report=inp.report,
            samples=len(inp.samples),
            share_samples=len(mine),
            share_tokens=sum(inp.samples[i].length for i in mine),
            started_at=started,
        )
        results = _run_workers(m, inp, mine, batches, quiet, ctx)
        barrier(group)
        complete, others = _record_complete(m, inp.samples, results) if ctx.rank == 0 else (None, None)
    finally:
        if group is not None:
            group.destroy_process_group()
    ctx.lineage.end("succeeded", variants=results, committed=ctx.committed(), complete=complete)
    sys.stderr.write("".join(f"{n}\n" for n in new_variant_notes(store, before, results if ctx.rank == 0 else [])))
    return BuildResult(
        store=m.store_path,
        rank=ctx.rank,
        world_size=ctx.world,
        inputs=InputCounts.from_dict(inp.report.to_dict(), "input report", BuildFailed),
        variants=results,
        complete=complete,
        seconds=time.time() - t0,
        samples_not_in_inputs=others,
        build_id=ctx.lineage.start.build_id,
        build_record=ctx.lineage.where(ctx.lineage.record_key),
        rows_report=ctx.lineage.where(ctx.lineage.start.rows_report),
        **summary_fields(inp, ctx.lineage),
    )


def _run_workers(
    m: Manifest, inp: Inputs, mine: list[int], batches: list[list[int]], quiet: bool, ctx: Context
) -> list[VariantResult]:
    """This rank's samples through one worker per backend, from a temporary folder removed at the end."""
    from hsstore.capture.inputs.datafiles import save_samples
    from hsstore.capture.run.progress import status

    results: list[VariantResult] = []
    removed = sweep_stale_temps()
    if removed:
        status(
            f"removed {len(removed)} temporary folder(s) of builds killed outright: {', '.join(removed)}",
            quiet or ctx.rank != 0,
        )
    # a worker whose driver died removes the folder itself; a stray one may have done so already
    with owned_temp() as tmp:
        save_samples(os.path.join(tmp, "samples.npz"), [inp.samples[i] for i in mine])
        for backend in m.backends:
            status(
                f"starting the {backend} worker (a fresh process: imports torch and transformers)",
                quiet or ctx.rank != 0,
            )
            results += _run_worker(worker_plan(m, inp, backend, ctx.devices, batches, tmp, ctx.rank, quiet), ctx)
    return results


def _record_complete(
    m: Manifest, samples: list[SampleTokens], results: list[VariantResult]
) -> tuple[dict[str, bool], dict[str, int]]:
    """Check every input sample is committed for every variant built; record the build as complete. Returns
    that, and how many committed samples of each variant are not among the inputs."""
    from hsstore.core.keys import fingerprint
    from hsstore.storage.store import Store

    store = Store.open(m.store_path, mode="a")
    keys = sorted(s.key for s in samples)
    out, others = {}, {}
    for vid in sorted({r.variant for r in results}):
        have = store.reader(vid, refresh=True).refs
        others[vid] = len(have) - len(set(keys))  # (every input key is committed, below)
        missing = [k for k in keys if k not in have]
        if missing:
            raise BuildFailed(
                f"variant {vid}: {len(missing)} of {len(keys)} samples are not committed after the "
                f"build (first {missing[0]}); re-run the same command to complete it"
            )
        record = {
            "complete": True,
            "n_samples": len(keys),
            "keys_fingerprint": fingerprint(keys),
            "manifest": m.source,
            "finished_at": now(),
        }
        store.io.put_atomic(layout.build_key(vid, fingerprint(keys)[:16]), json.dumps(record).encode())
        out[vid] = True
    return out, others


# --- What a build checks before it joins a store (the store's one model, the label it gives) and what it
# says of the variants it made.


def new_variant_notes(store: Store, before: set[str], built: list[Any]) -> list[str]:
    """For each variant of ``built`` (a build's results: ``.variant``) not in ``before`` made beside others:
    what made it new and the selector that names it alone now that the command is over (said as each started, the next would outdate it)."""
    from hsstore.core.selectors import fork_note

    provs = store.provenances(skip_unreadable=True)  # an unreadable record is verify's to report
    found = labels(store)
    notes = [
        fork_note(vid, provs[vid], {v: p for v, p in provs.items() if v != vid}, found, every=provs)
        for vid in dict.fromkeys(r.variant for r in built if r.variant not in before and r.variant in provs)
    ]
    return [n for n in notes if n]


def check_model_joins(m: Any, model: Mapping[str, Any]) -> Store | None:
    """BadInput if the store of manifest ``m`` holds another model's states than ``model`` (a model identity),
    unless ``m.another_model`` (then the model is recorded as let in); the store, or None where there is none."""
    from hsstore.core.errors import StoreNotFound

    another_model = "build" if m.another_model else None
    try:
        store = Store.open(m.store_path, mode="a" if another_model else "r")
    except StoreNotFound:
        return None
    with another_model_allowed(another_model):
        check_model(store, {"recipe": {"model": dict(model)}}, what=f"this build ({m.source})")
    return store


def check_joining(m: Any, recipe: Mapping[str, Any]) -> None:
    """Before the build of manifest ``m`` (hsstore.core.schema.manifest.Manifest) writes anything or runs
    a model: BadInput if its store holds another model's states than ``recipe``'s (unless
    ``m.another_model``: the model is recorded as let in) or its label names a variant of another recipe
    or backend/dtype/device."""
    path, label, run = m.store_path, m.label, (m.backends[0], m.dtypes[0], m.devices[0])
    store = check_model_joins(m, recipe["model"])
    if store is None:
        return  # a new store: nothing to join
    holder = next((v for v, lab in labels(store).items() if lab == label), None) if label else None
    if holder is None:
        if label:  # a label no variant holds yet must not read as another's id prefix
            check_label_free(store, None, label)
        return
    rec = store.variant_record(holder)
    env = rec.prov.environment
    if rec.provenance.get("recipe") != recipe or (env.backend, env.dtype, env.device) != (
        run[0],
        run[1],
        run[2].split(":")[0],
    ):
        raise BadInput(
            f"label {label!r} already names variant {holder} in {path} (another recipe or "
            "backend/dtype/device than this build's); choose another --label"
        )
