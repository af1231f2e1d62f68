"""The main job (`make demo`): train a small character-level GPT on "neuron", then sample from it.

An ordinary PyTorch training script: change --device to "cuda" or "cpu" and it runs there too.
The model lives in examples/gpt.py, the text in examples/data/tiny_tales.txt. It is not a
benchmark harness (see benchmarks/); --compare-cpu only adds a same-run CPU reference.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
from gpt import GPT, CharTokenizer, GPTConfig, get_batch, load_text


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="neuron", help='"neuron" (default), "cpu", "cuda", ...')
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=6e-3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--log-every", type=int, default=10, help="steps between loss read-backs")
    p.add_argument("--prompt", default="One morning the ")
    p.add_argument("--sample-chars", type=int, default=120)
    p.add_argument("--temperature", type=float, default=0.6, help="0 samples greedily")
    p.add_argument("--compare-cpu", action="store_true",
                   help="also train on the CPU from the same weights and batches; compare")
    return p.parse_args(argv)


class ProgressBar:
    """One self-overwriting line on a terminal; a plain line every ~10% otherwise (logs, CI)."""

    def __init__(self, total: int, width: int = 24):
        self.total, self.width = total, width
        self.tty = sys.stdout.isatty()
        self.next_plain = 0

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        done = int(self.width * step / self.total)
        bar = "#" * done + "." * (self.width - done)
        line = f"[{bar}] step {step:>5}/{self.total}  loss {loss:7.4f}  {tokens_per_s:>9,.0f} tok/s"
        if self.tty:
            print("\r" + line, end="", flush=True)
        elif step >= self.next_plain or step == self.total:
            print(line, flush=True)
            interval = max(1, self.total // 10)
            self.next_plain = (step // interval + 1) * interval

    def close(self) -> None:
        if self.tty:
            print()


def device_module(device: torch.device):
    """torch.neuron / torch.cuda / torch.cpu: the module with synchronize() and memory stats."""
    return torch.get_device_module(device)


def synchronize(device: torch.device) -> None:
    device_module(device).synchronize()


def lr_at(step: int, total: int, base: float) -> float:
    """Linear warm-up over 20 steps, then cosine decay to 10% of the base rate."""
    warm = min(1.0, (step + 1) / 20)
    return base * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / total)))


@torch.no_grad()
def eval_loss(model: GPT, batches, device: torch.device) -> float:
    model.eval()
    total = sum(model(x.to(device), y.to(device))[1] for x, y in batches)
    model.train()
    return (total / len(batches)).item()


def train(args, device: torch.device, init_state: dict, cfg: GPTConfig, train_data, val_batches):
    """Trains from init_state on device; returns (model, dict of losses, timings)."""
    model = GPT(cfg)
    model.load_state_dict(init_state)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    batch_gen = torch.Generator().manual_seed(args.seed)
    val_before = eval_loss(model, val_batches, device)

    bar, tokens_per_step = ProgressBar(args.steps), args.batch_size * args.seq_len
    first_loss = last_loss = float("nan")
    synchronize(device)
    t_start = t_mark = time.perf_counter()
    mark_step = 0
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        x, y = get_batch(train_data, args.batch_size, args.seq_len, batch_gen)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # NOTE: .item() is a sync point; reading the loss only every few steps lets the Python
        # loop run ahead of the device, as on a GPU.
        if step == 0 or (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            last_loss = loss.item()
            first_loss = last_loss if step == 0 else first_loss
            now = time.perf_counter()
            rate = (step + 1 - mark_step) * tokens_per_step / max(now - t_mark, 1e-9)
            bar.update(step + 1, last_loss, rate)
            t_mark, mark_step = now, step + 1
    synchronize(device)
    seconds = time.perf_counter() - t_start
    bar.close()
    losses = {"first": first_loss, "last": last_loss, "val_before": val_before,
              "val_after": eval_loss(model, val_batches, device)}
    return model, losses, seconds


def peak_memory_text(device: torch.device) -> str:
    mod = device_module(device)
    if not hasattr(mod, "max_memory_allocated"):
        return "n/a on " + device.type
    return f"{mod.max_memory_allocated(device) / 2**20:.1f} MiB"


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)

    text = load_text()
    tok = CharTokenizer(text)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    val_gen = torch.Generator().manual_seed(args.seed + 1)
    val_batches = [get_batch(val_data, args.batch_size, args.seq_len, val_gen) for _ in range(4)]

    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=args.seq_len, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd, dropout=args.dropout)
    init_state = GPT(cfg).state_dict()
    mod = device_module(device)
    name = mod.get_device_name(device) if hasattr(mod, "get_device_name") else device.type
    print(f"device {device} ({name}) | {sum(v.numel() for v in init_state.values()):,} params "
          f"| {len(text):,} chars, vocab {tok.vocab_size} | batch {args.batch_size} x "
          f"seq {args.seq_len} | {args.steps} steps")
    if hasattr(mod, "reset_peak_memory_stats"):
        mod.reset_peak_memory_stats(device)

    model, losses, seconds = train(args, device, init_state, cfg, train_data, val_batches)
    tokens = args.steps * args.batch_size * args.seq_len
    print(f"train loss {losses['first']:.4f} -> {losses['last']:.4f} | val loss "
          f"{losses['val_before']:.4f} -> {losses['val_after']:.4f} | {seconds:.1f} s, "
          f"{tokens / seconds:,.0f} tok/s | peak memory {peak_memory_text(device)}")

    if args.compare_cpu and device.type != "cpu":
        print("reference run on cpu, same weights and batches:")
        _, cpu_losses, cpu_seconds = train(args, torch.device("cpu"), init_state, cfg,
                                           train_data, val_batches)
        print(f"cpu train loss {cpu_losses['first']:.4f} -> {cpu_losses['last']:.4f} | "
              f"{device.type} / cpu: final loss diff "
              f"{abs(losses['last'] - cpu_losses['last']):.2e}, "
              f"throughput {cpu_seconds / seconds:.2f}x")

    model.eval()
    prompt = torch.tensor([tok.encode(args.prompt)], dtype=torch.long, device=device)
    out = model.generate(prompt, args.sample_chars, temperature=args.temperature, top_k=10)
    how = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, top-k 10"
    print(f"sample ({how}):\n{tok.decode(out[0].tolist())}")


if __name__ == "__main__":
    main()
