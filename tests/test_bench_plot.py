"""bench_tree_attn's plot: which rows its panels draw, on the committed v15 runs."""

import json
import os

from bench import bench_tree_attn


def _committed_rows(name):
    path = os.path.join(os.path.dirname(__file__), "..", "bench", "results", name)
    with open(path) as f:
        return json.load(f)["rows"]


def test_the_plot_draws_batch_1_and_falls_back_to_the_runs_batch():
    panels = bench_tree_attn.plot_panels(_committed_rows("h200-v15-bs1-64k-2026-12-01.json")
                                         + _committed_rows("h200-v15-bs8-2026-12-01.json"))
    assert [t for t, _ in panels][0] == "bs1 D8 Hq32/Hkv8/d128" and len(panels) == 4
    assert all(r["shape"]["batch"] == 1 for _, sel in panels for r in sel)
    panels = bench_tree_attn.plot_panels(_committed_rows("h200-v15-bs8-2026-12-01.json"))
    assert len(panels) == 4 and all(t.startswith("bs8 ") for t, _ in panels)
    for _, sel in panels:
        assert [r["shape"]["seq_len"] for r in sel] == [4096, 16384, 65536]
