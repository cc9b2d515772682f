"""`--to pytorch-local`: a small runnable PyTorch reference of a local-learning plan (the `local` schedule, PPLL), for
which no framework exists. One process per pipeline stage (torch.distributed: NCCL on GPUs, gloo on CPUs); each
process owns its stage's blocks, an auxiliary head (the last stage: the model's head) and its own optimizer, trains
on its own loss and sends the detached forward output to the next rank, at most `local_queue_depth` sends
outstanding (a bounded queue). The blocks are PyTorch's pre-norm `nn.TransformerEncoderLayer` at the plan's shapes
(causal for language models; a ViT's patch stem and class token); data are synthetic, a marked place to plug a loader.
"""

from __future__ import annotations

from planner.cost.schedule import schedule_of
from planner.errors import PlannerError
from planner.export.common import ExportResult, export_header, host_files, host_order, placement_notes, stage_units
from planner.export.launch import SLURM, TORCHRUN, Program, slurm_script, torchrun_script
from planner.plan import Plan

__all__ = ["SCRIPT", "export_pytorch_local", "reference_settings"]

SCRIPT = "ppll_train.py"


def reference_settings(plan: Plan) -> dict[str, object]:
    """The shapes and schedule the script runs, from the plan (PlannerError where it cannot run the plan)."""
    config, model = plan.parallel, plan.model
    if not schedule_of(config.schedule).local_losses:
        raise PlannerError(f"--to pytorch-local writes local-learning references; this plan's schedule is "
                           f"{config.schedule.value} (plan with --schedule local, or export it to a framework)")
    others = {name: getattr(config, name) for name in ("dp", "tp", "cp", "ep") if getattr(config, name) != 1}
    if others:
        given = ", ".join(f"{name}={value}" for name, value in others.items())
        raise PlannerError(f"--to pytorch-local runs one process per pipeline stage and needs dp=tp=cp=ep=1, got "
                           f"{given}")
    stem = model.blocks[0] if not model.token_embedding else None
    if stem is not None and (len(stem.linears) != 1 or stem.attention or stem.mlp):
        raise PlannerError(f"--to pytorch-local: {model.name} reads no tokens and its first block is not a "
                           f"patch stem (one linear, no attention or MLP)")
    blocks = model.blocks[1:] if stem else model.blocks
    if any(block.attention is None or block.mlp is None or block.mlp.is_moe for block in blocks):
        raise PlannerError(f"--to pytorch-local builds dense attention + MLP blocks; {model.name} has other kinds")
    first = blocks[0]
    return {
        "model": model.name, "hidden": first.hidden_size, "heads": first.attention.num_attention_heads,
        "ffn": first.mlp.ffn_hidden_size, "outputs": model.vocab_size,
        "causal": first.attention.kind != "bidirectional",
        "patch_inputs": stem.linears[0][0] if stem else None, "tokens": first.tokens or plan.training.seq_len,
        "stages": [[int(embedding), start, end, int(head)] for embedding, start, end, head in stage_units(plan)],
        "micro_batch": config.micro_batch, "num_microbatches": config.num_microbatches(plan.training.global_batch),
        "queue_depth": config.local_queue_depth, "aux_head": config.local_head,
    }


_BODY = r'''
import argparse
import collections
import time

import torch
import torch.distributed as dist
from torch import nn


class Stage(nn.Module):
    """Blocks [start, end) of the model, with the input embedding (tokens, or a ViT's patch stem) on stage 0."""

    def __init__(self, embedding: bool, start: int, end: int) -> None:
        super().__init__()
        h, s = SETTINGS["hidden"], SETTINGS["tokens"]
        vision = SETTINGS["patch_inputs"] is not None
        self.embed = None
        if embedding:
            self.embed = nn.Linear(SETTINGS["patch_inputs"], h) if vision else nn.Embedding(SETTINGS["outputs"], h)
            self.cls = nn.Parameter(torch.zeros(1, 1, h)) if vision else None
            self.position = nn.Parameter(torch.zeros(1, s, h))
        first = 1 if vision else 0  # a ViT's block 0 is its stem, built above
        count = max(end, first) - max(start, first)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(h, SETTINGS["heads"], SETTINGS["ffn"], dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True) for _ in range(count))
        causal = nn.Transformer.generate_square_subsequent_mask(s) if SETTINGS["causal"] else None
        self.register_buffer("mask", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
            if self.cls is not None:
                x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
            x = x + self.position
        for block in self.blocks:
            x = block(x, src_mask=self.mask, is_causal=self.mask is not None)
        return x


def head(kind: str) -> nn.Module:
    """The auxiliary head (or the model's own, kind "linear", on the last stage): norm, [linear + GELU], linear."""
    h, outputs = SETTINGS["hidden"], SETTINGS["outputs"]
    hidden = [nn.Linear(h, h), nn.GELU()] if kind == "mlp" else []
    return nn.Sequential(nn.LayerNorm(h), *hidden, nn.Linear(h, outputs))


def batch(step: int, microbatch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic inputs and labels, the same on every rank for a (step, micro-batch). REPLACE with a data loader:
    stage 0 needs the inputs, every stage the labels."""
    generator = torch.Generator().manual_seed(step * 100_003 + microbatch)
    b, s, outputs = SETTINGS["micro_batch"], SETTINGS["tokens"], SETTINGS["outputs"]
    if SETTINGS["patch_inputs"] is not None:  # patchified images: (b, patches, channels * patch²); a class each
        inputs = torch.randn(b, s - 1, SETTINGS["patch_inputs"], generator=generator)
        labels = torch.randint(outputs, (b,), generator=generator)
    else:  # tokens and their next tokens
        tokens = torch.randint(outputs, (b, s + 1), generator=generator)
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
    return inputs.to(device), labels.to(device)


def local_loss(logits_of: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A ViT classifies its class token; a language model predicts every next token."""
    if SETTINGS["patch_inputs"] is not None:
        return nn.functional.cross_entropy(logits_of(x[:, 0]), labels)
    return nn.functional.cross_entropy(logits_of(x).flatten(0, 1), labels.flatten())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10, help="iterations (each of num_microbatches micro-batches)")
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != len(SETTINGS["stages"]):
        raise SystemExit(f"{SCRIPT_NAME} needs one process per stage: {len(SETTINGS['stages'])}, got {world}")
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    embedding, start, end, last = SETTINGS["stages"][rank]
    torch.manual_seed(rank)
    stage = Stage(bool(embedding), start, end).to(device)
    loss_head = head("linear" if last else SETTINGS["aux_head"]).to(device)
    optimizer = torch.optim.AdamW([*stage.parameters(), *loss_head.parameters()], lr=args.lr)
    shape = (SETTINGS["micro_batch"], SETTINGS["tokens"], SETTINGS["hidden"])
    m, depth = SETTINGS["num_microbatches"], SETTINGS["queue_depth"]
    sent: collections.deque = collections.deque()  # the bounded queue: sends not yet taken downstream
    for step in range(args.steps):
        began, total = time.perf_counter(), 0.0
        for microbatch in range(m):
            inputs, labels = batch(step, microbatch, device)
            if rank > 0:
                inputs = torch.empty(shape, device=device)
                dist.recv(inputs, rank - 1)
            with torch.autocast(device.type, torch.bfloat16, enabled=cuda):
                out = stage(inputs)
                loss = local_loss(loss_head, out, labels) / m
            if not last:
                if len(sent) >= depth:
                    sent.popleft()[0].wait()
                outgoing = out.detach().float().contiguous()
                sent.append((dist.isend(outgoing, rank + 1), outgoing))
            loss.backward()  # this stage's own loss: no gradient goes upstream
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"stage {rank} step {step}: local loss {total:.4f}, {time.perf_counter() - began:.3f} s", flush=True)
    while sent:
        sent.popleft()[0].wait()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def reference_script(plan: Plan, header: list[str]) -> str:
    """The runnable script: its settings from the plan, then the fixed body above."""
    settings = repr(reference_settings(plan))  # str, int, bool, None and lists: a Python literal
    lines = ["#!/usr/bin/env python3", f'"""Local learning (PPLL) reference for {plan.model.name}: torchrun '
             f'--nproc-per-node {plan.parallel.pp} {SCRIPT} [--steps N]."""',
             *(f"# {line}" for line in header), "", f"SCRIPT_NAME = {SCRIPT!r}",
             f"SETTINGS = {settings}"]
    return "\n".join(lines) + "\n" + _BODY


def export_pytorch_local(plan: Plan) -> ExportResult:
    """ppll_train.py, torchrun.sh, slurm.sbatch and (several nodes) hostfile for a local-learning plan."""
    notes = ("a reference of local learning, not a framework: synthetic data (replace batch()), PyTorch's own "
             "encoder layers at the plan's shapes, bf16 autocast on GPUs; it changes the training algorithm "
             "(per-stage losses, no end-to-end backward)",)
    order = host_order(plan)
    notes += placement_notes(order)
    header = export_header("pytorch-local", plan, notes, "one process per pipeline stage, rank = stage")
    program = Program((), f'"$HERE/{SCRIPT}"', (), ("Needs PyTorch (torch.distributed) importable by this Python.",))
    files = {SCRIPT: reference_script(plan, header), TORCHRUN: torchrun_script(order, header, program),
             SLURM: slurm_script(plan, order, header)}
    return ExportResult(files=files | host_files(order), notes=notes)
