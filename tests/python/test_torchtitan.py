"""torchtitan 0.3.0 (PyPI) trains its llama3 debug model on neuron under torchrun: FSDP2 on 2
ranks compiled (torch.compile of each block and of the loss, flex attention), and FSDP + tensor
parallel on a 2 x 2 mesh in eager mode; the loss must fall. torchtitan's own command line,
unchanged but for two flags:
- `--parallelism.spmd-backend partial_dtensor`: torchtitan's default ("spmd_types") hands
  fully_shard annotations that only PyTorch nightly's FSDP2 reads (torch 2.13 raises "all
  parameters must be DTensors on the full SPMD mesh" on any device);
- assets: torchtitan's test tokenizer and c4_test data live in its source tree, not in the wheel;
  the test builds equivalents (a byte-level BPE tokenizer trained on examples/data/tiny_tales.txt
  and that text as a JSON-lines dataset).
torchtitan imports triton unconditionally (its MoE expert-parallel kernels): scripts/setup.sh
installs triton into .venv/torchtitan-site, put on PYTHONPATH for these runs only (Inductor in
the rest of the suite never sees triton)."""
import json
import re
from pathlib import Path

import pytest
from dist_util import REPO, assert_ok, run_torchrun

SITE = REPO / ".venv" / "torchtitan-site"
TEXT = REPO / "examples" / "data" / "tiny_tales.txt"

pytest.importorskip("torchtitan", reason="scripts/setup.sh installs torchtitan==0.3.0")
if not (SITE / "triton").is_dir():
    pytest.skip("scripts/setup.sh installs triton into .venv/torchtitan-site",
                allow_module_level=True)


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("torchtitan_assets")
    stories = [s.strip() for s in TEXT.read_text().split("\n\n") if s.strip()]
    (root / "c4_test").mkdir()
    (root / "c4_test" / "data.json").write_text(
        "".join(json.dumps({"text": s}) + "\n" for s in stories))
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(stories, trainers.BpeTrainer(
        vocab_size=512, special_tokens=[bos, eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (root / "tokenizer").mkdir()
    tok.save(str(root / "tokenizer" / "tokenizer.json"))
    (root / "tokenizer" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": bos, "eos_token": eos}))
    return root


def train(assets: Path, tmp_path: Path, nproc: int, *flags: str) -> list[float]:
    results = run_torchrun(
        "--module", nproc, "torchtitan.train", "--module", "llama3",
        "--config", "llama3_debugmodel",
        "--hf-assets-path", str(assets / "tokenizer"),
        "--dataloader.dataset-path", str(assets / "c4_test"),
        "--dump-folder", str(tmp_path),
        "--training.seq-len", "256", "--training.local-batch-size", "2",
        "--training.steps", "6", "--checkpoint.no-enable", "--validator.no-enable",
        "--metrics.log-freq", "1", "--parallelism.spmd-backend", "partial_dtensor", *flags,
        timeout=420, env={"PYTHONPATH": str(SITE)})
    assert_ok(results)
    log = results[0].out + results[0].err
    # every rank logs the global loss: one value per step
    steps = {int(step): float(loss) for step, loss in
             re.findall(r"step:\s+(\d+)\s+\S*loss:\s+\S*?([0-9]+\.[0-9]+)", log)}
    assert sorted(steps) == list(range(1, 7)), log[-4000:]
    return [steps[i] for i in range(1, 7)]


def test_fsdp2_compiled_two_ranks(assets, tmp_path):
    losses = train(assets, tmp_path, 2, "--compile.enable")
    assert losses[-1] < losses[0] - 1.5, losses


def test_fsdp_and_tensor_parallel_four_ranks(assets, tmp_path):
    losses = train(assets, tmp_path, 4, "--parallelism.tensor-parallel-degree", "2")
    assert losses[-1] < losses[0] - 1.5, losses
