"""bench_tree_attn's plot: which rows its panels draw."""

from bench import bench_tree_attn
from bench.workload import Shape

HEADS = [(8, 1, 128), (32, 8, 128), (64, 8, 128), (16, 2, 256), (32, 4, 64)]


def _rows(batch):
    rows = []
    for ctx in (65536, 4096, 16384):
        for d, tree in ((4, "chain"), (8, "eagle"), (64, "eagle")):
            for heads in HEADS:
                s = Shape(batch, ctx, d, *heads, "fragmented", tree)
                rows.append({"shape": s.__dict__, "label": s.label(), "roofline_us": 1.0,
                             "methods": {}})
    return rows


def test_the_plot_draws_batch_1_llama_first_and_falls_back_to_the_runs_batch():
    panels = bench_tree_attn.plot_panels(_rows(1) + _rows(8))
    assert [t for t, _ in panels][0] == "bs1 D8 Hq32/Hkv8/d128" and len(panels) == 4
    assert all(r["shape"]["batch"] == 1 for _, sel in panels for r in sel)
    panels = bench_tree_attn.plot_panels(_rows(8))
    assert len(panels) == 4 and all(t.startswith("bs8 ") for t, _ in panels)
    for _, sel in panels:
        assert [r["shape"]["seq_len"] for r in sel] == [4096, 16384, 65536]
