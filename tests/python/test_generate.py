# Greedy generate() (Hugging Face transformers, tiny random models, KV cache on by default) gives
# the same tokens on neuron as on CPU PyTorch, also for a left-padded batch with attention_mask,
# and without synchronous fallbacks (generate() itself reads a flag back each step via .item()).
import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny configs only: never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
import transformers
from transformers.utils import logging as hf_logging

import openneuron

hf_logging.set_verbosity_error()

VOCAB, NEW_TOKENS, PAD = 128, 14, 0


def _model(name: str) -> torch.nn.Module:
    # initializer_range 0.2 (not 0.02) spreads the logits, so greedy argmax never hinges on a
    # near-tie that float32 rounding-order differences could flip.
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2,
                                      n_head=4, initializer_range=0.2, pad_token_id=PAD,
                                      bos_token_id=1, eos_token_id=2)
        return transformers.GPT2LMHeadModel(cfg).eval()
    kw = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
              "initializer_range": 0.2, "pad_token_id": PAD, "bos_token_id": 1, "eos_token_id": 2}
    if name == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    if name == "mixtral":
        cfg = transformers.MixtralConfig(**kw, num_local_experts=4, num_experts_per_tok=2)
        return transformers.MixtralForCausalLM(cfg).eval()
    raise KeyError(name)


def _generate(model, device, **inputs) -> torch.Tensor:
    inputs = {k: v.to(device) for k, v in inputs.items()}
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, pad_token_id=PAD)
    return out.cpu()


def _fallback_and_sync_ops() -> set[tuple[str, str]]:
    return {(r.op, r.path) for r in openneuron.ops_report(print_table=False)
            if r.path in ("fallback", "sync")}


@pytest.mark.parametrize("name", ["gpt2", "llama", "mixtral"])
def test_greedy_generate_matches_cpu(device, name):
    cpu_model = _model(name)
    neuron_model = copy.deepcopy(cpu_model).to(device)
    prompt = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    ref = _generate(cpu_model, "cpu", input_ids=prompt)
    openneuron.ops_report(print_table=False, reset=True)
    got = _generate(neuron_model, device, input_ids=prompt)
    assert ref.shape == (2, 6 + NEW_TOKENS)
    assert torch.equal(got, ref), f"{name}: neuron {got.tolist()} vs cpu {ref.tolist()}"
    assert len(set(ref[:, 6:].flatten().tolist())) > 1  # the check is not vacuous
    assert _fallback_and_sync_ops() == set()


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generate_left_padded_batch_matches_cpu(device, name):
    cpu_model = _model(name)
    neuron_model = copy.deepcopy(cpu_model).to(device)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB, (2, 8), generator=g)
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = PAD, 0  # the second prompt is 3 tokens shorter, padded on the left
    ref = _generate(cpu_model, "cpu", input_ids=ids, attention_mask=mask)
    openneuron.ops_report(print_table=False, reset=True)
    got = _generate(neuron_model, device, input_ids=ids, attention_mask=mask)
    assert torch.equal(got, ref), f"{name}: neuron {got.tolist()} vs cpu {ref.tolist()}"
    assert _fallback_and_sync_ops() == set()
    # Padding really is masked: the short prompt alone continues the same way.
    alone = _generate(neuron_model, device, input_ids=ids[1:, 3:])
    assert torch.equal(alone[0, 5:], got[1, 8:]), (alone.tolist(), got.tolist())


def test_greedy_generate_static_cache_matches_cpu(device):
    # A static (compileable) KV cache makes transformers compile the decoding step with
    # torch.compile(backend="neuron") (openneuron/_dynamo.py); tokens must still be CPU's.
    cpu_model = _model("llama")
    neuron_model = copy.deepcopy(cpu_model).to(device)
    prompt = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    ref = _generate(cpu_model, "cpu", input_ids=prompt)
    openneuron.ops_report(print_table=False, reset=True)
    inputs = {"input_ids": prompt.to(device)}
    with torch.no_grad():
        got = neuron_model.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS,
                                    min_new_tokens=NEW_TOKENS, pad_token_id=PAD,
                                    cache_implementation="static").cpu()
    assert torch.equal(got, ref), f"neuron {got.tolist()} vs cpu {ref.tolist()}"
    assert hasattr(neuron_model, "_compiled_call")  # the compiled decoding step really ran
    assert _fallback_and_sync_ops() == set()


def test_sampled_generate_is_reproducible_per_seed(device):
    # do_sample draws from the neuron generator (top-k/top-p filtering, multinomial): not the
    # CPU's stream (as on CUDA), but the same seed gives the same tokens, a new seed new ones.
    model = _model("llama").to(device)
    prompt = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))

    def sample(seed):
        torch.manual_seed(seed)
        with torch.no_grad():
            return model.generate(prompt.to(device), do_sample=True, top_k=20, top_p=0.95,
                                  temperature=1.5, max_new_tokens=NEW_TOKENS,
                                  min_new_tokens=NEW_TOKENS, pad_token_id=PAD).cpu()

    openneuron.ops_report(print_table=False, reset=True)
    a, b, c = sample(11), sample(11), sample(12)
    assert _fallback_and_sync_ops() == set()
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(a[:, :6], prompt) and int(a.max()) < VOCAB
