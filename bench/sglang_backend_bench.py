"""Per-layer time of SGLang's TARGET_VERIFY attention: VerifyOpsAttnBackend vs TritonAttnBackend.

    python -m bench.sglang_backend_bench --out bench/results/sglang-backend-h200.json

Both backends run on real SGLang objects (tests/support/sglang_objects.py): one
MHATokenToKVPool with N layers, RadixAttention layers 0..N-1, an EAGLE
(topk > 1) tree written by SGLang's tree kernel, fragmented slots, batch 1.
Each backend is driven as SGLang's decode graph runner drives it
(``init_cuda_graph_state``; ``init_forward_metadata_out_graph`` with
``in_capture=True``; capture; then the batch staged into the static inputs and
``init_forward_metadata_out_graph`` on the replay view), and its verify step is
captured in ONE CUDA graph that calls ``backend.forward`` once per layer. N
layers stream >= 4x the L2 (8..64, as bench/workload.py); the time is a
replay's divided by N, median of the replays after 0.3 s of warm-up replays
(bench/timing.py's method, on the graph that was checked). Before timing,
every layer's output of a replay is checked against the float64 reference
(relative error < 1e-2); a failed check stops the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import platform
import sys

import torch
import triton

import verify_ops
from verify_ops.reference import relative_error

from .timing import capture_graph, median_replay_us_per_layer
from .workload import Shape as WorkloadShape

CHECK_TOL = 1e-2
# (topk, steps) SGLang's EAGLE runs with for --speculative-num-draft-tokens D.
EAGLE_TREES = {8: (4, 3), 64: (8, 5)}
BACKENDS = ("verify_ops", "triton")


@dataclasses.dataclass(frozen=True)
class Case:
    context: int  # committed prefix of the one request
    num_drafts: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def workload(self) -> WorkloadShape:
        """The same case in bench/workload.py's terms: its label, K/V bytes and layer count."""
        return WorkloadShape(1, self.context, self.num_drafts, self.num_q_heads,
                             self.num_kv_heads, self.head_dim, "fragmented")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", default="4096,16384,65536", help="contexts of the D=8 cases")
    p.add_argument("--heads", default="32/8/128,8/1/128",
                   help="Hq/Hkv/head_dim triples of the D=8 cases")
    p.add_argument("--wide-tree", default="65536:32/8/128",
                   help="context:Hq/Hkv/head_dim of the D=64 case ('' for none)")
    p.add_argument("--replays", type=int, default=15, help="timed replays per backend")
    p.add_argument("--out", default=None, help="JSON results path")
    return p.parse_args(argv)


def heads_of(text: str) -> tuple[int, int, int]:
    num_q_heads, num_kv_heads, head_dim = (int(x) for x in text.split("/"))
    return num_q_heads, num_kv_heads, head_dim


def cases_of(args) -> list[Case]:
    cases = [Case(int(context), 8, *heads_of(heads))
             for heads in args.heads.split(",") if heads
             for context in args.contexts.split(",") if context]
    if args.wide_tree:
        context, heads = args.wide_tree.split(":")
        cases.append(Case(int(context), 64, *heads_of(heads)))
    return cases


def load_sglang_builders():
    """tests/support/sglang_objects.py, imported only once needed: it imports SGLang (~10 s)."""
    from tests.support import sglang_objects

    return sglang_objects


class VerifyStep:
    """One model step's TARGET_VERIFY attention over every layer, for one backend."""

    def __init__(self, sg, shape, runner, backend, layers, qkv_per_layer):
        self.sg, self.shape, self.runner, self.backend = sg, shape, runner, backend
        self.layers, self.qkv_per_layer = layers, qkv_per_layer
        self.outs: list[torch.Tensor] = [None] * len(layers)
        backend.init_cuda_graph_state(shape.bs, shape.bs * shape.num_drafts)
        self.inputs = sg.graph_inputs(shape, shape.bs, backend.get_cuda_graph_seq_len_fill_value())
        self.capture_batch = sg.capture_batch(shape, runner, self.inputs)
        backend.init_forward_metadata_out_graph(self.capture_batch, in_capture=True)
        self.graph = capture_graph(self._step)

    def _step(self):
        self.backend.init_forward_metadata_in_graph(self.capture_batch)
        for i, (layer, (q, k, v)) in enumerate(zip(self.layers, self.qkv_per_layer)):
            self.outs[i] = self.backend.forward(q, k, v, layer, self.capture_batch)

    def stage(self, batch, draft):
        """The drafter writes the tree into the backend's mask buffer; the batch goes
        into the static inputs; the backend prepares its metadata out of the graph."""
        sg, shape = self.sg, self.shape
        mask = sg.write_tree_mask(shape, draft, batch.seq_lens, self.backend)
        fb = sg.forward_batch(shape, self.runner, batch,
                              sg.verify_input(shape, draft, mask, batch.seq_lens))
        self.backend.init_forward_metadata_out_graph(sg.stage_replay(shape, self.inputs, fb))

    def checked_replay(self, batch, tree_mask, references: dict) -> float:
        """Replay over NaN outputs and NaN draft K/V; return the worst layer's relative
        error against the float64 reference (computed once per layer, then shared)."""
        pool = self.runner.token_to_kv_pool
        for i, out in enumerate(self.outs):
            out.fill_(float("nan"))
            for buffer in (pool.get_key_buffer(i), pool.get_value_buffer(i)):
                buffer[batch.out_cache_loc] = float("nan")
        self.graph.replay()
        torch.cuda.synchronize()
        errors = []
        for i, out in enumerate(self.outs):
            if i not in references:
                references[i] = self.sg.reference(self.shape, self.runner, batch,
                                                  self.qkv_per_layer[i][0], tree_mask, layer_id=i)
            ref = references[i]
            errors.append(relative_error(out.reshape(ref.shape).float(), ref))
        return max(errors)


def run_case(sg, case: Case, replays: int) -> dict:
    topk, steps = EAGLE_TREES[case.num_drafts]
    num_layers = case.workload.num_layers
    tokens = case.context + case.num_drafts
    shape = sg.Shape(prefix_lens=(case.context,), topk=topk, steps=steps,
                     num_drafts=case.num_drafts, num_q_heads=case.num_q_heads,
                     num_kv_heads=case.num_kv_heads, head_dim=case.head_dim, context_len=tokens,
                     req_rows=4, pool_slots=2 * tokens, dtype=torch.bfloat16, device="cuda",
                     layer_num=num_layers)
    gen = torch.Generator().manual_seed(0)
    row = {"case": case.workload.label(), **dataclasses.asdict(case), "topk": topk,
           "steps": steps, "num_layers": num_layers,
           "kv_bytes_per_layer": case.workload.kv_bytes, "methods": {}}
    with sg.sglang_config(shape):
        triton_backend, ops_backend, runner = sg.build_backends(shape)
        if not ops_backend.serves_verify:
            raise RuntimeError("VerifyOpsAttnBackend fell back to Triton's verify path; "
                               "see the warning above")
        batch, draft = sg.place_batch(shape, runner, gen), sg.draft_tree(shape, gen)
        tree_mask = sg.qlen_only_tree_mask(shape, draft, batch.seq_lens)
        layers = [sg.attention_layer(shape, layer_id=i) for i in range(num_layers)]
        qkv_per_layer = [sg.random_qkv(shape, gen) for _ in layers]
        references = {}
        for name, backend in zip(BACKENDS, (ops_backend, triton_backend)):
            step = VerifyStep(sg, shape, runner, backend, layers, qkv_per_layer)
            step.stage(batch, draft)
            err = step.checked_replay(batch, tree_mask, references)
            if not err < CHECK_TOL:
                raise RuntimeError(f"{name} on {row['case']}: captured output has relative "
                                   f"error {err:.3g} against the float64 reference "
                                   f"(limit {CHECK_TOL})")
            us = median_replay_us_per_layer(step.graph, num_layers, replays)
            row["methods"][name] = {"us_per_layer": us, "max_rel_err": err}
            del step
    row["speedup"] = (row["methods"]["triton"]["us_per_layer"]
                      / row["methods"]["verify_ops"]["us_per_layer"])
    del triton_backend, ops_backend, runner, batch, layers, qkv_per_layer, references
    gc.collect()
    torch.cuda.empty_cache()
    return row


def format_table(rows: list[dict]) -> str:
    head = (f"{'case':30} {'N':>3} {'verify_ops us/layer':>20} {'triton us/layer':>16} "
            f"{'speedup':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:30} {r['num_layers']:>3} "
                     f"{r['methods']['verify_ops']['us_per_layer']:>20.1f} "
                     f"{r['methods']['triton']['us_per_layer']:>16.1f} {r['speedup']:>7.1f}x")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if not verify_ops.has_cuda_kernel():
        raise SystemExit("needs a GPU and a CUDA build of verify_ops")
    sg = load_sglang_builders()
    from sglang.version import __version__ as sglang_version  # imported by now
    meta = {"command": " ".join(["python -m bench.sglang_backend_bench"]
                                + (sys.argv[1:] if argv is None else argv)),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "sglang": sglang_version, "triton": triton.__version__,
            "python": platform.python_version(), "replays": args.replays,
            "check_tol": CHECK_TOL}
    print(f"{meta['device']}: torch {meta['torch']}, sglang {meta['sglang']}, "
          f"triton {meta['triton']}", flush=True)
    rows = []
    for case in cases_of(args):
        row = run_case(sg, case, args.replays)
        rows.append(row)
        print(f"{row['case']:30} N={row['num_layers']:<3} " + " ".join(
            f"{name} {m['us_per_layer']:.1f}us (err {m['max_rel_err']:.1e})"
            for name, m in row["methods"].items()), flush=True)
        if args.out:  # after every case, so a run cut short still leaves its results
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(format_table(rows))


if __name__ == "__main__":
    main()
