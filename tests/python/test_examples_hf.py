# examples/04_finetune_hf.py (Hugging Face Llama fine-tune on neuron: bf16 autocast, activation
# checkpointing, AdamW, save_pretrained/from_pretrained, greedy generate) runs end to end in a
# fresh process with few steps, and its loss goes down.
import os
import re
import subprocess
import sys

from conftest import REPO


def test_finetune_hf_example_runs_and_loss_decreases(tmp_path):
    cmd = [sys.executable, str(REPO / "examples" / "04_finetune_hf.py"), "--steps", "25",
           "--batch-size", "4", "--seq-len", "32", "--log-every", "5", "--sample-tokens", "8",
           "--checkpoint-dir", str(tmp_path / "ckpt")]
    proc = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", OPENNEURON_FALLBACK="error"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "device neuron" in out and "bf16 autocast, activation checkpointing" in out, out
    m = re.search(r"^loss (\d+\.\d+) -> (\d+\.\d+) \|.* ([\d,]+) tok/s \| peak memory ([\d.]+) MiB",
                  out, re.MULTILINE)
    assert m, out
    first, last = float(m.group(1)), float(m.group(2))
    assert last < first - 0.5, out  # 25 steps take a byte-level LM from ~5.6 well below 5
    assert float(m.group(4)) > 0
    assert "from_pretrained: same logits" in out, out
    assert (tmp_path / "ckpt" / "config.json").exists()
    assert "sample (greedy, reloaded model):" in out, out
