"""Tree verify on several GPUs of one host: tensor- and context-parallel correctness,
and context-parallel latency against one GPU.

    torchrun --nproc-per-node 2 -m bench.multi_gpu --out bench_out/multi_gpu.json

One process per GPU, NCCL, NVLink multicast off (the script sets
NCCL_NVLS_ENABLE=0 before NCCL starts). Three parts, each case's result or
error recorded, never fatal:

1. Tensor parallel: the heads sharded as SGLang shards them
   (verify_ops.parallel.heads), the op on each rank's heads, the outputs
   gathered, against the float64 reference and the one-GPU op. Covers the
   8/1/128 per-rank shape with Hkv >= and < the TP size (replicated KV head).
2. Context parallel: each request's prefix KV split over the ranks
   (token-interleaved as SGLang's DCP, and in runs of 64), out + LSE per rank,
   all-gathered and merged, against the reference, with sliding window and
   sinks; and SGLang's DCP scheme (query heads sharded and gathered).
3. Latency: context parallel against one GPU at 64k, 128k and 256k. As
   bench/bench_tree_attn.py times: one CUDA graph runs N layers (each with
   its own KV), divided by N; the median of --replays replays after 0.3 s of
   replays. Every rank replays the same count in lockstep (the graphs hold
   NCCL collectives); a replay's time is the slowest rank's. "1 GPU" is
   rank 0 alone running the op on the whole context; "shard" is one rank's
   prefix op alone, without the collective, the merges and the drafts' op.
"""

from __future__ import annotations

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # before torch.distributed loads NCCL

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import verify_ops  # noqa: E402
from verify_ops.cases import make_case  # noqa: E402
from verify_ops.parallel import (context_parallel_tree_attn,  # noqa: E402
                                 decode_context_parallel_tree_attn, gather_heads,
                                 plan_context_parallel, shard_state, torch_all_gather)
from verify_ops.parallel.split_case import split_context, split_heads  # noqa: E402

from .timing import SETTLE_S, capture_graph, median_replay_us_per_layer  # noqa: E402
from .workload import Shape, make_workload  # noqa: E402

CHECK_TOL = 1e-2
CHECK_LENS = [0, 1, 4096, 20001]


def error_text(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", default="65536,131072,262144")
    p.add_argument("--batches", default="1")
    p.add_argument("--drafts", default="8")
    p.add_argument("--heads", default="32/8/128,8/1/128", help="Hq/Hkv/d of the latency cases")
    p.add_argument("--interleave", type=int, default=1, help="positions per run in latency cases")
    p.add_argument("--replays", type=int, default=15)
    p.add_argument("--parts", default="tp,cp,latency")
    p.add_argument("--out", default="bench_out/multi_gpu.json")
    return p.parse_args(argv)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


# --- 1. tensor parallel ---------------------------------------------------------------

TP_CASES = [  # global Hq/Hkv/d; the per-rank shape at TP2 in the comment
    ((16, 2, 128), dict()),                  # 8/1/128
    ((16, 1, 128), dict()),                  # 8/1/128, KV head replicated
    ((64, 8, 128), dict()),                  # 32/4/128
    ((16, 1, 128), dict(sinks=True, sliding_window=4096)),
]


def tensor_parallel_checks(rank: int, world: int) -> list[dict]:
    all_gather, rows = torch_all_gather(), []
    for (hq, hkv, hd), options in TP_CASES:
        per_rank = f"{hq // world}/{max(1, hkv // world)}/{hd}"
        row = {"heads": f"{hq}/{hkv}/{hd}", "per_rank": per_rank, "options": dict(options),
               "seq_lens": CHECK_LENS}
        try:
            case = make_case(CHECK_LENS, 8, hq, hkv, hd, device="cuda", tree="eagle", seed=1,
                             **options)
            mine = split_heads(case, world, rank)
            out = gather_heads(verify_ops.tree_attn(*mine.args(), **mine.options), all_gather,
                               world)
            one_gpu = verify_ops.tree_attn(*case.args(), **case.options)
            ref = verify_ops.tree_attn_ref(*case.args(), **case.options)
            row.update(rel_err=verify_ops.relative_error(out, ref),
                       rel_err_one_gpu=verify_ops.relative_error(one_gpu, ref),
                       equal_to_one_gpu=bool(torch.equal(out, one_gpu)))
            row["ok"] = row["rel_err"] < CHECK_TOL
        except Exception as exc:  # recorded; the same on every rank (argument checks)
            row["error"] = error_text(exc)
        rows.append(row)
    return rows


# --- 2. context parallel --------------------------------------------------------------

CP_CASES = [
    ("cp", (32, 8, 128), 1, dict()),
    ("cp", (32, 8, 128), 64, dict()),
    ("cp", (64, 8, 128), 1, dict(sinks=True, sliding_window=4096)),
    ("cp", (8, 1, 128), 1, dict(logit_cap=30.0, sliding_window=7)),
    ("dcp", (16, 2, 128), 1, dict()),         # per rank 8 query heads, 2 KV heads
    ("dcp", (16, 1, 128), 1, dict(sinks=True, sliding_window=4096)),
]


def context_parallel_checks(rank: int, world: int) -> list[dict]:
    all_gather, rows = torch_all_gather(), []
    for mode, (hq, hkv, hd), interleave, options in CP_CASES:
        row = {"mode": mode, "heads": f"{hq}/{hkv}/{hd}", "interleave": interleave,
               "options": dict(options), "seq_lens": CHECK_LENS}
        try:
            case = make_case(CHECK_LENS, 8, hq, hkv, hd, device="cuda", tree="eagle", seed=2,
                             **options)
            scales = dict(case.options)
            window, sinks = scales.pop("sliding_window", -1), scales.pop("sinks", None)
            shard = split_context(case, world, rank, interleave)
            plan = plan_context_parallel(shard.local_rows, case.seq_lens, case.tree_mask, world,
                                         rank, interleave_size=interleave, sliding_window=window)
            if mode == "cp":
                out = context_parallel_tree_attn(case.q, shard.k_cache, shard.v_cache,
                                                 shard.draft_k, shard.draft_v, plan,
                                                 case.sm_scale, all_gather, sinks=sinks, **scales)
            else:
                heads = slice(rank * hq // world, (rank + 1) * hq // world)
                out = decode_context_parallel_tree_attn(
                    case.q[:, heads], shard.k_cache, shard.v_cache, shard.draft_k, shard.draft_v,
                    plan, case.sm_scale, all_gather,
                    sinks=None if sinks is None else sinks[heads], **scales)
                out = gather_heads(out, all_gather, world)
            ref = verify_ops.tree_attn_ref(*case.args(), **case.options)
            row["rel_err"] = verify_ops.relative_error(out, ref)
            row["ok"] = row["rel_err"] < CHECK_TOL
        except Exception as exc:
            row["error"] = error_text(exc)
        rows.append(row)
    return rows


# --- 3. latency ------------------------------------------------------------------------

def lockstep_us(run, num_layers: int, replays: int) -> float:
    """Median µs per layer of ``run``, every rank running the same count: warm-up
    runs for SETTLE_S (the count agreed over the ranks), then ``replays`` timed
    ones, each started after a barrier; a run's time is the slowest rank's."""
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    count = torch.tensor([max(3, int(SETTLE_S / max(time.perf_counter() - start, 1e-6)))],
                         device="cuda")
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    for _ in range(int(count)):
        run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        dist.barrier()
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run()
        end.record()
        end.synchronize()
        us = torch.tensor([begin.elapsed_time(end) * 1e3], device="cuda")
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        samples.append(float(us) / num_layers)
    return statistics.median(samples)


def timed_us(step, num_layers: int, replays: int, row: dict, key: str) -> None:
    """``row[key]``: µs per layer of ``step`` captured in a CUDA graph. Where the
    capture fails on any rank, every rank times ``step`` eagerly instead and
    ``row[key + '_timing']`` says why (launch overhead then counts)."""
    graph, why = None, None
    try:
        graph = capture_graph(step)
    except Exception as exc:
        why = error_text(exc)
    captured = torch.tensor([graph is not None], dtype=torch.int32, device="cuda")
    dist.all_reduce(captured, op=dist.ReduceOp.MIN)
    if captured.item():
        row[key] = lockstep_us(graph.replay, num_layers, replays)
        row[key + "_timing"] = "graph"
    else:
        del graph
        row[key] = lockstep_us(step, num_layers, replays)
        row[key + "_timing"] = f"eager: {why or 'the capture failed on another rank'}"
        print(f"rank {dist.get_rank()}: {key} timed eagerly, {row[key + '_timing']}", flush=True)


def latency_case(shape: Shape, rank: int, world: int, interleave: int, replays: int) -> dict:
    """One GPU against context parallel over ``world`` ranks, per layer."""
    row = {"shape": shape.__dict__, "label": shape.label(), "world": world,
           "interleave": interleave}
    torch.manual_seed(0)  # make_workload draws K/V from the global RNG: the same on every rank
    work = make_workload(shape, seed=3)
    num_layers = len(work.layers)
    row["num_layers"] = num_layers
    cases = [work.case(i) for i in range(num_layers)]
    all_gather = torch_all_gather()

    # One GPU: rank 0 alone; the others wait at the next barrier.
    if rank == 0:
        outs = [torch.empty_like(c.q) for c in cases]
        graph = capture_graph(lambda: [verify_ops.tree_attn_out(*c.args(), o)
                                       for c, o in zip(cases, outs)])
        row["one_gpu_us"] = median_replay_us_per_layer(graph, num_layers, replays)
        del graph, outs
    dist.barrier()

    shards = [split_context(c, world, rank, interleave) for c in cases]
    plan = plan_context_parallel(shards[0].local_rows, work.seq_lens, work.tree_mask, world, rank,
                                 interleave_size=interleave)
    try:
        timed_us(lambda: [shard_state(c.q, s.k_cache, s.v_cache, plan, c.sm_scale)
                          for c, s in zip(cases, shards)], num_layers, replays, row, "shard_us")
        timed_us(lambda: [context_parallel_tree_attn(c.q, s.k_cache, s.v_cache, s.draft_k,
                                                     s.draft_v, plan, c.sm_scale, all_gather)
                          for c, s in zip(cases, shards)], num_layers, replays, row, "cp_us")
    except Exception as exc:  # the same on every rank: the op refuses (e.g. no LSE yet)
        row["error"] = error_text(exc)
    # Correctness of layer 0 against the one-GPU op (the reference at 256k is slow).
    try:
        cp = context_parallel_tree_attn(cases[0].q, shards[0].k_cache, shards[0].v_cache,
                                        shards[0].draft_k, shards[0].draft_v, plan,
                                        cases[0].sm_scale, all_gather)
        row["rel_err_vs_one_gpu"] = verify_ops.relative_error(
            cp.float(), verify_ops.tree_attn(*cases[0].args()).float())
    except Exception as exc:
        row.setdefault("error", error_text(exc))
    del work, cases, shards
    torch.cuda.empty_cache()
    return row


# --- output ---------------------------------------------------------------------------

def format_tables(result: dict) -> str:
    lines = []
    if "tp" in result:
        lines.append("tensor parallel (gathered heads vs the float64 reference)")
    for r in result.get("tp", []):
        status = (f"rel err {r['rel_err']:.2e} (one GPU {r['rel_err_one_gpu']:.2e}, "
                  f"bitwise equal {r['equal_to_one_gpu']})" if "rel_err" in r else r["error"])
        lines.append(f"  {r['heads']:>10} -> {r['per_rank']:>9}/rank {str(r['options']):44} "
                     f"{status}")
    if "cp" in result:
        lines.append("context parallel (merged vs the float64 reference)")
    for r in result.get("cp", []):
        status = f"rel err {r['rel_err']:.2e}" if "rel_err" in r else r["error"]
        lines.append(f"  {r['mode']:>4} {r['heads']:>10} interleave {r['interleave']:<3} "
                     f"{str(r['options']):44} {status}")
    rows = result.get("latency", [])
    if rows:
        head = (f"{'case':34} {'N':>3} {'1 GPU us':>9} {'CP us':>8} {'speedup':>8} "
                f"{'shard us':>9} {'rest us':>8} {'err vs 1 GPU':>12}")
        lines += [f"latency, context parallel over {rows[0]['world']} GPUs", head,
                  "-" * len(head)]
        for r in rows:
            one, cp, shard = (r.get(k, float("nan")) for k in ("one_gpu_us", "cp_us", "shard_us"))
            lines.append(f"{r['label']:34} {r['num_layers']:>3} {one:>9.1f} {cp:>8.1f} "
                         f"{one / cp:>8.2f} {shard:>9.1f} {cp - shard:>8.1f} "
                         f"{r.get('rel_err_vs_one_gpu', float('nan')):>12.2e}"
                         + (f"  {r['error']}" if "error" in r else ""))
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    if world < 2 or not verify_ops.has_cuda_kernel():
        raise SystemExit(f"needs >= 2 ranks and a CUDA build of verify_ops (world {world})")
    parts = args.parts.split(",")
    result = {"meta": {
        "command": " ".join([f"torchrun --nproc-per-node {world} -m bench.multi_gpu"]
                            + (argv or sys.argv[1:])),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "world": world, "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "NCCL_NVLS_ENABLE": os.environ["NCCL_NVLS_ENABLE"], "python": platform.python_version()}}

    def save():
        if rank == 0 and args.out:
            os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    if "tp" in parts:
        result["tp"] = tensor_parallel_checks(rank, world)
        save()
    if "cp" in parts:
        result["cp"] = context_parallel_checks(rank, world)
        save()
    if "latency" in parts:
        result["latency"] = []
        for batch in ints(args.batches):
            for (hq, hkv, hd) in [tuple(ints(h.replace("/", ","))) for h in args.heads.split(",")]:
                for ctx in ints(args.contexts):
                    for d in ints(args.drafts):
                        shape = Shape(batch, ctx, d, hq, hkv, hd, "fragmented")
                        row = latency_case(shape, rank, world, args.interleave, args.replays)
                        result["latency"].append(row)
                        if rank == 0:
                            print(f"{shape.label()}: {row}", flush=True)
                        save()
    if rank == 0:
        print(format_tables(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
