"""A small, honest example: train a tiny DFlash-style drafter head on cached states, then evaluate it
on a second store opened with ``require=`` the training provenance.

    hsstore build manifests/tiny.toml
    torchrun --nproc-per-node 2 scripts/train_drafter_example.py \\
        --train 'out/tiny.zarr#dtype=bf16' --eval 'out/tiny.zarr#dtype=bf16' --mismatched 'out/tiny.zarr#dtype=fp32'

The head: fc over the aux layers (width read from the store: n_aux x hidden) -> one causal transformer
layer -> logits over the vocabulary, trained to predict the next token on loss-masked positions, with
an auxiliary MSE towards the target layer. Reads through the streaming dataset (DDP ranks x DataLoader
workers, token-budget batches). Runs on CPU with gloo, or plain ``python`` for one process.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from hsstore import HiddenStateDataset, ProvenanceMismatch, StreamingHiddenStateDataset
from hsstore.read.dataset import pad_collate


class DrafterHead(nn.Module):
    def __init__(self, n_aux: int, hidden: int, vocab: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n_aux * hidden, hidden)
        self.block = nn.TransformerEncoderLayer(hidden, nhead=4, dim_feedforward=2 * hidden, batch_first=True)
        self.to_target = nn.Linear(hidden, hidden)
        self.lm_head = nn.Linear(hidden, vocab)

    def forward(self, aux: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, n, H = aux.shape
        x = self.fc(aux.float().reshape(B, T, n * H))
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=aux.device), diagonal=1)
        x = self.block(x, src_mask=causal, src_key_padding_mask=~attention_mask, is_causal=True)
        return self.lm_head(x), self.to_target(x)


def losses(model: nn.Module, batch: dict) -> torch.Tensor:
    logits, pred_target = model(batch["aux_hidden"], batch["attention_mask"])
    # next-token prediction on positions whose next token is trained (loss mask) and real
    mask = (batch["loss_mask"][:, 1:] & batch["attention_mask"][:, 1:]).float()
    ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")
    ce = (ce * mask).sum() / mask.sum().clamp_min(1)
    tmask = batch["attention_mask"].unsqueeze(-1).float()
    mse = (((pred_target - batch["target_hidden"][:, :, -1].float()) ** 2) * tmask).sum() / tmask.sum().clamp_min(1)
    return ce + mse


def to_device(batch: dict, device: str) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def evaluate(model: nn.Module, ds: HiddenStateDataset, n: int = 32, device: str = "cpu") -> float:
    model.eval()
    with torch.no_grad():
        items = [ds[i] for i in range(min(n, len(ds)))]
        out = float(losses(model, to_device(pad_collate(items), device)))
    model.train()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True, help="STORE#SELECTOR of the training states")
    ap.add_argument("--eval", required=True, help="STORE#SELECTOR of the eval states (must match provenance)")
    ap.add_argument("--mismatched", default=None, help="a STORE#SELECTOR the eval half must refuse")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None, help="write losses here (rank 0), with the loss of every step")
    ap.add_argument("--device", default="cpu", help="where the head trains (cuda: one GPU, single process)")
    args = ap.parse_args()
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)

    train = StreamingHiddenStateDataset(args.train, batch_tokens=args.batch_tokens, seed=0, remainder="drop")
    # everything about the layers comes from the store: fc width = n_aux x hidden
    n_aux, hidden = len(train.layer_roles["aux"]), train.hidden_size
    vocab = int(train.provenance["recipe"]["tokenizer"]["vocab_size"])
    model = DrafterHead(n_aux, hidden, vocab).to(args.device)
    ddp = nn.parallel.DistributedDataParallel(model) if distributed else model
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    held_out = HiddenStateDataset(args.eval, require=train.provenance)  # refuses other provenance
    first_eval = evaluate(model, held_out, device=args.device)
    step, epoch, history = 0, 0, []
    # spawned workers (forking a process that already runs DDP and gloo threads is not safe), kept across epochs:
    # set_epoch and mark_consumed reach persistent workers (the dataset hands them to the workers' next iterator)
    loader = DataLoader(
        train,
        batch_size=None,
        num_workers=args.workers,
        multiprocessing_context="spawn" if args.workers else None,
        persistent_workers=args.workers > 0,
    )
    while step < args.steps:
        train.set_epoch(epoch)
        for batch in loader:
            loss = losses(ddp, to_device(batch, args.device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            train.mark_consumed(batch)
            history.append(float(loss.detach()))
            step += 1
            if step >= args.steps:
                break
        epoch += 1
        if distributed:  # remainder="drop": every rank takes as many batches; the step count stays in step
            t = torch.tensor([step], dtype=torch.long)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            step = int(t)
    last_eval = evaluate(model, held_out, device=args.device)
    refusal = None
    if args.mismatched:
        try:
            HiddenStateDataset(args.mismatched, require=train.provenance)
            refusal = "NOT REFUSED"
        except ProvenanceMismatch as e:
            refusal = str(e)
    if rank == 0:
        k = max(1, len(history) // 10)
        first, last = sum(history[:k]) / k, sum(history[-k:]) / k
        print(f"drafter head: fc {n_aux}x{hidden} -> {hidden}, vocab {vocab}; {step} steps over {epoch} epoch(s)")
        print(f"train loss {first:.3f} -> {last:.3f}; eval loss {first_eval:.3f} -> {last_eval:.3f}")
        if refusal:
            print(f"eval on {args.mismatched} refused:\n{refusal}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "train_first": first,
                        "train_last": last,
                        "eval_first": first_eval,
                        "eval_last": last_eval,
                        "steps": step,
                        "epochs": epoch,
                        "refusal": refusal,
                        "train": args.train,
                        "provenance": train.provenance,
                        "losses": history,
                    },
                    f,
                )
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
