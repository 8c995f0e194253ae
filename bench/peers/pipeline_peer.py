#!/usr/bin/env python3
"""The PyTorch peer of meshwork-train's pipeline stages: torch.distributed.pipelining.

The same Llama, initial weights, synthetic data, optimizer and schedule as llama_peer.py (which
mirrors meshwork-train), cut into WORLD_SIZE stages of decoder layers as meshwork-train cuts them
(pp::FlopBalancedCut: per-layer training FLOPs, the head's charged to the last layer, the
slowest stage made as fast as possible), one stage per rank, and run with PyTorch's own
schedules (ScheduleGPipe, Schedule1F1B) over Gloo. What
meshwork-train does around the program is done the same way here:
  - every rank reads the whole global batch; the schedule splits it into micro-batches of
    consecutive rows and scales the gradients by 1 / micro-batches (scale_grads);
  - a tied table (llama-100m ties it) lives on the first stage (the embedding) and the last (the
    head), and the two copies' gradients are summed after the program (an all-reduce over the
    two ranks), as meshwork-train's SyncTiedGradients does;
  - the gradient norm is the global one (each stage's squares summed, the table once), clipped;
    AdamW with decay on matrices; the loss is the last stage's mean over the micro-batches.

Rank 0 writes one JSON object per step to --jsonl, as meshwork-train's logging.jsonl does
(step, loss, step_seconds), so bench/protocol.py records both alike. Launch one process per rank
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (bench/netlab_pipeline.sh does, each rank
in its netlab namespace); GLOO_SOCKET_IFNAME picks the interface.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_peer as lp  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # noqa: E402

# PyTorch's zero-bubble schedules are not offered: ScheduleInterleavedZeroBubble over one stage a
# rank gave other losses than its 1F1B from step 4 on (tiny, pp 2, 2 micro-batches), unexplained.
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def flop_balanced_cut(c: lp.LlamaConfig, seq: int, stages: int, head_factor: float) -> list[int]:
    """pp::FlopBalancedCut: each layer 6 x its weights + 12 x hidden x seq, the last layer also
    head_factor x hidden x vocab (6: the logits' gradient stored; 8: recomputed); the split whose
    slowest stage is fastest, the first found in Meshwork's order where several tie."""
    h = c.hidden_size
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    weights = 2 * h * h + 2 * h * kv + 3 * h * c.intermediate_size
    costs = [6.0 * weights + 12.0 * h * seq] * c.num_hidden_layers
    costs[-1] += head_factor * h * c.vocab_size
    n = len(costs)
    prefix = [0.0]
    for x in costs:
        prefix.append(prefix[-1] + x)
    best = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[-1] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):
                here = max(best[s - 1][j], prefix[i] - prefix[j])
                if here < best[s][i]:
                    best[s][i], cut[s][i] = here, j
    first = [0] * (stages + 1)
    first[stages] = n
    i = n
    for s in range(stages, 0, -1):
        i = cut[s][i]
        first[s - 1] = i
    return first


class Stage(nn.Module):
    """Decoder layers [first, last) of `full`, with the embedding on the first stage and the final
    norm and head on the last (a tied head: its own copy of the table, kept equal by summing
    the two copies' gradients every step)."""

    def __init__(self, full: lp.LlamaForCausalLM, first: int, last: int, is_first: bool, is_last: bool) -> None:
        super().__init__()
        self.embed_tokens = full.model.embed_tokens if is_first else None
        self.layers = nn.ModuleList(full.model.layers[first:last])
        self.norm = full.model.norm if is_last else None
        self.head = None
        if is_last:
            weight = full.output_weight()
            self.head = nn.Parameter(weight.detach().clone() if is_first else weight.detach())
        self.register_buffer("rope_cos", full.rope_cos, persistent=False)
        self.register_buffer("rope_sin", full.rope_sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        for layer in self.layers:
            h = layer(h, self.rope_cos, self.rope_sin)
        if self.norm is None:
            return h
        return torch.matmul(self.norm(h), self.head.t())


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(lp.PRESETS), default="llama-100m")
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    p.add_argument("--batch", type=int, default=4, help="global rows per step (every rank reads all)")
    p.add_argument("--microbatches", type=int, default=4, help="training.grad_accum")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=22)
    p.add_argument("--warmup", type=int, default=1, help="schedule.warmup_steps")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--init-std", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--head-factor", type=float, default=6.0,
                   help="the head's FLOPs per hidden x vocab in the cut: 6 (meshwork-train with "
                        "training.loss_gradient=stored, as here), 8 (recomputed)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=int, default=600, help="seconds, every collective")
    p.add_argument("--jsonl", type=Path, default=None, help="rank 0: one JSON object per step")
    args = p.parse_args(argv)
    args.repeat_kv, args.init_from = False, None
    if args.batch % args.microbatches:
        p.error(f"--microbatches {args.microbatches} must divide --batch {args.batch}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=args.timeout))
    config = lp.PRESETS[args.preset]
    full = lp.build_model(config, args, torch.device("cpu"))  # every rank builds all, as Meshwork does
    first = flop_balanced_cut(config, args.seq, world, args.head_factor)
    is_first, is_last = rank == 0, rank == world - 1
    stage_module = Stage(full, first[rank], first[rank + 1], is_first, is_last)
    del full
    tied = config.tie_word_embeddings and world > 1
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    kind = SCHEDULES[args.schedule]
    loss_fn = lp.causal_lm_loss
    schedule = kind(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    params = list(stage_module.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    source = lp.SyntheticTokenSource(args.seq, config.vocab_size, args.seed)
    plan = lp.Schedule(args.steps, args.warmup)
    table = stage_module.embed_tokens.weight if is_first else stage_module.head if is_last else None
    if rank == 0:
        print(f"pipeline peer: torch {torch.__version__} {args.schedule} ({kind.__name__}), pp {world}, "
              f"{args.microbatches} micro-batches of {args.batch // args.microbatches} rows, seq {args.seq}, "
              f"stages of layers {' '.join(f'[{first[s]},{first[s + 1]})' for s in range(world))}"
              f"{', tied table summed over the first and last stage' if tied else ''}", flush=True)
    # The two ranks that hold the table (all of the world at pp 2); every rank makes the group.
    pair = dist.new_group([0, world - 1]) if tied and world > 2 else None
    out = open(args.jsonl, "a") if rank == 0 and args.jsonl else None
    for step in range(args.steps):
        t0 = time.perf_counter()
        lr = lp.learning_rate(plan, args.lr, step)
        for g in optimizer.param_groups:
            g["lr"] = lr
        optimizer.zero_grad(set_to_none=False)
        inputs, targets = source.rows(step, 0, args.batch)
        losses: list[torch.Tensor] = []
        if is_first:
            schedule.step(inputs)
        elif is_last:
            schedule.step(target=targets, losses=losses)
        else:
            schedule.step()
        # The tied table's two copies take the sum of their gradients (both ranks hold it).
        squares = torch.zeros(2, dtype=torch.float64)
        if tied and (is_first or is_last):
            if table.grad is None:
                table.grad = torch.zeros_like(table)
            dist.all_reduce(table.grad, group=pair)
        # The global norm: every stage's squares, the table's once (on the first stage).
        for p in params:
            if p.grad is not None and not (tied and is_last and p is table):
                squares[0] += p.grad.double().pow(2).sum()
        if is_last:
            squares[1] = float(torch.stack([l.detach() for l in losses]).mean())
        dist.all_reduce(squares)
        norm = math.sqrt(float(squares[0]))
        limit = args.grad_clip if args.grad_clip > 0 else math.inf
        if norm > limit:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(limit / (norm + 1e-6))
        optimizer.step()
        seconds = time.perf_counter() - t0
        loss = float(squares[1])
        if not math.isfinite(loss):
            sys.exit(f"pipeline_peer: training diverged: loss is {loss} at step {step + 1}")
        if out:
            out.write(json.dumps({"step": step + 1, "loss": loss, "lr": lr, "grad_norm": norm,
                                  "step_seconds": seconds}) + "\n")
            out.flush()
        if rank == 0:
            print(f"step {step + 1}/{args.steps} | loss {loss:.4f} | grad_norm {norm:.3f} | {seconds:.3f} s",
                  flush=True)
    if rank == 0:
        print(f"done: {args.steps} steps | final loss {loss:.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
