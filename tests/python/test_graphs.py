"""torch.neuron graphs (NeuronGraph, graph, graph_pool_handle, make_graphed_callables), as
torch.cuda's: capture, replay against CPU, the CUDA docs' patterns (warm-up on a side stream,
whole training step, shared pools, partial-network capture), what a capture refuses, memory back
to baseline; and `mode="reduce-overhead"`, which
replays Inductor's compiled graphs from them (inference, training, a static-cache generate())."""
from __future__ import annotations

import copy
import gc
import os

import pytest
import torch
import torch._dynamo

from openneuron._inductor import graphs as inductor_graphs

DEV = torch.device("neuron:0")


def _warm_up(fn, times=2):
    s = torch.neuron.Stream()
    s.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(s):
        for _ in range(times):
            fn()
    torch.neuron.current_stream().wait_stream(s)


def test_capture_then_replay_with_new_inputs_matches_cpu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 16)
    lin_n = copy.deepcopy(lin).to(DEV)
    static_x = torch.zeros(8, 32, device=DEV)
    _warm_up(lambda: torch.relu(lin_n(static_x)) * 2)
    g = torch.neuron.NeuronGraph()
    with torch.no_grad(), torch.neuron.graph(g):
        assert torch.neuron.is_current_stream_capturing()
        static_y = torch.relu(lin_n(static_x)) * 2
    assert not torch.neuron.is_current_stream_capturing()
    assert g.num_items() == 3  # addmm, relu, mul: recorded, not run
    with torch.no_grad():
        for i in range(3):
            x = torch.randn(8, 32)
            static_x.copy_(x)
            g.replay()
            torch.testing.assert_close(static_y.cpu(), torch.relu(lin(x)) * 2)


OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "adam_capturable": lambda ps: torch.optim.Adam(ps, lr=1e-2, capturable=True),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_whole_training_step_captured_matches_eager(optimizer):
    """The CUDA docs' whole-network capture: forward, backward and optimizer step replayed."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ref = copy.deepcopy(model).to(DEV)
    model = model.to(DEV)
    opt = OPTIMIZERS[optimizer](model.parameters())
    opt_ref = OPTIMIZERS[optimizer](ref.parameters())
    loss_fn = torch.nn.MSELoss()
    data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(6)]
    static_x, static_t = data[0][0].to(DEV), data[0][1].to(DEV)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(static_x), static_t)
        loss.backward()
        opt.step()
        return loss

    # warm-up steps train too: the reference takes the same steps
    _warm_up(step, times=3)
    for _ in range(3):
        opt_ref.zero_grad()
        loss_fn(ref(static_x), static_t).backward()
        opt_ref.step()
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        static_loss = step()
    for x, t in data[1:]:
        static_x.copy_(x.to(DEV))
        static_t.copy_(t.to(DEV))
        g.replay()
        opt_ref.zero_grad()
        loss = loss_fn(ref(x.to(DEV)), t.to(DEV))
        loss.backward()
        opt_ref.step()
        torch.testing.assert_close(static_loss.cpu(), loss.detach().cpu(), rtol=1e-6, atol=1e-7)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["item", "synchronize", "host_copy", "own_generator", "event"])
def test_what_a_capture_refuses_is_an_error_naming_it(case):
    x = torch.randn(4, 4, device=DEV)
    gen = torch.Generator(DEV).manual_seed(0)
    before = torch.neuron.Event()
    before.record()  # on the device, before the capture
    body = {
        "item": lambda: x.sum().item(),
        "synchronize": torch.neuron.synchronize,
        "host_copy": lambda: x.cpu(),
        "own_generator": lambda: x.bernoulli_(0.5, generator=gen),
        "event": lambda: torch.neuron.current_stream().wait_event(before),
    }[case]
    expected = {"item": "device to the host", "synchronize": "synchronize",
                "host_copy": "device to the host", "own_generator": "bernoulli",
                "event": "event"}[case]
    g = torch.neuron.NeuronGraph()
    with pytest.raises(RuntimeError, match=expected), torch.neuron.graph(g):
        body()
    assert not torch.neuron.is_current_stream_capturing()
    # the failed capture left nothing behind: the device and a new capture work
    torch.neuron.synchronize()
    with torch.neuron.graph(g):
        y = x * 2
    g.replay()
    torch.testing.assert_close(y.cpu(), x.cpu() * 2)


def test_capture_forks_and_joins_a_side_stream():
    """CUDA's cross-stream capture: a side stream that waits on the capturing stream joins the
    capture; the capturing stream waits on it again before using its results."""
    x = torch.randn(64, device=DEV)
    side = torch.neuron.Stream()

    def body():
        main = torch.neuron.current_stream()
        side.wait_stream(main)
        with torch.neuron.stream(side):
            a = x * 2
        b = x + 1
        main.wait_stream(side)
        return a + b

    _warm_up(body)
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        out = body()
        with torch.neuron.stream(side):
            assert torch.neuron.is_current_stream_capturing()  # joined until capture_end
    assert not torch.neuron.is_current_stream_capturing()
    for v in (torch.randn(64), torch.arange(64.0)):
        x.copy_(v.to(DEV))
        g.replay()
        torch.testing.assert_close(out.cpu(), v * 2 + v + 1)


def test_random_ops_draw_new_numbers_each_replay_as_eager_would():
    # As CUDA's graph-safe RNG: each replay takes the default generator's state when queued.
    x = torch.ones(4096, device=DEV)
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        y = torch.nn.functional.dropout(x, 0.5) + torch.rand(4096, device=DEV)
    outs = []
    torch.neuron.manual_seed(7)
    for _ in range(3):
        g.replay()
        outs.append(y.cpu())
    torch.neuron.manual_seed(7)
    eager = [(torch.nn.functional.dropout(x, 0.5) + torch.rand(4096, device=DEV)).cpu()
             for _ in range(3)]
    for got, want in zip(outs, eager):
        assert torch.equal(got, want)
    assert not torch.equal(outs[0], outs[1])


def test_capturing_a_non_capturable_optimizer_step_is_an_error():
    # Its step count lives on the host: a replay would repeat the captured step's bias
    # correction. torch.optim checks this for CUDA; neuron gets the same error.
    p = torch.nn.Parameter(torch.randn(4, device=DEV))
    p.grad = torch.randn(4, device=DEV)
    opt = torch.optim.Adam([p], lr=1e-2)
    opt.step()
    with (pytest.raises(RuntimeError, match="capturable is False"),
          torch.neuron.graph(torch.neuron.NeuronGraph())):
        opt.step()


def test_capture_end_raises_for_an_invalidated_capture():
    g = torch.neuron.NeuronGraph()
    g.capture_begin()
    with pytest.raises(RuntimeError, match="synchronize"):
        torch.neuron.current_stream().synchronize()
    with pytest.raises(RuntimeError, match="invalidated"):
        g.capture_end()
    with pytest.raises(RuntimeError, match="no capture"):
        g.replay()


def test_graphs_share_a_pool_and_memory_returns_to_baseline():
    torch.neuron.synchronize()
    gc.collect()
    torch.neuron.empty_cache()
    base_alloc = torch.neuron.memory_allocated()
    x = torch.randn(256, 256, device=DEV)
    g1, g2 = torch.neuron.NeuronGraph(), torch.neuron.NeuronGraph()
    pool = torch.neuron.graph_pool_handle()
    with torch.neuron.graph(g1, pool=pool):
        a = (x @ x).relu()
    with torch.neuron.graph(g2, pool=g1.pool()):
        b = (a * 3).sum(0)
    assert g1.pool() == g2.pool() == pool
    # The pool's memory is the graphs': empty_cache keeps it while they live.
    torch.neuron.empty_cache()
    for _ in range(2):
        g1.replay()
        g2.replay()
    ref = (x.cpu() @ x.cpu()).relu()
    torch.testing.assert_close(a.cpu(), ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b.cpu(), (ref * 3).sum(0), rtol=1e-5, atol=1e-3)
    del a, b, x, g1, g2
    gc.collect()
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() == base_alloc
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() == torch.neuron.memory_allocated() == base_alloc


def test_ops_held_by_adaptive_eager_are_captured():
    # A pending fused group is flushed when a capture begins (outside it) and ends (into it).
    was = torch.neuron.is_fusion_enabled()
    torch.neuron.set_fusion_enabled(True)
    try:
        a = torch.randn(1000, device=DEV)
        before = a * 5  # pending when the capture begins: runs once, uncaptured
        g = torch.neuron.NeuronGraph()
        with torch.neuron.graph(g):
            b = (a * 2 + 1).tanh() * 3
        assert g.num_items() >= 1
        first = a.cpu()
        torch.testing.assert_close(before.cpu(), first * 5)
        for _ in range(2):
            v = torch.randn(1000)
            a.copy_(v.to(DEV))
            g.replay()
            torch.testing.assert_close(b.cpu(), (v * 2 + 1).tanh() * 3)
    finally:
        torch.neuron.set_fusion_enabled(was)


def test_reset_then_capture_again():
    x = torch.ones(4, device=DEV)
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        y = x + 1
    g.replay()
    assert y.cpu().tolist() == [2.0] * 4
    g.reset()
    with pytest.raises(RuntimeError, match="no capture"):
        g.replay()
    with torch.neuron.graph(g):
        z = x * 5
    g.replay()
    assert z.cpu().tolist() == [5.0] * 4


def _docs_partial_network(graphed: bool):
    """The CUDA docs' make_graphed_callables example (three modules, a data-dependent branch
    between two of them, SGD), smaller: losses and final weights of 6 steps."""
    torch.manual_seed(0)
    n, d_in, h, d_out = 32, 48, 40, 16
    m1, m2, m3 = (torch.nn.Linear(d_in, h).to(DEV), torch.nn.Linear(h, d_out).to(DEV),
                  torch.nn.Linear(h, d_out).to(DEV))
    opt = torch.optim.SGD([*m1.parameters(), *m2.parameters(), *m3.parameters()], lr=0.1)
    if graphed:
        x = torch.randn(n, d_in, device=DEV)
        hidden = torch.randn(n, h, device=DEV, requires_grad=True)
        m1 = torch.neuron.make_graphed_callables(m1, (x,))
        m2, m3 = torch.neuron.make_graphed_callables((m2, m3), ((hidden,), (hidden,)))
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(6):
        data = torch.randn(n, d_in, generator=g).to(DEV)
        target = torch.randn(n, d_out, generator=g).to(DEV)
        opt.zero_grad(set_to_none=True)
        tmp = m1(data)
        tmp = m2(tmp) if tmp.sum().item() > 0 else m3(tmp)
        loss = torch.nn.functional.mse_loss(tmp, target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for m in (m1, m2, m3) for p in m.parameters()]


def test_make_graphed_callables_trains_as_eager():
    losses, weights = _docs_partial_network(graphed=True)
    ref_losses, ref_weights = _docs_partial_network(graphed=False)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    for w, r in zip(weights, ref_weights):
        torch.testing.assert_close(w, r, rtol=1e-5, atol=1e-6)


def test_make_graphed_callables_function_and_eval_mode():
    torch.manual_seed(0)
    w = torch.randn(8, 8, device=DEV, requires_grad=True)

    def f(x):
        return (x @ w).relu()

    x = torch.randn(4, 8, device=DEV, requires_grad=True)
    gf = torch.neuron.make_graphed_callables(f, (x,))
    x2 = torch.randn(4, 8, device=DEV, requires_grad=True)
    out = gf(x2)
    out.sum().backward()
    ref_x = x2.detach().clone().requires_grad_()
    ref = f(ref_x)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x2.grad, ref_x.grad)
    # a module graphed in training mode runs its own forward in eval mode
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).to(DEV)
    gm = torch.neuron.make_graphed_callables(m, (torch.randn(4, 8, device=DEV),))
    gm.eval()
    y = torch.randn(4, 8, device=DEV)
    torch.testing.assert_close(gm(y), m[0](y))
    with pytest.raises(AssertionError, match="hooks"):
        hooked = torch.nn.Linear(2, 2).to(DEV)
        hooked.register_forward_hook(lambda *a: None)
        torch.neuron.make_graphed_callables(hooked, (torch.randn(1, 2, device=DEV),))


# ---- mode="reduce-overhead": Inductor's compiled graphs replayed -------------------------------

@pytest.fixture
def fresh():
    torch._dynamo.reset()
    inductor_graphs.reset_stats()
    yield
    torch._dynamo.reset()


def test_reduce_overhead_inference_replays_and_matches_cpu(fresh):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    mn = copy.deepcopy(m).to(DEV)
    f = torch.compile(mn, mode="reduce-overhead")
    with torch.no_grad():
        for rows in (4, 4, 4, 4, 6, 6, 6):  # two signatures: each warmed, captured, replayed
            x = torch.randn(rows, 32)
            torch.testing.assert_close(f(x.to(DEV)).cpu(), m(x), rtol=1e-5, atol=1e-5)
    st = inductor_graphs.stats()
    assert st["captures"] == 2 and st["replays"] == 5 and st["failed_captures"] == 0, st


def test_reduce_overhead_outputs_are_not_overwritten_by_the_next_call(fresh):
    f = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead")
    outs = [f(torch.full((4,), float(i), device=DEV)) for i in range(5)]
    assert [o.cpu()[0].item() for o in outs] == [2 * i + 1 for i in range(5)]
    assert inductor_graphs.stats()["replays"] >= 3


def test_reduce_overhead_mutated_input(fresh):
    def f(buf, x):
        buf.add_(x)
        return buf * 2

    g = torch.compile(f, mode="reduce-overhead")
    buf, ref = torch.zeros(8, device=DEV), torch.zeros(8)
    for i in range(5):
        x = torch.full((8,), float(i))
        got = g(buf, x.to(DEV))
        torch.testing.assert_close(got.cpu(), f(ref, x))
        torch.testing.assert_close(buf.cpu(), ref)


def _compiled_training_losses(model, mode, make_opt, steps=6):
    torch._dynamo.reset()
    torch.neuron.manual_seed(3)
    m = copy.deepcopy(model).to(DEV)
    opt = make_opt(m.parameters())
    f = torch.compile(m, mode=mode)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        loss = f(torch.randn(8, 16, generator=g).to(DEV)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dropout", [False, True], ids=["adamw", "dropout_sgd"])
def test_reduce_overhead_training_matches_default_mode(fresh, dropout):
    # Forward and backward replayed from step 3; with dropout, a replay draws from the
    # generator what the compiled graph would: the same losses either way.
    torch.manual_seed(0)
    if dropout:
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Dropout(0.3),
                                    torch.nn.GELU(), torch.nn.Linear(64, 1))
        make_opt = lambda ps: torch.optim.SGD(ps, lr=1e-2)
    else:
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 1))
        make_opt = lambda ps: torch.optim.AdamW(ps, lr=1e-2)
    default = _compiled_training_losses(model, "default", make_opt)
    inductor_graphs.reset_stats()
    replayed = _compiled_training_losses(model, "reduce-overhead", make_opt)
    st = inductor_graphs.stats()
    assert st["replays"] >= 6 and st["failed_captures"] == 0, st
    torch.testing.assert_close(replayed, default, rtol=1e-6, atol=0)


def test_reduce_overhead_static_cache_generate_same_tokens_as_cpu(fresh):
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2,
                                  n_head=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    kw = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False, "eos_token_id": None}
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        mn = model.to(DEV)
        cc = transformers.CompileConfig(backend="neuron", mode="reduce-overhead", dynamic=False)
        for _ in range(2):  # the second call: a new cache, captured again
            out = mn.generate(ids.to(DEV), attention_mask=torch.ones_like(ids).to(DEV),
                              cache_implementation="static", compile_config=cc, **kw)
            assert torch.equal(out.cpu(), ref)
    st = inductor_graphs.stats()
    assert st["captures"] >= 2 and st["replays"] >= 16 and st["failed_captures"] == 0, st


def test_reduce_overhead_random_op_draws_new_numbers_per_call(fresh):
    f = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.5, training=True) + x,
                      mode="reduce-overhead")
    x = torch.ones(4096, device=DEV)
    outs = [f(x).cpu() for _ in range(5)]
    # every call draws new numbers, replayed or not: no call repeats a mask
    assert all(not torch.equal(a, b) for i, a in enumerate(outs) for b in outs[i + 1:])
    assert all(set(o.unique().tolist()) <= {1.0, 3.0} for o in outs)
