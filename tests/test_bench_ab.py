"""The A/B table (bench/ab_table.py) and explicit benchmark cases (--cases)."""

import json

import pytest

from bench.ab_table import format_ab, times_by_build
from bench.bench_tree_attn import parse_args, shapes_of
from bench.workload import Shape


def _write(path, times):
    rows = [{"label": label, "methods": {"verify_ops": {"us": us}}} for label, us in times.items()]
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    return str(path)


def test_speedup_is_base_median_over_candidate_median(tmp_path):
    paths = [_write(tmp_path / "ab-base-r1.json", {"a": 10.0, "b": 4.0}),
             _write(tmp_path / "ab-base-r2.json", {"a": 12.0, "b": 4.0}),
             _write(tmp_path / "ab-cand-r1.json", {"a": 5.0, "b": 8.0}),
             _write(tmp_path / "ab-cand-r2.json", {"a": 6.0, "b": 8.0})]
    builds = times_by_build(paths)
    assert builds["base"]["a"] == [10.0, 12.0]
    table = format_ab(builds)
    assert "2.000" in table.splitlines()[1]  # a: 11 / 5.5
    assert "0.500" in table.splitlines()[2]  # b: 4 / 8
    assert "geometric mean speedup 1.000 over 2 cases (1 at >= 1)" in table


def test_result_files_must_be_named_by_build_and_round(tmp_path):
    with pytest.raises(ValueError, match="ab-<build>-r<round>"):
        times_by_build([_write(tmp_path / "base.json", {"a": 1.0})])


def test_cases_replace_the_product_of_the_lists():
    args = parse_args(["--cases", "1/65536/16/64/8/128/fragmented,8/4096/8/32/8/128/contiguous"])
    assert shapes_of(args) == [Shape(1, 65536, 16, 64, 8, 128, "fragmented"),
                               Shape(8, 4096, 8, 32, 8, 128, "contiguous")]
    assert len(shapes_of(parse_args(["--batches", "1", "--contexts", "4096"]))) == 4 * 5 * 2


def test_a_malformed_case_names_the_expected_form():
    with pytest.raises(ValueError, match="batch/context/drafts/Hq/Hkv/head_dim/layout"):
        shapes_of(parse_args(["--cases", "1/4096/8"]))
