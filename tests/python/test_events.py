# Events: record / query / synchronize / wait across streams, elapsed_time with timing enabled,
# the generic torch.Event API on neuron, and the errors torch.cuda gives for misuse. Streams are
# test_streams.py. Reference: torch.cuda.Event.
import pytest
import torch


def _busy(n: int = 30) -> torch.Tensor:
    x = torch.randn(256, 256, device="neuron") / 256
    for _ in range(n):
        x = torch.tanh(x @ x)
    return x


def test_record_query_synchronize():
    e = torch.neuron.Event()
    assert isinstance(e, torch.Event) and isinstance(e, torch.neuron.Event)
    assert not isinstance(torch.Event("cpu"), torch.neuron.Event)
    assert e.query()  # never recorded: complete, as in CUDA
    x = _busy()
    e.record()
    e.synchronize()
    assert e.query()
    assert torch.isfinite(x).all().item()


def test_event_wait_orders_streams():
    producer, consumer = torch.neuron.Stream(), torch.neuron.Stream()
    src = torch.randn(256, 256)
    with torch.neuron.stream(producer):
        x = src.to("neuron")
        for _ in range(10):
            x = x + 1
        done = producer.record_event()
    assert isinstance(done, torch.neuron.Event)
    consumer.wait_event(done)
    with torch.neuron.stream(consumer):
        y = x * 3
    e2 = torch.neuron.Event()
    e2.record(consumer)
    e2.wait()  # the current (default) stream waits for the consumer
    torch.testing.assert_close(y.cpu(), (src + 10) * 3)
    torch.neuron.synchronize()


def test_event_record_on_stream_and_stream_synchronize():
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        t = torch.ones(10, device="neuron") * 5
        e = torch.neuron.Event()
        e.record()
    e.synchronize()
    assert e.query()
    assert e.device == torch.device("neuron:0")
    assert t.sum().item() == 50


def test_elapsed_time():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    _busy()
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float)
    assert ms >= 0.0


def test_elapsed_time_requires_timing():
    start, end = torch.neuron.Event(), torch.neuron.Event()
    start.record()
    end.record()
    end.synchronize()
    # torch's generic c10::Event check raises ValueError (torch.cuda raises RuntimeError).
    with pytest.raises(ValueError, match="enable_timing"):
        start.elapsed_time(end)


def test_elapsed_time_requires_recorded_events():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    with pytest.raises(ValueError, match="recorded"):
        start.elapsed_time(end)
    torch.neuron.synchronize()


def test_generic_torch_event_on_neuron():
    s = torch.Stream(device="neuron:1")
    e1 = torch.Event(device="neuron:1", enable_timing=True)
    e2 = torch.Event(device="neuron:1", enable_timing=True)
    e1.record(s)
    with s:
        x = torch.ones(100, device="neuron:1").cumsum(0)
    e2.record(s)
    e2.synchronize()
    assert e2.query()
    assert e1.elapsed_time(e2) >= 0.0
    assert x[-1].item() == 100
    e3 = s.record_event()
    torch.neuron.current_stream(1).wait_event(e3)
    torch.accelerator.synchronize(1)
    assert e3.query()


def test_event_on_wrong_stream_device_errors():
    e = torch.neuron.Event()
    e.record(torch.neuron.current_stream(0))
    with pytest.raises(RuntimeError):
        e.record(torch.neuron.Stream(device=1))
    torch.neuron.synchronize()
