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
