"""bench/probes/cta_stamps.py: the summary of a layer's stamp rows, and its refusal
without a probing build."""

import pytest
import torch

from bench.probes.cta_stamps import SLOTS, require_stamp_build, summarize


def row(waited, loop_end, end, sm, tiles):
    r = [0] * SLOTS
    r[0], r[1], r[2], r[3], r[4] = waited - 100, waited, loop_end, end, (sm << 32) | tiles
    return r


def test_summary_of_rates_ends_and_tails():
    rows = [
        row(1_000, 1_000 + 10 * 2_000, 1_000 + 10 * 2_000 + 500, sm=0, tiles=10),
        row(1_200, 1_200 + 10 * 2_000, 1_200 + 10 * 2_000 + 700, sm=1, tiles=10),
        row(1_000, 1_000 + 10 * 1_500, 1_000 + 10 * 1_500 + 300, sm=2, tiles=10),  # fast
        row(1_100, 1_100 + 20 * 2_100, 1_100 + 20 * 2_100 + 900, sm=3, tiles=20),
        [0] * SLOTS,  # a CTA that was not stamped
        row(1_000, 1_000, 1_050, sm=4, tiles=0),  # a split without KV: no rate
    ]
    s = summarize(rows)
    assert s["ctas"] == 5
    assert s["sms"] == 4
    assert s["ns_per_tile_min_median_max"] == [1_500, 2_000, 2_100]
    assert s["fast_sms"] == [2]
    ends = [(r[3] - 1_000) / 1e3 for r in rows if r[1]]
    assert s["end_us_min_mean_max"] == pytest.approx([min(ends), sum(ends) / 5, max(ends)])
    assert s["after_loop_us_median_max"] == pytest.approx([0.5, 0.9])


def test_rows_without_stamps_are_an_error_that_says_why():
    with pytest.raises(ValueError, match="VERIFY_OPS_CTA_STAMPS"):
        summarize([[0] * SLOTS])


def test_a_build_without_stamps_is_refused():
    try:
        torch.ops.verify_stamps.read
    except (AttributeError, RuntimeError):
        pass  # the shipped builds, CPU or CUDA, never define verify_stamps
    else:
        pytest.skip("this is a probing build (VERIFY_OPS_CTA_STAMPS=1)")
    with pytest.raises(SystemExit, match="VERIFY_OPS_CTA_STAMPS=1"):
        require_stamp_build()
