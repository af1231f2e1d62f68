# What a CUDA training script says, after "cuda" -> "neuron" (nanoGPT's train.py and bench.py,
# NVIDIA's examples): torch.backends.neuron (matmul flags, SDPA backend switches),
# torch.neuron.amp (autocast / GradScaler / custom_fwd / custom_bwd, deprecated as torch.cuda's),
# torch.neuron.nvtx (ranges as torch.profiler ranges), ProfilerActivity.NEURON, torch.neuron.OutOfMemoryError,
# set_per_process_memory_fraction and the deprecated memory spellings. Each against the
# canonical API it stands for, or against CPU.
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

MiB = 1024 * 1024


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(
        device
    )


def _train(spelled: bool, steps: int = 4):
    model = _model("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    if spelled:  # torch.cuda.amp's spellings with "cuda" -> "neuron"
        scaler = torch.neuron.amp.GradScaler(init_scale=2.0**10)
        ctx = torch.neuron.amp.autocast
    else:
        scaler = torch.amp.GradScaler("neuron", init_scale=2.0**10)
        ctx = lambda: torch.amp.autocast("neuron", dtype=torch.float16)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g).to("neuron")
        y = torch.randint(0, 8, (16,), generator=g).to("neuron")
        with ctx():
            loss = F.cross_entropy(model(x), y)
        assert loss.dtype == torch.float32
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()], scaler.get_scale()


def test_neuron_amp_trains_as_torch_amp_and_warns_as_torch_cuda_amp():
    with pytest.warns(FutureWarning) as record:
        spelled = _train(spelled=True)
    messages = {str(w.message) for w in record}
    assert any("torch.amp.GradScaler('neuron'" in m for m in messages)
    assert any("torch.amp.autocast('neuron'" in m for m in messages)
    canonical = _train(spelled=False)
    assert spelled[0] == canonical[0]
    for a, b in zip(spelled[1], canonical[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert spelled[2] == canonical[2]


def test_neuron_amp_autocast_defaults_to_float16_as_torch_cuda_amp():
    a = torch.randn(8, 8, device="neuron")
    with pytest.warns(FutureWarning, match=r"torch\.amp\.autocast\('neuron'"):
        ctx = torch.neuron.amp.autocast()
    with ctx:
        assert torch.get_autocast_dtype("neuron") == torch.float16
        assert (a @ a).dtype == torch.float16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with torch.neuron.amp.autocast(dtype=torch.bfloat16):
            assert (a @ a).dtype == torch.bfloat16
        with torch.neuron.amp.autocast(enabled=False):
            assert (a @ a).dtype == torch.float32


def test_neuron_amp_custom_fwd_casts_inputs_on_neuron():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)

        class Square(torch.autograd.Function):
            @staticmethod
            @torch.neuron.amp.custom_fwd(cast_inputs=torch.float32)
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            @torch.neuron.amp.custom_bwd
            def backward(ctx, grad):
                (x,) = ctx.saved_tensors
                return 2 * x * grad

    x = torch.randn(4, 4, device="neuron", dtype=torch.float16, requires_grad=True)
    with torch.amp.autocast("neuron", dtype=torch.float16):
        y = Square.apply(x)
    assert y.dtype == torch.float32  # cast_inputs ran the forward in float32 under autocast
    y.sum().backward()
    torch.testing.assert_close(x.grad.float().cpu(), (2 * x.detach().float()).cpu())


def test_submodules_import_by_their_torch_names():
    import torch.neuron.amp
    import torch.neuron.nvtx
    from torch.neuron.amp import GradScaler

    assert GradScaler is torch.neuron.amp.GradScaler
    assert torch.neuron.nvtx.range_push is torch.neuron.nvtx.range_push


def test_backends_neuron_matmul_flags_and_is_built():
    assert torch.backends.neuron.is_built()
    before = torch.backends.neuron.matmul.allow_tf32
    try:
        torch.backends.neuron.matmul.allow_tf32 = True  # nanoGPT's line, "cuda" -> "neuron"
        assert torch.backends.neuron.matmul.allow_tf32
        a = torch.randn(64, 64)
        # No TF32 on neuron: a float32 matmul stays CPU's float32 result.
        torch.testing.assert_close((a.neuron() @ a.neuron()).cpu(), a @ a)
    finally:
        torch.backends.neuron.matmul.allow_tf32 = before


def _choice(q):
    return SDPBackend(torch._fused_sdp_choice(q, q, q, is_causal=True))


def test_sdpa_backend_switches_choose_neurons_fused_kernel_or_math():
    q = torch.randn(2, 2, 16, 8, device="neuron")
    assert _choice(q) == SDPBackend.OVERRIDEABLE
    with sdpa_kernel(SDPBackend.MATH):
        assert _choice(q) == SDPBackend.MATH
    # A CUDA script asking for flash (or memory-efficient) attention gets neuron's fused kernel.
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        assert _choice(q) == SDPBackend.OVERRIDEABLE
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        assert _choice(q) == SDPBackend.OVERRIDEABLE
    with (
        pytest.warns(FutureWarning),
        torch.backends.neuron.sdp_kernel(enable_flash=False, enable_mem_efficient=False),
    ):
        assert _choice(q) == SDPBackend.MATH
    try:
        torch.backends.neuron.enable_flash_sdp(False)
        assert not torch.backends.neuron.flash_sdp_enabled()
        assert _choice(q) == SDPBackend.OVERRIDEABLE  # memory-efficient is still on
        torch.backends.neuron.enable_mem_efficient_sdp(False)
        assert _choice(q) == SDPBackend.MATH
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        torch.testing.assert_close(
            out.cpu(), F.scaled_dot_product_attention(q.cpu(), q.cpu(), q.cpu(), is_causal=True)
        )
    finally:
        torch.backends.neuron.enable_flash_sdp(True)
        torch.backends.neuron.enable_mem_efficient_sdp(True)
    assert _choice(q) == SDPBackend.OVERRIDEABLE


def test_nvtx_ranges_are_profiler_ranges():
    nvtx = torch.neuron.nvtx
    x = torch.randn(256, device="neuron")
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.NEURON]
    assert activities[1] is torch.profiler.ProfilerActivity.PrivateUse1
    with torch.profiler.profile(activities=activities) as prof:
        assert nvtx.range_push("outer") == 0
        assert nvtx.range_push("inner") == 1
        y = x * 2
        assert nvtx.range_pop() == 1
        assert nvtx.range_pop() == 0
        handle = nvtx.range_start("detached")
        nvtx.mark("a mark")
        nvtx.range_end(handle)
        with nvtx.range("step {}", 3):
            y = y + 1
        torch.neuron.synchronize()
    assert nvtx.range_pop() == -1  # nothing left open
    names = {e.name for e in prof.events()}
    assert {"outer", "inner", "detached", "a mark", "step 3"} <= names
    assert any(e.device_type == torch.autograd.DeviceType.PrivateUse1 for e in prof.events())
    with pytest.raises(ValueError, match="no open range"):
        nvtx.range_end(handle)
    torch.testing.assert_close(y.cpu(), x.cpu() * 2 + 1)


def test_out_of_memory_error_spelling_catches_a_neuron_oom():
    total = torch.neuron.get_device_properties(3).total_memory
    with pytest.raises(torch.neuron.OutOfMemoryError, match="neuron:3"):
        torch.empty(total + MiB, dtype=torch.uint8, device="neuron:3")


def test_memory_fraction_limits_the_process(run_py):
    r = run_py(
        """
        import torch
        MiB = 1024 * 1024
        print("default", torch.neuron.get_per_process_memory_fraction())
        keep = torch.empty(20 * MiB, dtype=torch.uint8, device="neuron")
        del keep  # cached: reserved stays 20 MiB
        torch.neuron.set_per_process_memory_fraction(0.5)  # 32 of 64 MiB
        print("fraction", torch.neuron.get_per_process_memory_fraction())
        t = torch.empty(30 * MiB, dtype=torch.uint8, device="neuron")  # releases the cache
        print("30 MiB ok, reserved", torch.neuron.memory_reserved() // MiB)
        try:
            torch.empty(10 * MiB, dtype=torch.uint8, device="neuron")
        except torch.neuron.OutOfMemoryError as e:
            print("OOM:", str(e).splitlines()[0])
        for bad in (1, 1.5, -0.1):
            try:
                torch.neuron.set_per_process_memory_fraction(bad)
            except (TypeError, ValueError) as e:
                print(type(e).__name__, e)
        torch.neuron.set_per_process_memory_fraction(1.0)
        u = torch.empty(10 * MiB, dtype=torch.uint8, device="neuron")
        print("after raising it:", u.numel() // MiB)
    """,
        env={"OPENNEURON_DEVICE_MEMORY": "64MiB"},
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "default 1.0" in out and "fraction 0.5" in out
    assert "30 MiB ok, reserved 30" in out
    oom = next(line for line in out.splitlines() if line.startswith("OOM:"))
    assert "limited to 32.0 MiB by torch.neuron.set_per_process_memory_fraction" in oom
    assert "TypeError Invalid type for fraction" in out
    assert out.count("ValueError Invalid fraction value") == 2
    assert "after raising it: 10" in out


def test_deprecated_memory_spellings():
    x = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    del x
    torch.neuron.synchronize()
    assert torch.neuron.memory_cached() == torch.neuron.memory_reserved()
    assert torch.neuron.max_memory_cached() == torch.neuron.max_memory_reserved()
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.neuron.reset_max_memory_allocated()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.neuron.reset_max_memory_cached()
    assert torch.neuron.max_memory_reserved() == torch.neuron.memory_reserved()


def test_graph_spellings_and_nothing_to_ipc_collect():
    # torch.cuda.CUDAGraph / graph / graph_pool_handle: tests/python/test_graphs.py
    assert torch.neuron.is_current_stream_capturing() is False
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g, pool=torch.neuron.graph_pool_handle()):
        assert torch.neuron.is_current_stream_capturing() is True
    assert torch.neuron.is_current_stream_capturing() is False
    before = torch.neuron.memory_allocated()
    torch.neuron.ipc_collect()
    assert torch.neuron.memory_allocated() == before
