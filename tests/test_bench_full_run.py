"""bench/full_run.py: its parts parse, cover every default case once, and time
Triton wherever issue 4's 64k target needs it."""

import collections

from bench import bench_tree_attn, floor_probe, full_run


def _bench_parts():
    return [p for p in full_run.PARTS if p.module == "bench_tree_attn"]


def _cases_with_methods(part):
    """(shape, methods run on it) for each case of a bench_tree_attn part."""
    args = bench_tree_attn.parse_args(part.argv("out"))
    for shape in bench_tree_attn.shapes_of(args):
        yield shape, bench_tree_attn.methods_for(shape, args, args.methods.split(","))


def test_every_part_parses_with_its_modules_flags_and_writes_under_out_dir():
    for part in full_run.PARTS:
        module = bench_tree_attn if part.module == "bench_tree_attn" else floor_probe
        args = module.parse_args(part.argv("some/dir"))
        assert args.out == f"some/dir/{part.name}.json"
    assert len({p.name for p in full_run.PARTS}) == len(full_run.PARTS)


def test_the_timing_parts_cover_every_default_case_once_with_flex_on_a_sample():
    defaults = bench_tree_attn.shapes_of(bench_tree_attn.parse_args([]))
    timed = collections.Counter()
    flex = set()
    for part in _bench_parts():
        for shape, methods in _cases_with_methods(part):
            if "flex" in methods:
                flex.add(shape)
            else:
                timed[shape] += 1
    assert sorted(timed, key=str) == sorted(defaults, key=str) and set(timed.values()) == {1}
    assert {(s.num_q_heads, s.num_kv_heads, s.head_dim) for s in flex} == {
        (8, 1, 128), (32, 8, 128), (64, 8, 128), (16, 2, 256), (32, 4, 64)}


def test_triton_runs_at_batch_1_64k_for_every_draft_count_head_shape_and_layout():
    with_triton = {shape for part in _bench_parts() for shape, methods in _cases_with_methods(part)
                   if "triton" in methods}
    defaults = bench_tree_attn.shapes_of(bench_tree_attn.parse_args([]))
    needed = {s for s in defaults if s.batch == 1 and s.seq_len == 65536}
    assert len(needed) == 40 and needed <= with_triton


def test_list_prints_each_parts_exact_command(capsys):
    full_run.main(["--list", "--out-dir", "o"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(full_run.PARTS)
    assert lines[0].startswith("1. bs1-64k: python -m bench.bench_tree_attn --batches 1")
    assert lines[0].endswith("--out o/bs1-64k.json --plot o/bs1-64k.png")
    assert lines[-1].endswith("--out o/floor-bs1-4k.json")

