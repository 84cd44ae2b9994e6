"""Which CUDA kernels each bench case launches, by the profiler: shows that a
case list (an A/B's, say) reaches every kernel variant. Per case, one line
of the kernels it ran, then the count of distinct kernels.

    python -m bench.probes.kernel_names --cases 1/4096/8/8/1/128/fragmented,...
    python -m bench.probes.kernel_names --cases @bench/probes/restructure_ab_cases.txt
"""

from __future__ import annotations

import argparse
import json
import re

# A variant is a tree_attn_kernel's template arguments (dtype, head dim, key
# split, warps, cluster merge, option set, KV type) or a merge kernel's name.
_KERNEL = re.compile(r"verify_ops::(tree_attn_kernel|merge_\w+?_kernel)\s*<(.*?)>\s*(\(|$)")
_OPTION_SETS = {"(verify_ops::OptionSet)0": "plain", "(verify_ops::OptionSet)1": "totals",
                "(verify_ops::OptionSet)2": "all",
                "false": "plain", "true": "all"}  # the bool of the kernels before option sets


def variant(name: str) -> str | None:
    """A short name for a demangled kernel name, or None if it is not the op's.

    ``void verify_ops::tree_attn_kernel<__nv_bfloat16, 128, 4, 4, false,
    (verify_ops::OptionSet)0, __nv_bfloat16>(verify_ops::TreeAttnParams)`` becomes
    ``tree_attn_kernel<bf16,128,4,4,false,plain,bf16>``; the defaults are filled
    in where a build's kernels had no option arguments yet."""
    match = _KERNEL.search(name)
    if not match:
        return None
    args = re.sub(r"\s+", "", match.group(2))
    args = args.replace("__nv_bfloat16", "bf16").replace("__half", "fp16")
    fields = [re.sub(r"^\((int|bool)\)", "", f) for f in args.split(",")]
    if match.group(1) == "tree_attn_kernel":
        if len(fields) == 5:
            fields += ["plain", fields[0]]
        fields[5] = _OPTION_SETS.get(fields[5], fields[5])
    elif len(fields) == 2:  # a merge kernel from before its OPTIONS argument
        fields.append("false")
    return f"{match.group(1)}<{','.join(fields)}>"


def read_cases(arg: str) -> list[str]:
    """A comma-separated case list, or @FILE: one case a line, with # comments."""
    if not arg.startswith("@"):
        return arg.split(",")
    with open(arg[1:]) as f:
        return [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]


def kernels_of_case(text: str) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..methods import prepare_verify_ops
    from ..workload import make_workload, parse_case

    call = prepare_verify_ops(make_workload(parse_case(text), num_layers=1))[0]
    call()  # the first call prepares each kernel (attributes, occupancy)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = {variant(e.name) for e in prof.events() if e.device_type.name == "CUDA"}
    return sorted(n for n in names if n)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", required=True, help="comma-separated bench cases, or @FILE")
    p.add_argument("--out", default="", help="JSON of {case: [kernels]}")
    args = p.parse_args()
    by_case = {case: kernels_of_case(case) for case in read_cases(args.cases)}
    for case, kernels in by_case.items():
        print(f"{case:40s} {' + '.join(kernels)}")
    reached = sorted({k for kernels in by_case.values() for k in kernels})
    print(f"{len(reached)} distinct kernels over {len(by_case)} cases")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cases": by_case, "reached": reached}, f, indent=1)


if __name__ == "__main__":
    main()
