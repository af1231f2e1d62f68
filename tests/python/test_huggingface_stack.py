# The Hugging Face training stack on "neuron" with no neuron-specific code in the script:
# `import torch_neuronx`, Trainer (fp32, bf16, torch_compile), accelerate (plain, bf16,
# save_state/load_state with the neuron RNG), from_pretrained(device_map=...), PEFT LoRA.
# Each run uses a tiny model built from a config and is compared with the same run on CPU.
# Trainer and Accelerator keep process-wide state (PartialState), so each run is a subprocess.
import json

import pytest
from conftest import run_python

_MODEL = """
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
data = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(1))
"""

_TRAINER = _MODEL + """
from transformers import Trainer, TrainingArguments
cfg._attn_implementation = ATTN
model = LlamaForCausalLM(cfg)
seen = []
model.model.layers[0].mlp.down_proj.register_forward_hook(
    lambda m, i, o: seen.append((str(i[0].device), str(o.dtype))))
class DS(torch.utils.data.Dataset):
    def __len__(self): return len(data)
    def __getitem__(self, i): return {"input_ids": data[i], "labels": data[i]}
args = TrainingArguments(output_dir=OUT, per_device_train_batch_size=8, max_steps=8,
                         learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no",
                         seed=0, use_cpu=USE_CPU, bf16=BF16, torch_compile=COMPILE)
tr = Trainer(model=model, args=args, train_dataset=DS())
tr.train()
print(json.dumps({
    "device": str(args.device), "backend": args.torch_compile_backend,
    "params": sorted({str(p.device) for p in model.parameters()}), "seen": sorted(set(seen)),
    "losses": [h["loss"] for h in tr.state.log_history if "loss" in h]}))
"""


def _run_json(code: str) -> dict:
    r = run_python(code, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _trainer(tmp_path, use_cpu: bool, bf16: bool = False, compile: bool = False,
             attn: str = "sdpa") -> dict:
    code = (_TRAINER.replace("OUT", repr(str(tmp_path))).replace("USE_CPU", str(use_cpu))
            .replace("BF16", str(bf16)).replace("COMPILE", str(compile))
            .replace("ATTN", repr(attn)))
    return _run_json(code)


def test_import_torch_neuronx_registers_once_and_hf_finds_it(run_py):
    r = run_py("""
        import torch
        assert not hasattr(torch, "neuron")
        import torch_neuronx, openneuron
        assert openneuron.is_registered() and torch_neuronx.__version__ == openneuron.__version__
        module = torch.neuron
        import importlib; importlib.reload(torch_neuronx); openneuron._register()
        assert torch.neuron is module and torch._C._get_privateuse1_backend_name() == "neuron"
        from transformers.utils import is_torch_neuron_available, is_torch_bf16_gpu_available
        from transformers.utils.import_utils import is_torch_neuroncore_available
        from accelerate.utils import is_neuron_available
        assert is_torch_neuron_available(check_device=True) and is_neuron_available(True)
        assert is_torch_bf16_gpu_available()
        assert not is_torch_neuroncore_available()  # the XLA path (torch_xla) stays off
        print("ok")
        """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


@pytest.fixture(scope="module")
def cpu_fp32(tmp_path_factory):
    return _trainer(tmp_path_factory.mktemp("cpu"), use_cpu=True)


def test_trainer_fp32_trains_on_neuron_like_cpu(tmp_path, cpu_fp32):
    got = _trainer(tmp_path, use_cpu=False)
    assert got["device"] == "neuron:0" and got["params"] == ["neuron:0"]
    assert got["seen"] == [["neuron:0", "torch.float32"]]
    assert cpu_fp32["device"] == "cpu" and cpu_fp32["params"] == ["cpu"]
    assert got["losses"][-1] < got["losses"][0]
    assert got["losses"] == pytest.approx(cpu_fp32["losses"], rel=1e-4)


def test_trainer_bf16_uses_neuron_autocast(tmp_path, cpu_fp32):
    got = _trainer(tmp_path, use_cpu=False, bf16=True)
    assert got["device"] == "neuron:0" and got["params"] == ["neuron:0"]
    assert got["seen"] == [["neuron:0", "torch.bfloat16"]]
    assert got["losses"][-1] < got["losses"][0]
    assert got["losses"] == pytest.approx(cpu_fp32["losses"], rel=2e-2)


def test_trainer_torch_compile_picks_neuron_backend(tmp_path, cpu_fp32):
    # default (SDPA) attention: the native SDPA op's results have the layouts its meta gives
    got = _trainer(tmp_path, use_cpu=False, compile=True)
    assert got["backend"] == "neuron" and got["params"] == ["neuron:0"]
    assert got["losses"] == pytest.approx(cpu_fp32["losses"], rel=1e-4)


_ACCELERATE = """
import json, sys, tempfile, torch
from accelerate import Accelerator
from accelerate.utils import set_seed
acc = Accelerator(mixed_precision=MP, cpu=USE_CPU)
set_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                            torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
X = torch.randn(64, 8); Y = X.sum(1, keepdim=True)
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16)
model, opt, dl = acc.prepare(model, opt, dl)
dtypes, devices, losses = set(), set(), []
model[0].register_forward_hook(lambda m, i, o: dtypes.add(str(o.dtype)))
for epoch in range(5):
    for x, y in dl:
        devices.add(str(x.device))
        with acc.autocast():
            loss = (model(x).float() - y).pow(2).mean()
        acc.backward(loss); opt.step(); opt.zero_grad()
        losses.append(loss.item())
d = tempfile.mkdtemp()
acc.save_state(d)
first = torch.rand(4, device=acc.device).tolist()
torch.rand(100, device=acc.device)
acc.load_state(d)
again = torch.rand(4, device=acc.device).tolist()
print(json.dumps({"device": str(acc.device), "dtypes": sorted(dtypes), "batches": sorted(devices),
                  "params": sorted({str(p.device) for p in model.parameters()}),
                  "losses": losses, "first": first, "again": again}))
"""


@pytest.mark.parametrize("mp", ["no", "bf16"])
def test_accelerate_loop_and_state_round_trip(mp):
    got = _run_json(_ACCELERATE.replace("MP", repr(mp)).replace("USE_CPU", "False"))
    assert got["device"] == "neuron"  # accelerate's default_device has no index; params: :0
    assert got["params"] == ["neuron:0"] and got["batches"] == ["neuron:0"]
    assert got["dtypes"] == ["torch.bfloat16" if mp == "bf16" else "torch.float32"]
    assert got["losses"][-1] < got["losses"][0] / 2
    assert got["again"] == got["first"]  # the neuron RNG state came back with load_state
    if mp == "no":  # dropout draws from each device's own generator: compare the loss trend
        ref = _run_json(_ACCELERATE.replace("MP", repr(mp)).replace("USE_CPU", "True"))
        assert ref["device"] == "cpu" and ref["params"] == ["cpu"]
        assert got["losses"][-1] == pytest.approx(ref["losses"][-1], rel=0.5)


def test_from_pretrained_device_map_and_peft_lora():
    code = _MODEL + """
import tempfile
from peft import LoraConfig, get_peft_model
d = tempfile.mkdtemp()
LlamaForCausalLM(cfg).save_pretrained(d)
out = {}
for name, dm in [("neuron", "neuron"), ("neuron:0", "neuron:0"), ("0", 0)]:
    m = LlamaForCausalLM.from_pretrained(d, device_map=dm)
    out[name] = sorted({str(p.device) for p in m.parameters()})
ref = LlamaForCausalLM.from_pretrained(d)
x = data[:8]
with torch.no_grad():
    out["logits_match"] = torch.allclose(m(input_ids=x.to("neuron")).logits.cpu(),
                                         ref(input_ids=x).logits, atol=1e-5)
def lora(device):
    torch.manual_seed(0)
    pm = get_peft_model(LlamaForCausalLM.from_pretrained(d, device_map=device),
                        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for step in range(6):
        b = data[8 * (step % 4): 8 * (step % 4) + 8].to(device)
        loss = pm(input_ids=b, labels=b).loss
        loss.backward(); opt.step(); opt.zero_grad()
        losses.append(loss.item())
    trainable = {str(p.device) for p in pm.parameters() if p.requires_grad}
    return losses, sorted(trainable)
out["lora"], out["lora_params"] = lora("neuron")
out["lora_cpu"], _ = lora("cpu")
print(json.dumps(out))
"""
    got = _run_json(code)
    assert got["neuron"] == got["neuron:0"] == got["0"] == ["neuron:0"]
    assert got["logits_match"]
    assert got["lora_params"] == ["neuron:0"]
    assert got["lora"][-1] < got["lora"][0]
    assert got["lora"] == pytest.approx(got["lora_cpu"], rel=1e-4)
