"""The kernel table's cases: the product of the lists, explicit --cases, chains,
the layer count of each case, and which methods run where."""

import pytest

from bench.bench_tree_attn import methods_for, parse_args, shapes_of
from bench.workload import KV_BYTES_PER_CASE, Shape, parse_case


def test_cases_replace_the_product_of_the_lists():
    args = parse_args(["--cases", "1/65536/16/64/8/128/fragmented,8/4096/8/32/8/128/contiguous"])
    assert shapes_of(args) == [Shape(1, 65536, 16, 64, 8, 128, "fragmented"),
                               Shape(8, 4096, 8, 32, 8, 128, "contiguous")]
    assert len(shapes_of(parse_args(["--batches", "1", "--contexts", "4096"]))) == 5 * 5


def test_a_case_may_name_its_tree():
    assert parse_case("1/4096/4/8/1/128/fragmented/chain") == Shape(
        1, 4096, 4, 8, 1, 128, "fragmented", "chain")
    with pytest.raises(ValueError, match="tree one of"):
        parse_case("1/4096/4/8/1/128/fragmented/star")


def test_a_malformed_case_names_the_expected_form():
    with pytest.raises(ValueError, match="batch/context/drafts/Hq/Hkv/head_dim/layout"):
        shapes_of(parse_args(["--cases", "1/4096/8"]))


def test_the_default_table_runs_d4_as_a_chain_and_the_rest_as_eagle_trees():
    shapes = shapes_of(parse_args([]))
    assert len(shapes) == 2 * 5 * 5 * 5
    assert {s.seq_len for s in shapes} == {4096, 16384, 65536, 131072, 262144}
    assert {(s.num_drafts, s.tree) for s in shapes} == {
        (4, "chain"), (8, "eagle"), (16, "eagle"), (32, "eagle"), (64, "eagle")}
    assert {s.layout for s in shapes} == {"fragmented"}


def test_flashinfer_runs_on_every_case_and_the_slow_baselines_where_the_lists_say():
    args = parse_args(["--baseline-drafts", "8", "--baseline-contexts", "65536"])
    methods = ["verify_ops", "flashinfer", "triton", "sdpa"]
    assert methods_for(Shape(8, 262144, 64, 64, 8, 128, "fragmented"), args, methods) == [
        "verify_ops", "flashinfer"]
    assert methods_for(Shape(1, 65536, 8, 8, 1, 128, "fragmented"), args, methods) == methods
    only_ours = parse_args(["--every-case-methods", "verify_ops"])
    assert methods_for(Shape(1, 4096, 8, 8, 1, 128, "fragmented"), only_ours,
                       ["verify_ops", "flashinfer"]) == ["verify_ops", "flashinfer"]
    assert methods_for(Shape(1, 4096, 8, 8, 1, 128, "fragmented"),
                       parse_args(["--every-case-methods", "verify_ops", "--baseline-drafts", "64"]),
                       ["verify_ops", "flashinfer"]) == ["verify_ops"]


def test_layers_stream_4x_the_l2_and_a_case_holds_at_most_its_kv_budget():
    small = Shape(1, 4096, 8, 8, 1, 128, "fragmented")
    assert small.num_layers == 64  # 2 MB a layer
    assert Shape(1, 65536, 8, 32, 8, 128, "fragmented").num_layers == 8
    for context in (65536, 131072):  # every case up to 128k keeps 8 layers
        assert Shape(8, context, 64, 64, 8, 128, "fragmented").num_layers == 8
    biggest = Shape(8, 262144, 64, 64, 8, 128, "fragmented")
    assert biggest.num_layers == 4
    assert biggest.num_layers * biggest.kv_bytes <= KV_BYTES_PER_CASE
