"""The A/B table of bench/probes/ab_run.sh (bench/probes/ab_table.py)."""

import json

import pytest

from bench.probes.ab_table import format_ab, times_by_build


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
