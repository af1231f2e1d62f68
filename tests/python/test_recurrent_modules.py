# nn.GRU, nn.GRUCell, nn.LSTMCell and unbatched nn.LSTM on neuron vs CPU, forward and backward:
# ATen sends their cells to the accelerator-only fused ops (_thnn_fused_gru_cell /
# _thnn_fused_lstm_cell + backward; csrc/aten/ops/accelerator_ops.cpp), which CPU lacks.
import copy

import pytest
import torch
from torch import nn

TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-4}, torch.bfloat16: {"rtol": 3e-2, "atol": 3e-2}}

CASES = {
    "gru_2layer_bidir": (lambda: nn.GRU(6, 5, num_layers=2, bidirectional=True), (4, 3, 6)),
    "gru_no_bias": (lambda: nn.GRU(6, 5, bias=False, batch_first=True), (3, 4, 6)),
    "gru_cell": (lambda: nn.GRUCell(6, 5), (3, 6)),
    "lstm_cell": (lambda: nn.LSTMCell(6, 5), (3, 6)),
    "lstm_cell_no_bias": (lambda: nn.LSTMCell(6, 5, bias=False), (3, 6)),
    "lstm_unbatched": (lambda: nn.LSTM(6, 5), (4, 6)),
    "lstm_proj_batch_first": (lambda: nn.LSTM(6, 5, proj_size=3, batch_first=True), (3, 4, 6)),
}


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_recurrent_module_matches_cpu(name, dtype):
    make, shape = CASES[name]
    torch.manual_seed(0)
    cpu = make().to(dtype)
    dev = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    xd = x.detach().to("neuron").requires_grad_()
    outs_c, outs_d = _flat(cpu(x)), _flat(dev(xd))
    assert all(o.device.type == "neuron" for o in outs_d)
    for c, d in zip(outs_c, outs_d):
        torch.testing.assert_close(d.cpu(), c, **TOL[dtype])
    sum(o.float().square().sum() for o in outs_c).backward()
    sum(o.float().square().sum() for o in outs_d).backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, **TOL[dtype])
    for (n, pc), (_, pd) in zip(cpu.named_parameters(), dev.named_parameters()):
        torch.testing.assert_close(pd.grad.cpu(), pc.grad, **TOL[dtype], msg=n)
