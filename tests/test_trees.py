import numpy as np
import pytest
import torch

from verify_ops import trees


def brute_force_mask(parents):
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


@pytest.mark.parametrize("seed", range(5))
def test_parents_to_mask_matches_ancestor_walk(seed):
    parents = trees.random_tree(20, torch.Generator().manual_seed(seed))
    assert torch.equal(trees.parents_to_mask(parents), brute_force_mask(parents))


def test_parents_to_mask_rejects_forward_parent():
    with pytest.raises(ValueError, match=r"parents\[1\]"):
        trees.parents_to_mask([-1, 1])


@pytest.mark.parametrize("topk,depth,num_drafts", [(1, 4, 5), (2, 3, 6), (4, 5, 16), (8, 8, 64)])
def test_eagle_tree_shape(topk, depth, num_drafts):
    parents = trees.eagle_tree(topk, depth, num_drafts, torch.Generator().manual_seed(1))
    assert len(parents) == num_drafts and parents[0] == -1
    assert all(0 <= p < i for i, p in enumerate(parents) if i > 0)
    children = torch.bincount(torch.tensor(parents[1:]), minlength=num_drafts)
    assert int(children.max()) <= topk
    mask = trees.parents_to_mask(parents)
    assert int(mask.sum(1).max()) <= depth + 1  # root plus at most `depth` levels
    if topk > 1 and num_drafts > topk + 1:
        assert int(mask.sum(1).max()) < num_drafts  # a real tree, not a chain


def test_eagle_tree_rejects_too_many_drafts():
    with pytest.raises(ValueError, match="num_draft_tokens"):
        trees.eagle_tree(2, 2, 8)


def test_full_mask_round_trip():
    gen = torch.Generator().manual_seed(0)
    masks = torch.stack([trees.parents_to_mask(trees.random_tree(5, gen)) for _ in range(3)])
    lens = torch.tensor([0, 3, 7])
    full = trees.qlen_only_to_full_mask(masks, lens)
    assert full.numel() == sum(5 * (n + 5) for n in lens.tolist())
    assert torch.equal(trees.full_mask_to_qlen_only(full, lens, 5), masks)
    with pytest.raises(ValueError, match="cells"):
        trees.full_mask_to_qlen_only(full[:-1], lens, 5)


@pytest.mark.parametrize("rows,cols", [(4, 1), (4, 7), (4, 8), (4, 13), (4, 64), (0, 8), (4, 0)])
def test_pack_mask_matches_numpy(rows, cols):
    mask = torch.rand(3, rows, cols, generator=torch.Generator().manual_seed(cols)) > 0.5
    packed = trees.pack_mask(mask)
    expected = np.packbits(mask.numpy(), axis=-1, bitorder="little")
    assert np.array_equal(packed.numpy(), expected)
    assert torch.equal(trees.unpack_mask(packed, cols), mask)
