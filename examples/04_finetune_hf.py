"""Fine-tune a Hugging Face causal LM on "neuron": bf16 autocast, activation checkpointing, AdamW.

An ordinary transformers training loop; only the device string says "neuron". The model is a
tiny Llama (or GPT-2) built from a config with random weights (nothing is downloaded), the
tokenizer is byte-level and built here, the text is examples/data/tiny_tales.txt. The script
trains, prints loss and tokens/s, reports peak device memory, saves a checkpoint with
save_pretrained, reloads it with from_pretrained and checks it gives the same logits, then
generates a greedy sample. Run with --device cpu (or cuda) for the same job elsewhere.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import transformers
from transformers.utils import logging as hf_logging

DATA_FILE = Path(__file__).resolve().parent / "data" / "tiny_tales.txt"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="neuron", help='"neuron" (default), "cpu", "cuda", ...')
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--model", choices=("llama", "gpt2"), default="llama")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--log-every", type=int, default=10, help="steps between loss read-backs")
    p.add_argument("--no-autocast", action="store_true", help="train in float32")
    p.add_argument("--no-checkpointing", action="store_true",
                   help="keep activations instead of recomputing them in backward")
    p.add_argument("--checkpoint-dir", default=None,
                   help="where save_pretrained writes (default: a temporary folder)")
    p.add_argument("--prompt", default="One morning the ")
    p.add_argument("--sample-tokens", type=int, default=80)
    return p.parse_args(argv)


class ByteTokenizer:
    """UTF-8 bytes as token ids 0-255, plus <pad>=256, <bos>=257, <eos>=258."""

    pad_id, bos_id, eos_id = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str, bos: bool = False) -> list[int]:
        return ([self.bos_id] if bos else []) + list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


def build_model(args, tok: ByteTokenizer) -> transformers.PreTrainedModel:
    special = {"pad_token_id": tok.pad_id, "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id}
    if args.model == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=args.seq_len,
                                      n_embd=args.hidden, n_layer=args.layers, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **special)
        return transformers.GPT2LMHeadModel(cfg)
    cfg = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=args.hidden,
                                   intermediate_size=args.hidden * 8 // 3 // 8 * 8,
                                   num_hidden_layers=args.layers, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=args.seq_len,
                                   tie_word_embeddings=True, **special)
    return transformers.LlamaForCausalLM(cfg)


def get_batch(data: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    """Random windows of the byte stream (CPU, from gen: every device sees the same batches)."""
    starts = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=gen)
    return torch.stack([data[s:s + seq_len] for s in starts.tolist()])


def lr_at(step: int, total: int, base: float) -> float:
    """Linear warm-up over 10 steps, then cosine decay to 10% of the base rate."""
    warm = min(1.0, (step + 1) / 10)
    return base * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / max(total, 1))))


def main(argv=None) -> int:
    args = parse_args(argv)
    hf_logging.set_verbosity_error()
    device = torch.device(args.device)
    mod = torch.get_device_module(device)
    torch.manual_seed(args.seed)
    tok = ByteTokenizer()
    text = DATA_FILE.read_text(encoding="utf-8")
    data = torch.tensor(tok.encode(text), dtype=torch.long)

    model = build_model(args, tok).to(device)
    model.config.use_cache = False  # training: no KV cache (checkpointing recomputes layers)
    if not args.no_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    amp_dtype = None if args.no_autocast else torch.bfloat16
    n_params = sum(p.numel() for p in model.parameters())
    name = mod.get_device_name(device) if hasattr(mod, "get_device_name") else device.type
    print(f"device {device} ({name}) | {args.model} {n_params:,} params, byte vocab "
          f"{tok.vocab_size} | batch {args.batch_size} x seq {args.seq_len} | {args.steps} steps"
          f" | {'bf16 autocast' if amp_dtype else 'float32'}"
          f"{'' if args.no_checkpointing else ', activation checkpointing'}", flush=True)
    if hasattr(mod, "reset_peak_memory_stats"):
        mod.reset_peak_memory_stats(device)

    gen = torch.Generator().manual_seed(args.seed)
    tokens_per_step = args.batch_size * args.seq_len
    losses: list[tuple[int, float]] = []
    mod.synchronize()
    t0 = t_mark = time.perf_counter()
    mark = 0
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        batch = get_batch(data, args.batch_size, args.seq_len, gen).to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        # NOTE: .item() waits for the device; reading the loss every few steps lets Python run
        # ahead, as on a GPU.
        if step == 0 or (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            value = loss.item()
            losses.append((step + 1, value))
            now = time.perf_counter()
            rate = (step + 1 - mark) * tokens_per_step / max(now - t_mark, 1e-9)
            print(f"step {step + 1:>5}/{args.steps}  loss {value:7.4f}  {rate:>9,.0f} tok/s",
                  flush=True)
            t_mark, mark = now, step + 1
    mod.synchronize()
    seconds = time.perf_counter() - t0
    peak = (f"{mod.max_memory_allocated(device) / 2**20:.1f} MiB"
            if hasattr(mod, "max_memory_allocated") else f"n/a on {device.type}")
    first, last = losses[0][1], losses[-1][1]
    print(f"loss {first:.4f} -> {last:.4f} | {seconds:.1f} s, "
          f"{args.steps * tokens_per_step / seconds:,.0f} tok/s | peak memory {peak}")

    # Save, reload, check the reloaded model computes the same thing.
    model.eval()
    probe = get_batch(data, 2, args.seq_len, torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        logits = model(input_ids=probe).logits
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(args.checkpoint_dir or tmp)
        model.save_pretrained(ckpt)
        size = sum(f.stat().st_size for f in ckpt.iterdir()) / 2**20
        reloaded = type(model).from_pretrained(ckpt).to(device).eval()
    with torch.no_grad():
        same = torch.equal(reloaded(input_ids=probe).logits.cpu(), logits.cpu())
    print(f"checkpoint: save_pretrained {size:.2f} MiB -> from_pretrained: "
          f"{'same logits' if same else 'LOGITS DIFFER'}")
    if not same:
        return 1

    reloaded.config.use_cache = True
    prompt = torch.tensor([tok.encode(args.prompt, bos=True)], device=device)
    with torch.no_grad():
        out = reloaded.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                max_new_tokens=args.sample_tokens, pad_token_id=tok.pad_id)
    print(f"sample (greedy, reloaded model):\n{tok.decode(out[0].tolist())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
