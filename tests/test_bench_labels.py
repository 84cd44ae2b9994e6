"""Benchmark case labels name the context exactly (they key the result tables)."""

from bench.workload import Shape


def _label(seq_len):
    return Shape(1, seq_len, 8, 32, 8, 128, "fragmented").label()


def test_whole_kibitokens_print_as_k():
    assert _label(4096) == "bs1 L4k D8 32/8/128 frag"
    assert _label(65536).startswith("bs1 L64k ")
    assert _label(262144).startswith("bs1 L256k ")


def test_other_contexts_print_exactly():
    assert _label(64).startswith("bs1 L64 ")
    assert _label(0).startswith("bs1 L0 ")
    assert _label(1536).startswith("bs1 L1536 ")


def test_a_chain_says_so_and_an_eagle_tree_keeps_the_old_label():
    assert Shape(1, 4096, 4, 8, 1, 128, "fragmented", "chain").label() == (
        "bs1 L4k D4 8/1/128 frag chain")
    assert Shape(1, 4096, 8, 8, 1, 128, "fragmented", "eagle").label() == (
        "bs1 L4k D8 8/1/128 frag")
