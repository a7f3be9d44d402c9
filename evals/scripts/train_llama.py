"""A small Llama-style decoder trained twice from the same start on the same tokens: once with
torch's ops, once with ours (RMSNorm and its backward, the causal attention forward with torch's
attention backward kernel, the fused cross-entropy), to show that a training run through
our kernels follows torch's (issue 47): the loss curves overlaid, tokens/s of each, the largest
loss difference.

    python -m evals.scripts.train_llama --out DIR [--steps 300] [--ops torch llmcompile]

The tokens come from a fixed random Markov chain (each token has a few likely successors), so
the loss falls well below log(vocab) within a few hundred steps and both runs see the same
batches. Writes DIR/train-llama.json (every step's loss, tokens/s), DIR/train-llama.md and
DIR/train-llama.png.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 8192
    dim: int = 512
    layers: int = 4
    heads: int = 8  # head dim 64: our d64 causal attention
    ffn: int = 1408
    seq: int = 1024
    batch: int = 8
    steps: int = 300
    lr: float = 1e-3
    successors: int = 4  # likely next tokens of each token in the Markov chain
    eps: float = 1e-6
    seed: int = 0
    warmup: int = 10  # steps left out of tokens/s (compiles, allocator)


class TorchOps:
    name = "torch"

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, eps)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


class OurOps(TorchOps):
    name = "llmcompile"

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise SystemExit("--ops llmcompile runs our kernels: it needs a CUDA GPU (torch's ops run anywhere)")
        from llmcompile import kernels

        self.k = kernels

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return self.k.rmsnorm(x, w, eps=eps)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # (b, h, s, d) as SDPA's; q and k (RoPE's outputs) are dense, v, a transposed view of the
        # projection, is read where it lies (the kernel's strided-v call), as SDPA reads it
        fn = self.k.attention_causal_d64 if q.shape[-1] == 64 else self.k.attention_causal
        return fn(q, k, v)[0]

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.k.cross_entropy_loss(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


class OurOpsTorchAttention(OurOps):
    """Ours less the attention (torch's SDPA forward and backward): which of our ops a difference in
    tokens/s comes from."""

    name = "llmcompile-no-attention"

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return TorchOps.attention(self, q, k, v)


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding over (B, H, S, D), in torch for both runs."""
    s, d = x.shape[-2], x.shape[-1]
    inv = 10000.0 ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = torch.arange(s, device=x.device, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.norm1, self.norm2 = nn.Parameter(torch.ones(cfg.dim)), nn.Parameter(torch.ones(cfg.dim))
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.up = nn.Linear(cfg.dim, 2 * cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, ops: TorchOps) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.cfg.heads
        q, k, v = self.qkv(ops.rmsnorm(x, self.norm1, self.cfg.eps)).view(b, s, 3, h, -1).permute(2, 0, 3, 1, 4)
        a = ops.attention(_rope(q), _rope(k), v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.up(ops.rmsnorm(x, self.norm2, self.cfg.eps)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Decoder(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.Parameter(torch.ones(cfg.dim))
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, target: torch.Tensor, ops: TorchOps) -> torch.Tensor:
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, ops)
        return ops.loss(self.head(ops.rmsnorm(x, self.norm, self.cfg.eps)), target)


def markov_tokens(cfg: Config, device: str) -> torch.Tensor:
    """(steps, batch, seq + 1) tokens of a fixed random chain: each token is followed by one of
    its `successors` likely tokens, with probabilities 1/2, 1/4, ... (so the floor of the loss is
    about 1.3 nats, far under log(vocab))."""
    g = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    succ = torch.randint(0, cfg.vocab, (cfg.vocab, cfg.successors), generator=g, device=device)
    probs = torch.tensor([2.0**-i for i in range(1, cfg.successors + 1)], device=device)
    n = cfg.steps * cfg.batch
    cur = torch.randint(0, cfg.vocab, (n,), generator=g, device=device)
    out = torch.empty(n, cfg.seq + 1, dtype=torch.int64, device=device)
    for t in range(cfg.seq + 1):
        out[:, t] = cur
        pick = torch.multinomial(probs.expand(n, -1), 1, generator=g).squeeze(1)
        cur = succ[cur, pick]
    return out.view(cfg.steps, cfg.batch, cfg.seq + 1)


def train(cfg: Config, ops: list[TorchOps], tokens: torch.Tensor, device: str) -> dict[str, dict]:
    """Each ops' model trained from the same start on the same batches, in lockstep: step i of
    each before step i + 1 of any, the order turned each step, each step timed alone (it ends in
    `float(loss)`, as a training loop's logging does). Runs one after another moved tokens/s by
    up to 25% with their order on an H200 machine, ours and torch's alike."""
    runs = {}
    for o in ops:
        torch.manual_seed(cfg.seed)
        model = Decoder(cfg).to(device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
        runs[o.name] = (o, model, torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0), [], [])
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    warm = cfg.warmup if cfg.steps > cfg.warmup else 0
    for step in range(cfg.steps):
        batch = tokens[step]
        order = list(runs.values())
        for o, model, opt, losses, seconds in order[step % len(order) :] + order[: step % len(order)]:
            sync()
            start = time.perf_counter()
            loss = model(batch[:, :-1], batch[:, 1:], o)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            sync()
            seconds.append(time.perf_counter() - start)
    tokens_per_step = cfg.batch * cfg.seq
    return {
        name: {"loss": losses, "tokens_per_s": (cfg.steps - warm) * tokens_per_step / sum(seconds[warm:])}
        for name, (_, _, _, losses, seconds) in runs.items()
    }


def write(out: Path, cfg: Config, runs: dict[str, dict], device_name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"config": asdict(cfg), "device": device_name, "runs": runs}
    lines = [f"# Llama-style decoder, {cfg.steps} steps ({device_name})", ""]
    lines += ["| ops | first loss | last loss | tokens/s |", "|---|---|---|---|"]
    for name, r in runs.items():
        lines.append(f"| {name} | {r['loss'][0]:.4f} | {r['loss'][-1]:.4f} | {r['tokens_per_s']:.0f} |")
    if {"torch", "llmcompile"} <= runs.keys():
        diff = [abs(a - b) for a, b in zip(runs["torch"]["loss"], runs["llmcompile"]["loss"])]
        result["max_abs_loss_diff"] = max(diff)
        result["max_abs_loss_diff_last_50"] = max(diff[-50:])
        lines += [
            "",
            f"Largest |loss difference| over the run: {max(diff):.4f} (last 50 steps: {max(diff[-50:]):.4f}).",
        ]
        theirs = torch.tensor(runs["torch"]["loss"])
        if torch.equal(theirs.bfloat16().float(), theirs):
            # torch's loss of bf16 logits comes back in bf16, ours in fp32: compared in bf16, the
            # difference is what the two runs' training made, not the rounding of torch's value
            ours = torch.tensor(runs["llmcompile"]["loss"]).bfloat16().float()
            apart = (theirs - ours).abs()
            result["bf16_steps_apart"] = int((apart > 0).sum())
            result["max_abs_loss_diff_bf16"] = float(apart.max())
            lines.append(
                f"torch's loss is a bf16 value (its logits' dtype), ours fp32; ours rounded to bf16 equals "
                f"torch's at {len(apart) - result['bf16_steps_apart']} of {len(apart)} steps, the largest "
                f"difference {result['max_abs_loss_diff_bf16']:.4f} (one bf16 step at that loss is "
                f"{2.0 ** (math.floor(math.log2(max(float(theirs[apart.argmax()]), 1e-30))) - 7):.4f})."
            )
    (out / "train-llama.json").write_text(json.dumps(result))
    (out / "train-llama.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from llmcompile.bench.plots import save_png

    both = {"torch", "llmcompile"} <= runs.keys()
    fig, axes = plt.subplots(2 if both else 1, 1, figsize=(7, 5 if both else 4), sharex=True, squeeze=False)
    ax = axes[0][0]
    for name, r in runs.items():
        ax.plot(r["loss"], label=f"{name} ({r['tokens_per_s']:.0f} tokens/s)", linewidth=1)
    ax.axhline(math.log(cfg.vocab), color="grey", linestyle=":", linewidth=0.8)
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(f"{cfg.layers} layers x {cfg.dim}, seq {cfg.seq}, batch {cfg.batch}")
    ax.legend()
    if both:  # the curves lie on each other: their difference, step by step
        diff = [b - a for a, b in zip(runs["torch"]["loss"], runs["llmcompile"]["loss"])]
        axes[1][0].plot(diff, linewidth=0.8, color="black")
        axes[1][0].axhline(0.0, color="grey", linewidth=0.5)
        axes[1][0].set_ylabel("ours - torch's")
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    save_png(fig, out / "train-llama.png", dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=Config.steps)
    ops = {"torch": TorchOps, "llmcompile": OurOps, "llmcompile-no-attention": OurOpsTorchAttention}
    p.add_argument("--ops", nargs="+", default=["torch", "llmcompile"], choices=list(ops))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a model and data small enough for a CPU (a smoke test)")
    args = p.parse_args(argv)
    cfg = Config(steps=args.steps)
    if args.tiny:
        cfg = Config(vocab=256, dim=64, layers=2, heads=2, ffn=128, seq=32, batch=2, steps=args.steps, warmup=1)
    made = [ops[name]() for name in args.ops]  # (ours refuses here, before any training, without a GPU)
    tokens = markov_tokens(cfg, args.device)
    runs = train(cfg, made, tokens, args.device)
    for name, r in runs.items():
        print(f"{name}: loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f}, {r['tokens_per_s']:.0f} tokens/s", flush=True)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    write(Path(args.out), cfg, runs, name)
    print(f"wrote {args.out}/train-llama.{{json,md,png}}")


if __name__ == "__main__":
    main()
