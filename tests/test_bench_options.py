"""bench/options_bench.py's roofline arithmetic (the GPU timing itself runs on the box)."""

from bench.options_bench import FP8, PLAIN, WINDOW, Variant, roofline_work
from bench.workload import Shape

LONG = Shape(1, 65536, 8, 8, 1, 64, "fragmented")


def test_plain_and_fp8_count_the_whole_context():
    assert roofline_work(LONG, PLAIN) == (LONG.kv_bytes, LONG.flops)
    assert roofline_work(LONG, FP8[0]) == (LONG.kv_bytes // 2, LONG.flops)


def test_a_window_counts_its_keys_and_the_drafts_for_bytes_and_flops_alike():
    kv_bytes, flops = roofline_work(LONG, WINDOW)
    seen = 128 + 8
    assert kv_bytes == 2 * seen * 1 * 64 * 2  # K and V, 1 KV head, d 64, bf16
    assert flops == 4 * 64 * 8 * 8 * seen    # 4 d Hq D keys
    fp8_window = Variant("fp8 window", "e4m3", (("sliding_window", 128),))
    assert roofline_work(LONG, fp8_window) == (kv_bytes // 2, flops)


def test_a_window_wider_than_the_context_changes_nothing():
    short = Shape(1, 100, 8, 8, 1, 64, "fragmented")
    assert roofline_work(short, WINDOW) == (short.kv_bytes, short.flops)
