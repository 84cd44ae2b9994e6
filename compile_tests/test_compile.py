"""torch.compile(fullgraph=True) around a verify attention layer: dynamic batch, no recompiles."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from verify_ops.cases import make_case
from verify_ops.reference import relative_error, tree_attn_ref

NUM_DRAFTS, HQ, HKV, HEAD_DIM = 4, 4, 2, 64


class VerifyAttention(torch.nn.Module):
    """QKV projection, tree attention through the out-variant, output projection."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(HQ * HEAD_DIM, (HQ + 2 * HKV) * HEAD_DIM, bias=False)
        self.o_proj = torch.nn.Linear(HQ * HEAD_DIM, HQ * HEAD_DIM, bias=False)

    def forward(self, hidden, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                tree_mask):
        q = self.qkv(hidden)[:, : HQ * HEAD_DIM].view(-1, HQ, HEAD_DIM)  # a strided view
        out = torch.empty_like(q)
        torch.ops.verify.tree_attn_out(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                       seq_lens, tree_mask, HEAD_DIM ** -0.5, out)
        return self.o_proj(out.view(-1, HQ * HEAD_DIM)), q


POOL_CASE = make_case([7, 0, 33, 1, 48], NUM_DRAFTS, HQ, HKV, HEAD_DIM, dtype=torch.float32,
                      seed=0)


def inputs(batch, seed):
    """The first `batch` requests of one fixed pool, as a server's batches are."""
    case = POOL_CASE
    hidden = torch.randn(batch * NUM_DRAFTS, HQ * HEAD_DIM,
                         generator=torch.Generator().manual_seed(seed))
    args = [hidden, case.k_cache, case.v_cache, case.req_to_token,
            case.req_pool_indices[:batch].clone(), case.seq_lens[:batch].clone(),
            case.tree_mask[:batch].clone()]
    for t in (args[0], args[4], args[5], args[6]):
        torch._dynamo.mark_dynamic(t, 0)
    return args


def test_dynamic_batch_compiles_once():
    torch._dynamo.reset()
    layer = VerifyAttention()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    for seed, batch in enumerate((2, 3, 5)):
        args = inputs(batch, seed)
        out, q = compiled(*args)
        expected, _ = layer(*args)
        assert out.shape == (batch * NUM_DRAFTS, HQ * HEAD_DIM)
        assert relative_error(out, expected) < 1e-5
        attn = tree_attn_ref(q.detach(), *args[1:], HEAD_DIM ** -0.5)
        assert relative_error(layer.o_proj(attn.float().view(-1, HQ * HEAD_DIM)), out) < 1e-5
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
