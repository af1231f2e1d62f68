# Autograd on neuron: backward through matmul, convolution, pointwise, reductions, views,
# in-place and index ops matches CPU; gradients land on neuron; retain_graph,
# torch.autograd.grad and hooks behave as on CPU. Autograd itself is PyTorch's (upper dispatch
# keys); these tests check that the neuron kernels under it keep aliasing and shapes right.
import pytest
import torch
import torch.nn.functional as F

import openneuron


def _pair(*shapes, seed=0):
    """The same random leaf tensors on cpu and on neuron (requires_grad)."""
    g = torch.Generator().manual_seed(seed)
    cpu = [torch.randn(*s, generator=g).requires_grad_() for s in shapes]
    neuron = [t.detach().to("neuron").requires_grad_() for t in cpu]
    return cpu, neuron


def _check(fn, *shapes, atol=1e-5, rtol=1e-4):
    cpu, neuron = _pair(*shapes)
    out_c = fn(*cpu)
    out_n = fn(*neuron)
    assert out_n.device.type == "neuron"
    torch.testing.assert_close(out_n.cpu(), out_c.detach(), atol=atol, rtol=rtol)
    g = torch.randn(out_c.shape, generator=torch.Generator().manual_seed(1))
    out_c.backward(g)
    out_n.backward(g.to("neuron"))
    for c, n in zip(cpu, neuron):
        assert n.grad is not None and n.grad.device.type == "neuron"
        torch.testing.assert_close(n.grad.cpu(), c.grad, atol=atol, rtol=rtol)


CASES = {
    "matmul": (lambda a, b: a @ b, (4, 5), (5, 3)),
    "bmm": (lambda a, b: torch.bmm(a, b), (2, 4, 5), (2, 5, 3)),
    "linear": (lambda x, w, b: F.linear(x, w, b), (6, 4), (3, 4), (3,)),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (2, 3, 6, 6), (4, 3, 3, 3), (4,)),
    "conv1d_stride": (lambda x, w: F.conv1d(x, w, stride=2), (2, 3, 9), (5, 3, 3)),
    "pointwise": (lambda a, b: torch.tanh(a) * torch.sigmoid(b) + a.exp() / (1 + b * b),
                  (3, 4), (3, 4)),
    "broadcast": (lambda a, b: (a + b).relu() * 2, (3, 1, 4), (5, 1)),
    "sum_mean": (lambda a: a.sum(1) + a.mean(1), (4, 6)),
    "max_var": (lambda a: a.amax(0) + a.var(0), (5, 3)),
    "softmax_logsoftmax": (lambda a: F.softmax(a, -1) * F.log_softmax(a, 0), (4, 5)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (5,), w, b), (3, 5), (5,), (5,)),
    "batch_norm_train": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                         (4, 3, 5), (3,), (3,)),
    "views": (lambda a: a.t().reshape(-1)[::2].view(3, 2).permute(1, 0).unsqueeze(0), (3, 4)),
    "slicing_narrow": (lambda a: a[1:, ::2].narrow(0, 0, 2) * a[:2, 1::2], (4, 4)),
    "cat_stack_split": (lambda a, b: torch.cat(torch.stack([a, b]).split(1)) .sum(0), (2, 3), (2, 3)),
    "index_select_gather": (lambda a: a.index_select(0, torch.tensor([2, 0, 2], device=a.device))
                            .gather(1, torch.tensor([[0], [1], [2]], device=a.device)), (3, 4)),
    "advanced_index": (lambda a: a[torch.tensor([0, 2, 2], device=a.device), 1:], (3, 4)),
    "embedding": (lambda w: F.embedding(torch.tensor([[1, 3], [3, 0]], device=w.device), w),
                  (5, 4)),
    "cross_entropy": (lambda x: F.cross_entropy(x, torch.tensor([1, 0, 3], device=x.device)),
                      (3, 4)),
    "mse_loss": (lambda a, b: F.mse_loss(a, b), (4, 3), (4, 3)),
    "max_pool_avg_pool": (lambda x: F.max_pool2d(x, 2) + F.avg_pool2d(x, 2), (1, 2, 4, 4)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_backward_matches_cpu(name):
    fn, *shapes = CASES[name]
    _check(fn, *shapes)


def test_in_place_ops_in_graph():
    def fn(a, b):
        x = a * 1.0
        x.add_(b).mul_(2)
        x[0].zero_()
        x.clamp_(min=-0.5)
        return x

    _check(fn, (3, 4), (3, 4))


def test_index_put_and_scatter_backward():
    def fn(a, v):
        idx = torch.tensor([0, 2], device=a.device)
        x = a.clone()
        x[idx] = v
        return x.scatter_add(0, torch.tensor([[1, 0, 2, 1]], device=a.device), a[:1])

    _check(fn, (3, 4), (2, 4))


def test_retain_graph_and_double_backward_pass():
    cpu, neuron = _pair((3, 3))
    results = []
    for (x,) in (cpu, neuron):
        y = (x.sin() * x).sum()
        y.backward(retain_graph=True)
        first = x.grad.clone()
        y.backward()
        results.append((first.cpu(), x.grad.cpu()))
    torch.testing.assert_close(results[1][0], results[0][0])
    torch.testing.assert_close(results[1][1], results[0][1])
    torch.testing.assert_close(results[1][1], 2 * results[1][0])


def test_autograd_grad_and_create_graph():
    cpu, neuron = _pair((4,))
    outs = []
    for (x,) in (cpu, neuron):
        y = (x ** 3).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        assert g.device == x.device
        (gg,) = torch.autograd.grad(g.sum(), x)
        outs.append((g.detach().cpu(), gg.cpu()))
    torch.testing.assert_close(outs[1][0], outs[0][0])
    torch.testing.assert_close(outs[1][1], outs[0][1])


def test_tensor_and_module_hooks():
    cpu, neuron = _pair((2, 3))
    seen = {}
    for tag, (x,) in (("cpu", cpu), ("neuron", neuron)):
        lin = torch.nn.Linear(3, 2)
        with torch.no_grad():
            lin.weight.copy_(torch.arange(6.0).reshape(2, 3) / 10)
            lin.bias.fill_(0.5)
        lin = lin.to(x.device)
        grads = []
        x.register_hook(lambda g, grads=grads: grads.append(g.device.type) or g * 2)
        lin.register_full_backward_hook(lambda m, gi, go, grads=grads: grads.append("module"))
        lin(x).pow(2).sum().backward()
        seen[tag] = (x.grad.cpu(), lin.weight.grad.cpu(), grads)
        assert lin.weight.grad.device == x.device
    torch.testing.assert_close(seen["neuron"][0], seen["cpu"][0])
    torch.testing.assert_close(seen["neuron"][1], seen["cpu"][1])
    assert seen["neuron"][2] == ["module", "neuron"]


def test_gradient_accumulation_and_zero_grad():
    model_c = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model_n = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model_n.load_state_dict(model_c.state_dict())
    model_n.to("neuron")
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))
    for _ in range(2):
        model_c(x).sum().backward()
        model_n(x.to("neuron")).sum().backward()
    for pc, pn in zip(model_c.parameters(), model_n.parameters()):
        assert pn.grad.device.type == "neuron"
        torch.testing.assert_close(pn.grad.cpu(), pc.grad)
    opt = torch.optim.SGD(model_n.parameters(), lr=0.1)
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model_n.parameters())


def test_batch_norm_eval_matches_cpu_and_stays_async():
    """Eval-mode batch norm returns empty save_mean/save_invstd (as CPU) on the async path."""
    openneuron._C._ops_report_reset()
    m = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        m.running_mean.uniform_()
        m.running_var.uniform_(1, 2)
    m.eval()
    mn = torch.nn.BatchNorm2d(3)
    mn.load_state_dict(m.state_dict())
    mn.eval().to("neuron")
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(mn(x.to("neuron")).cpu(), m(x))
    paths = {(r[0], r[1]) for r in openneuron._C._ops_report()}
    assert ("aten::native_batch_norm", "async") in paths
    assert not any(p == "fallback" for _, p in paths)
