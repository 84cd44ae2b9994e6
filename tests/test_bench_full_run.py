"""bench/full_run.py: its parts parse, cover every case of the default table once
with verify_ops and FlashInfer, and time Triton where the targets need it."""

import collections

import pytest

from bench import bench_tree_attn, full_run
from bench.probes import floor_probe


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


def test_the_table_parts_time_every_default_case_once_with_verify_ops_and_flashinfer():
    defaults = bench_tree_attn.shapes_of(bench_tree_attn.parse_args([]))
    timed = collections.Counter()
    flex = set()
    for part in _bench_parts():
        for shape, methods in _cases_with_methods(part):
            if "flex" in methods:
                flex.add(shape)
            else:
                assert {"verify_ops", "flashinfer"} <= set(methods), shape
                timed[shape] += 1
    assert sorted(timed, key=str) == sorted(defaults, key=str) and set(timed.values()) == {1}
    assert {(s.num_q_heads, s.num_kv_heads, s.head_dim) for s in flex} == {
        (8, 1, 128), (32, 8, 128), (64, 8, 128), (16, 2, 256), (32, 4, 64)}


def test_triton_runs_at_batch_1_64k_for_every_draft_count_and_head_shape():
    with_triton = {shape for part in _bench_parts() for shape, methods in _cases_with_methods(part)
                   if "triton" in methods}
    defaults = bench_tree_attn.shapes_of(bench_tree_attn.parse_args([]))
    needed = {s for s in defaults if s.batch == 1 and s.seq_len == 65536}
    assert len(needed) == 25 and needed <= with_triton
    assert all(s.seq_len <= 65536 or s.num_drafts == 8 for s in with_triton)


def test_list_prints_each_parts_exact_command(capsys):
    full_run.main(["--list", "--out-dir", "o"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(full_run.PARTS) + 1
    assert lines[0].startswith("1. bs1-4k16k: python -m bench.bench_tree_attn --batches 1")
    assert lines[0].endswith("--out o/bs1-4k16k.json --plot o/bs1-4k16k.png")
    assert lines[-2] == ("7. floor-bs1-4k: python -m bench.probes.floor_probe --batches 1 "
                         "--contexts 4096 --out o/floor-bs1-4k.json")
    assert lines[-1].startswith("readme: python -m bench.bench_tree_attn --cases 1/4096/4/")


def test_readme_and_part_are_not_taken_together(capsys):
    with pytest.raises(SystemExit):
        full_run.parse_args(["--readme", "--part", "1"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_readme_part_times_every_method_on_each_of_its_rows():
    args = bench_tree_attn.parse_args(full_run.README_PART.argv("o"))
    shapes = bench_tree_attn.shapes_of(args)
    assert len(shapes) == len(full_run.README_CASES)
    chains = [s for s in shapes if s.tree == "chain"]
    assert chains and all(s.num_drafts == 4 for s in chains)
    assert {s.seq_len for s in shapes} >= {4096, 65536, 131072, 262144}
    for shape in shapes:
        methods = bench_tree_attn.methods_for(shape, args, args.methods.split(","))
        assert methods == ["verify_ops", "flashinfer", "fa3", "triton", "sdpa"], shape
