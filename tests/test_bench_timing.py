"""bench/timing.py's warm-up: it must reach both its run count and its duration."""

import time

import torch

from bench.timing import settle


def test_settle_runs_at_least_the_time_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    runs = []
    start = time.perf_counter()
    settle(lambda: runs.append(1), min_runs=2, seconds=0.05)
    assert time.perf_counter() - start >= 0.05
    assert len(runs) > 2  # a no-op call takes far less than 25 ms


def test_settle_runs_at_least_the_count_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    runs = []
    settle(lambda: runs.append(1), min_runs=7, seconds=0)
    assert len(runs) == 7


class _FakeEvent:
    """A CUDA event on a fake clock in ms that each run advances."""
    clock_ms = 0.0

    def __init__(self, enable_timing=True):
        self.at_ms = None

    def record(self):
        self.at_ms = _FakeEvent.clock_ms

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return end.at_ms - self.at_ms


def test_event_timings_are_in_microseconds(monkeypatch):
    from bench.timing import median_event_us, median_replay_us_per_layer

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    run_ms = iter([9.0, 9.0, 9.0, 1.0, 1.5, 2.0] * 2)  # warm-up runs, then timed ones

    def run():
        _FakeEvent.clock_ms += next(run_ms)

    assert median_event_us(run, replays=3, warmup=3, settle_s=0) == 1500.0

    class Graph:
        replay = staticmethod(run)

    assert median_replay_us_per_layer(Graph(), num_layers=3, replays=3, warmup=3,
                                      settle_s=0) == 500.0
