"""The fragmentation metric: runs of consecutive slots per request, mean and p99."""

import pytest
import torch

import verify_ops.fragmentation
from verify_ops import Fragmentation, measure_fragmentation, runs_per_request
from verify_ops.cases import make_slot_layout


def runs_by_loop(req_to_token, req_pool_indices, seq_lens):
    """Plain reference: walk every request's slots."""
    counts = []
    for row, n in zip(req_pool_indices.tolist(), seq_lens.tolist()):
        slots = req_to_token[row, :n].tolist()
        counts.append(sum(1 for i in range(n) if i == 0 or slots[i] != slots[i - 1] + 1))
    return torch.tensor(counts, dtype=torch.int64)


def test_hand_examples(device):
    req_to_token = torch.tensor([[5, 6, 7, 2, 3, 9, 0, 0],
                                 [10, 11, 12, 13, 14, 15, 16, 17],
                                 [4, 3, 2, 1, 8, 8, 8, 8]], dtype=torch.int32, device=device)
    rows = torch.tensor([0, 1, 2, 0, 1, 2], device=device)
    lens = torch.tensor([6, 8, 4, 0, 1, 5], device=device)
    # [5,6,7][2,3][9]: 3; one run; descending: 4 runs; empty: 0; one token: 1;
    # a repeated slot is not a successor: 5 runs.
    assert runs_per_request(req_to_token, rows, lens).tolist() == [3, 1, 4, 0, 1, 5]


def test_cells_past_seq_len_are_ignored(device):
    contiguous = torch.arange(1, 101, device=device)[None].repeat(2, 1)
    contiguous[:, 50:] = torch.randperm(50, device=device) + 500  # garbage past the lengths
    runs = runs_per_request(contiguous, torch.tensor([0, 1], device=device),
                            torch.tensor([50, 49], device=device))
    assert runs.tolist() == [1, 1]


@pytest.mark.parametrize("layout", ["fragmented", "contiguous"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_matches_a_plain_loop(device, layout, index_dtype):
    gen = torch.Generator().manual_seed(3)
    tokens = [0, 1, 2, 37, 300, 5, 64]
    slots = make_slot_layout(tokens, layout, spare_slots=32, gen=gen)
    lens = torch.tensor(tokens)
    expected = runs_by_loop(slots.req_to_token, slots.req_pool_indices, lens)
    got = runs_per_request(slots.req_to_token.to(index_dtype).to(device),
                           slots.req_pool_indices.to(index_dtype).to(device),
                           lens.to(index_dtype).to(device))
    assert torch.equal(got.cpu(), expected)
    if layout == "contiguous":
        assert got.tolist() == [min(n, 1) for n in tokens]


def test_chunks_give_the_same_answer(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 200, (40,), generator=gen).tolist()
    slots = make_slot_layout(tokens, "fragmented", spare_slots=8, gen=gen)
    lens = torch.tensor(tokens)
    whole = runs_per_request(slots.req_to_token, slots.req_pool_indices, lens)
    width = slots.req_to_token.shape[1]
    monkeypatch.setattr(verify_ops.fragmentation, "_CELLS_PER_CHUNK", width * 3)
    chunked = runs_per_request(slots.req_to_token, slots.req_pool_indices, lens)
    assert torch.equal(whole, chunked)
    assert torch.equal(whole, runs_by_loop(slots.req_to_token, slots.req_pool_indices, lens))


def test_summary_mean_and_p99():
    runs = torch.cat([torch.ones(98, dtype=torch.int64), torch.tensor([50, 200])])
    f = Fragmentation.of(runs)
    assert f == Fragmentation(mean_runs=(98 + 250) / 100, p99_runs=50.0, num_requests=100)
    assert Fragmentation.of(torch.zeros(0, dtype=torch.int64)) == Fragmentation(0.0, 0.0, 0)


def test_fragmentation_of_a_batch(device):
    req_to_token = torch.tensor([[1, 2, 3, 4], [9, 7, 5, 3]], device=device)
    f = measure_fragmentation(req_to_token, torch.tensor([0, 1], device=device),
                      torch.tensor([4, 4], device=device))
    assert f == Fragmentation(mean_runs=2.5, p99_runs=4.0, num_requests=2)
    empty = measure_fragmentation(req_to_token, torch.zeros(0, dtype=torch.int64, device=device),
                          torch.zeros(0, dtype=torch.int64, device=device))
    assert empty.num_requests == 0
