"""The least time per layer any one-kernel tree verify pays under the bench's timing protocol.

    python -m bench.probes.floor_probe     # every case of bench_tree_attn; JSON in bench_out/

Each case is timed as bench_tree_attn times verify_ops (one CUDA graph calls
every layer once, each layer with its own buffers; median µs per layer after
the 0.3 s warm-up), with two Triton kernels in place of the verify kernel:

- ``empty``: one program storing one value: the launch and graph-node cost.
- ``chain``: the dependent loads every implementation has, and the output
  write that depends on them: the request's pool row and length, then its
  slot in ``req_to_token`` (the last draft's), then the K and V rows of that
  slot, then every output row of the request, written by one program per
  (request, KV head, block of 4096 output elements) so that the write is as
  parallel as a real kernel's.

Each kernel is timed twice: launched plainly, and with programmatic dependent
launch (``*_pdl``, sm_90+): each layer's kernel may then start while the one
before it drains, and waits (``griddepcontrol.wait``) before its first load,
as verify_ops' kernels do. The shorter chain is the floor (``floor_us``): one
kernel cannot finish a layer sooner, with or without that overlap.

Nor can it do the case's math in less than its FLOPs over the device's peak
rate, and no score exists before the chain's K row lands, while the output's
last write waits for the last of the math. So a layer takes at least the floor
plus that time (``least_us``; ``math_at_peak_us``, from the SM count, the
maximum SM clock and the SM's peak dense 16-bit rate, tensor and CUDA cores
together). A target below ``least_us`` is out of reach for any kernel under
this protocol (``reachable``). It is a bound, not an estimate: a real kernel
also streams all of K+V at less than the peak rate and merges its key splits
(a design with a separate merge kernel pays a second launch and chain on top).
Nor does it bound designs outside the protocol, such as fusing the op into
its neighbours or reading its inputs before the wait (they may still be being
written by the kernel before it).
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Callable

import torch

from ..bench_tree_attn import parse_args as bench_parse_args
from ..bench_tree_attn import case_row, shapes_of
from ..report import run_meta, save_rows
from ..timing import burst_ceilings, time_per_layer_us
from ..workload import Shape, Workload, make_workload

try:
    import triton
    import triton.language as tl
except ImportError:  # the target arithmetic and --help need no Triton; timing does
    triton = None

# Issue 4's targets: fractions of the roofline, and a latency target at batch 1, 4k.
MEMORY_FRACTION = 0.85
MEMORY_MIN_KV_BYTES = 64e6  # smaller memory-bound cases have no percentage target
MATH_FRACTION = 0.5
SHORT_TARGET_US = 8.0
SHORT_BATCH, SHORT_CONTEXT, SHORT_MAX_DRAFTS = 1, 4096, 16

# Output elements one chain program writes: 8 KB of bf16 (32 rows at head_dim 128).
WRITE_BLOCK_ELEMS = 4096


def targets_us(kv_bytes: float, roofline_us: float, bound: str, batch: int, seq_len: int,
               num_drafts: int) -> dict:
    """Issue 4's target times of a case; None where a target does not apply."""
    if bound == "memory":
        pct = roofline_us / MEMORY_FRACTION if kv_bytes >= MEMORY_MIN_KV_BYTES else None
    elif bound == "math":
        pct = roofline_us / MATH_FRACTION
    else:
        raise ValueError(f"bound must be 'memory' or 'math', got {bound!r}")
    short = (SHORT_TARGET_US if batch == SHORT_BATCH and seq_len == SHORT_CONTEXT
             and num_drafts <= SHORT_MAX_DRAFTS else None)
    return {"target_pct_us": pct, "target_short_us": short}


def reachable(least_us: float, target_pct_us: float | None,
              target_short_us: float | None) -> bool:
    """False when the least time of a layer passes a target that applies."""
    return all(t is None or least_us <= t for t in (target_pct_us, target_short_us))


# Dense 16-bit FLOPs one SM can do per clock, by compute capability major: on
# sm_90 the tensor cores' 4096 (H100 SXM's 989.4 TFLOP/s is that on 132 SMs at
# 1830 MHz) plus 512 for the CUDA cores (128 lanes, an FMA of packed halves
# each), as if both ran at once: the peak errs high, so the least time errs low.
PEAK_FLOP_PER_SM_CLOCK = {9: 4096 + 512}


def max_sm_clock_hz() -> float | None:
    """The device's maximum SM clock (CUDA's peak clock rate, which torch reports in
    kHz since 2.11 at least), or None where torch does not say."""
    khz = getattr(torch.cuda.get_device_properties(), "clock_rate", None)
    return khz * 1e3 if khz else None


def peak_flops_per_s(capability_major: int, sms: int, clock_hz: float | None) -> float | None:
    """The device's peak dense 16-bit rate, or None where the SM's rate or the clock is unknown."""
    per_sm_clock = PEAK_FLOP_PER_SM_CLOCK.get(capability_major)
    return None if per_sm_clock is None or clock_hz is None else per_sm_clock * sms * clock_hz


def math_at_peak_us(flops: float, peak: float | None) -> float | None:
    """The case's math at the peak rate, or None where the peak is unknown."""
    return None if peak is None else flops / peak * 1e6


def supports_dependent_launch() -> bool:
    """Programmatic dependent launch needs sm_90 or newer."""
    return torch.cuda.get_device_capability()[0] >= 9


if triton is not None:
    @triton.jit
    def _wait_for_the_kernel_before(USE_PDL: tl.constexpr):
        # As verify_ops' kernels do: wait for the grid before, then let the next queue.
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def _empty_kernel(out_ptr, USE_PDL: tl.constexpr):
        _wait_for_the_kernel_before(USE_PDL)
        tl.store(out_ptr, 1.0)

    @triton.jit
    def _chain_kernel(out_ptr, k_ptr, v_ptr, req_to_token_ptr, req_pool_indices_ptr,
                      seq_lens_ptr, r2t_stride, k_slot_stride, k_head_stride, v_slot_stride,
                      v_head_stride, out_token_stride, out_head_stride,
                      NUM_DRAFTS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_ROWS: tl.constexpr, USE_PDL: tl.constexpr):
        _wait_for_the_kernel_before(USE_PDL)
        b = tl.program_id(0)
        h = tl.program_id(1)
        # Two independent loads, then two dependent steps: the chain.
        rpi = tl.load(req_pool_indices_ptr + b).to(tl.int64)
        seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)
        slot = tl.load(req_to_token_ptr + rpi * r2t_stride + seq_len + (NUM_DRAFTS - 1))
        slot = slot.to(tl.int64)  # slot * stride passes 2^31 in big pools
        d = tl.arange(0, HEAD_DIM)
        k = tl.load(k_ptr + slot * k_slot_stride + h.to(tl.int64) * k_head_stride + d)
        v = tl.load(v_ptr + slot * v_slot_stride + h.to(tl.int64) * v_head_stride + d)
        row = (k.to(tl.float32) + v.to(tl.float32)).to(out_ptr.dtype.element_ty)
        # Output row r of this (request, KV head): draft r // GROUP, q head r % GROUP of the group.
        r = tl.program_id(2) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        token = (b * NUM_DRAFTS + r // GROUP).to(tl.int64)
        head = (h * GROUP + r % GROUP).to(tl.int64)
        offs = (token * out_token_stride + head * out_head_stride)[:, None] + d[None, :]
        mask = (r < NUM_DRAFTS * GROUP)[:, None] & (d < HEAD_DIM)[None, :]
        tl.store(out_ptr + offs, tl.broadcast_to(row[None, :], (BLOCK_ROWS, HEAD_DIM)), mask=mask)


def _launch_options(pdl: bool) -> dict:
    # launch_pdl only where asked: Triton's interpreter (the CPU tests) knows no such option.
    return {"USE_PDL": True, "launch_pdl": True} if pdl else {"USE_PDL": False}


def empty_call(out: torch.Tensor, pdl: bool = False) -> Callable[[], None]:
    """The empty kernel; with ``pdl``, launched as a programmatic dependent of the one before."""
    options = _launch_options(pdl)
    return lambda: _empty_kernel[(1,)](out, num_warps=1, **options)


def chain_call(w: Workload, layer: int, out: torch.Tensor,
               pdl: bool = False) -> Callable[[], None]:
    """Layer ``layer``'s chain kernel writing ``out`` ([bs*D, Hq, head_dim]); with ``pdl``,
    launched as a programmatic dependent of the kernel before it."""
    s, lay = w.shape, w.layers[layer]
    if s.head_dim & (s.head_dim - 1) or s.num_q_heads % s.num_kv_heads:
        raise ValueError(f"head_dim must be a power of two and Hkv divide Hq: {s}")
    for t in (lay.k_cache, lay.v_cache, out):
        if t.stride(-1) != 1:
            raise ValueError("the chain kernel needs head_dim contiguous")
    group = s.num_q_heads // s.num_kv_heads
    rows = s.num_drafts * group
    block_rows = min(triton.next_power_of_2(rows), max(1, WRITE_BLOCK_ELEMS // s.head_dim))
    grid = (s.batch, s.num_kv_heads, triton.cdiv(rows, block_rows))
    args = (out, lay.k_cache, lay.v_cache, w.req_to_token, w.req_pool_indices, w.seq_lens,
            w.req_to_token.stride(0), lay.k_cache.stride(0), lay.k_cache.stride(1),
            lay.v_cache.stride(0), lay.v_cache.stride(1), out.stride(0), out.stride(1))
    consts = {"NUM_DRAFTS": s.num_drafts, "GROUP": group, "HEAD_DIM": s.head_dim,
              "BLOCK_ROWS": block_rows, **_launch_options(pdl)}
    return lambda: _chain_kernel[grid](*args, **consts)


def expected_chain(w: Workload, layer: int) -> torch.Tensor:
    """What the chain kernel writes, by torch: the last draft's K+V row, per q head and draft."""
    s, lay = w.shape, w.layers[layer]
    slots = w.req_to_token[w.req_pool_indices, w.seq_lens + s.num_drafts - 1].long()
    rows = (lay.k_cache[slots].float() + lay.v_cache[slots].float()).to(lay.q.dtype)
    per_head = rows.repeat_interleave(s.num_q_heads // s.num_kv_heads, dim=1)  # [bs, Hq, d]
    return per_head.repeat_interleave(s.num_drafts, dim=0)  # [bs*D, Hq, d]


def check_chain(w: Workload, layer: int, out: torch.Tensor) -> None:
    """Raises unless ``out`` is exactly what layer ``layer``'s chain kernel should write."""
    want = expected_chain(w, layer)
    if out.shape != want.shape or not torch.equal(out, want):
        bad = (out != want).sum().item() if out.shape == want.shape else "shape"
        raise RuntimeError(f"chain kernel output wrong for {w.shape.label()}: {bad} of "
                           f"{want.numel()} elements differ")


def verify(w: Workload, chain_outs: list[torch.Tensor], chain: list[Callable],
           empty_outs: list[torch.Tensor], empty: list[Callable]) -> None:
    """Runs layer 0 of each kernel once on poisoned outputs and checks what they wrote."""
    chain_outs[0].fill_(float("nan"))  # a row left unwritten then fails the check
    empty_outs[0].zero_()
    chain[0]()
    empty[0]()
    if chain_outs[0].is_cuda:
        torch.cuda.synchronize()
    check_chain(w, 0, chain_outs[0])
    if empty_outs[0].item() != 1:
        raise RuntimeError(f"empty kernel did not store its value for {w.shape.label()}")


def time_kernels(w: Workload, pdl: bool) -> tuple[float, float]:
    """µs per layer of the empty and the chain kernels, launched plainly or with PDL."""
    empty_outs = [torch.empty(1, device="cuda") for _ in w.layers]
    chain_outs = [torch.empty_like(lay.q) for lay in w.layers]  # allocated outside the graph
    empty = [empty_call(o, pdl) for o in empty_outs]
    chain = [chain_call(w, i, o, pdl) for i, o in enumerate(chain_outs)]
    verify(w, chain_outs, chain, empty_outs, empty)
    return time_per_layer_us(empty), time_per_layer_us(chain)


def floor_us(row: dict) -> float:
    """The shorter chain: plain, or with PDL where the device has it."""
    return min(t for t in (row["chain_us"], row["chain_pdl_us"]) if t is not None)


def least_us(row: dict) -> float:
    """The floor plus the math at the peak rate; the floor alone where the peak is unknown."""
    return row["floor_us"] + (row["math_at_peak_us"] or 0.0)


def run_case(shape: Shape, ceilings: dict, peak: float | None) -> dict:
    w = make_workload(shape)
    row = case_row(shape, len(w.layers), ceilings)
    row["empty_us"], row["chain_us"] = time_kernels(w, pdl=False)
    row["empty_pdl_us"], row["chain_pdl_us"] = (
        time_kernels(w, pdl=True) if supports_dependent_launch() else (None, None))
    row["floor_us"] = floor_us(row)
    row["math_at_peak_us"] = math_at_peak_us(row["flops"], peak)
    row["least_us"] = least_us(row)
    row.update(targets_us(shape.kv_bytes, row["roofline_us"], row["bound"], shape.batch,
                          shape.seq_len, shape.num_drafts))
    row["reachable"] = reachable(row["least_us"], row["target_pct_us"], row["target_short_us"])
    del w
    gc.collect()
    torch.cuda.empty_cache()
    return row


def _us(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(rows: list[dict]) -> str:
    head = (f"{'case':34} {'roof us':>8} {'bound':>6} {'pct tgt':>8} {'8us tgt':>8} "
            f"{'empty':>7} {'chain':>7} {'e pdl':>7} {'c pdl':>7} {'math pk':>7} "
            f"{'least':>7} {'reachable':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['label']:34} {r['roofline_us']:>8.1f} {r['bound']:>6} "
                     f"{_us(r['target_pct_us'], 2):>8} {_us(r['target_short_us']):>8} "
                     f"{r['empty_us']:>7.2f} {r['chain_us']:>7.2f} "
                     f"{_us(r['empty_pdl_us'], 2):>7} {_us(r['chain_pdl_us'], 2):>7} "
                     f"{_us(r['math_at_peak_us'], 2):>7} {r['least_us']:>7.2f} "
                     f"{'yes' if r['reachable'] else 'NO':>9}")
    return "\n".join(lines)


def parse_args(argv=None):
    """bench_tree_attn's case-selection flags with its defaults (every case), and --out."""
    defaults = bench_parse_args([])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("contexts", "batches", "drafts", "chain_drafts", "heads", "layouts", "cases"):
        p.add_argument(f"--{name.replace('_', '-')}", default=getattr(defaults, name),
                       help="as in bench.bench_tree_attn")
    p.add_argument("--out", default="bench_out/floor_probe.json", help="JSON results path")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if triton is None:
        raise SystemExit("bench.probes.floor_probe needs Triton")
    torch.manual_seed(0)
    ceilings = burst_ceilings()  # as bench_tree_attn's roofline takes them
    props = torch.cuda.get_device_properties()
    clock_hz = max_sm_clock_hz()
    peak = peak_flops_per_s(props.major, props.multi_processor_count, clock_hz)
    print(f"device {torch.cuda.get_device_name()}: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} "
          f"TB/s, bf16 matmul {ceilings['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s, peak "
          f"{'unknown' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'}", flush=True)
    meta = run_meta("bench.probes.floor_probe", argv if argv is not None else sys.argv[1:],
                    triton=triton.__version__, **ceilings, sms=props.multi_processor_count,
                    max_sm_clock_hz=clock_hz, peak_flops_per_s=peak)
    rows = []
    for shape in shapes_of(args):
        row = run_case(shape, ceilings, peak)
        rows.append(row)
        print(f"{shape.label():34} roof {row['roofline_us']:.1f}us empty {row['empty_us']:.2f}us "
              f"chain {row['chain_us']:.2f}us (with PDL {_us(row['empty_pdl_us'], 2)}, "
              f"{_us(row['chain_pdl_us'], 2)}) least {row['least_us']:.2f}us "
              f"reachable {row['reachable']}", flush=True)
        save_rows(args.out, meta, rows)
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
