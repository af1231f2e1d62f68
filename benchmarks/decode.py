"""Greedy decode speed of a small GPT-2 (Hugging Face transformers, 4 layers, 256 wide, KV cache)
on neuron against CPU eager, in the same process and run: tokens per second of `generate()`.

Decode is the per-op-cost benchmark that matters to users: every token is a few hundred tiny ops
and one device->host read (generate() checks its stopping criteria with .item()), so nothing
overlaps and host overhead per op is all that counts. Goal: at least 1.0x CPU eager in plain
eager mode. With --compiled, also the device with a static KV cache, whose decoding step
transformers compiles (torch.compile: Inductor on neuron; goal at least 2x CPU eager; the compile
happens in the warm-up call, not timed), twice: with the compile config transformers picks for
neuron (mode="default"), and with its CUDA default, mode="reduce-overhead" (the step captured in
a neuron graph and replayed). Not a test: nothing asserts on timing (`make bench-decode` runs it
with --compiled).
`--device cpu` compares CPU with itself: the ratio then shows the host's noise floor.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config built here: never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import transformers
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()

GOAL = 1.0  # neuron tokens/s over CPU tokens/s
COMPILED_GOAL = 2.0  # neuron compiled (static cache) over CPU eager


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=1024, n_positions=512, n_embd=256, n_layer=4,
                                  n_head=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.GPT2LMHeadModel(cfg).eval()


def tokens_per_second(model: torch.nn.Module, device: torch.device, prompt_len: int,
                      new_tokens: int, repeats: int, **generate_kwargs
                      ) -> tuple[float, torch.Tensor]:
    m = model.to(device)
    ids = torch.randint(3, 1024, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    mask = torch.ones_like(ids)

    def run() -> torch.Tensor:
        with torch.no_grad():
            # eos_token_id=None: always decode new_tokens tokens (a random model may emit eos).
            return m.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                              **generate_kwargs)

    out = run()  # warm-up: allocator, meta caches, lazy init
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - t0)
    return new_tokens / statistics.median(times), out.cpu()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="neuron", help="device to compare with CPU eager")
    ap.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    ap.add_argument("--tokens", type=int, default=120, help="new tokens per generate() call")
    ap.add_argument("--repeats", type=int, default=5, help="timed generate() calls (median)")
    ap.add_argument("--compiled", action="store_true",
                    help="also the device with a static cache (compiled decoding step)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    if args.device.startswith("neuron"):
        import openneuron  # noqa: F401  (registers the device)

    torch.set_num_threads(torch.get_num_threads())
    model = make_model()
    cpu_tps, cpu_out = tokens_per_second(model, torch.device("cpu"), args.prompt, args.tokens,
                                         args.repeats)
    dev_tps, dev_out = tokens_per_second(model, torch.device(args.device), args.prompt,
                                         args.tokens, args.repeats)
    ratio = dev_tps / cpu_tps
    same = torch.equal(cpu_out, dev_out)
    compiled = {}
    if args.compiled:
        for mode in ("default", "reduce-overhead"):
            t0 = time.perf_counter()
            config = transformers.CompileConfig(backend=torch.device(args.device).type,
                                                mode=mode, dynamic=False)
            tps, out = tokens_per_second(model, torch.device(args.device), args.prompt,
                                         args.tokens, args.repeats,
                                         cache_implementation="static", compile_config=config)
            compiled[mode] = {"tokens_per_s": tps, "ratio": tps / cpu_tps,
                              "same_tokens": torch.equal(cpu_out, out),
                              "total_s": time.perf_counter() - t0}
    print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"GPT-2 4x256 greedy generate(), prompt {args.prompt}, {args.tokens} new tokens, "
          f"median of {args.repeats}")
    print(f"{'device':<10}{'tokens/s':>12}")
    print(f"{'cpu':<10}{cpu_tps:>12.1f}")
    print(f"{args.device:<10}{dev_tps:>12.1f}")
    verdict = "meets" if ratio >= GOAL else "misses"
    print(f"ratio {args.device}/cpu: {ratio:.2f}x ({verdict} the goal of >= {GOAL:.1f}x); "
          f"same tokens as CPU: {same}")
    for mode, c in compiled.items():
        verdict = "meets" if c["ratio"] >= COMPILED_GOAL else "misses"
        print(f"{args.device} compiled (static cache, mode={mode!r}): {c['tokens_per_s']:.1f} "
              f"tokens/s, {c['ratio']:.2f}x CPU eager ({verdict} the goal of >= "
              f"{COMPILED_GOAL:.1f}x); same tokens as CPU: {c['same_tokens']}; "
              f"whole case incl. compile {c['total_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu_tokens_per_s": cpu_tps, "device_tokens_per_s": dev_tps,
                       "ratio": ratio, "goal": GOAL, "same_tokens": same,
                       "compiled": compiled or None}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
