"""The register and spill table of bench/probes/ptxas_table.py."""

from bench.probes.ptxas_table import compare, parse_log

# ptxas -v as nvcc prints it: one entry per arch, its properties, then registers.
_BASE = """\
ptxas info    : Compiling entry function '_ZN10verify_ops16tree_attn_kernelI13__nv_bfloat16Li128ELi1ELi4ELb0EEEvNS_14TreeAttnParamsE' for 'sm_90a'
ptxas info    : Function properties for _ZN10verify_ops16tree_attn_kernelI13__nv_bfloat16Li128ELi1ELi4ELb0EEEvNS_14TreeAttnParamsE
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 496 bytes cmem[0]
ptxas info    : Compiling entry function '_ZN10verify_ops16tree_attn_kernelI13__nv_bfloat16Li128ELi1ELi4ELb0EEEvNS_14TreeAttnParamsE' for 'sm_100a'
ptxas info    : Function properties for _ZN10verify_ops16tree_attn_kernelI13__nv_bfloat16Li128ELi1ELi4ELb0EEEvNS_14TreeAttnParamsE
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 99 registers, used 1 barriers, 496 bytes cmem[0]
"""
_CAND = """\
ptxas info    : Compiling entry function '_ZN10verify_ops16tree_attn_kernelI13__nv_bfloat16Li128ELi1ELi4ELb0ELNS_9OptionSetE0ES1_EEvNS_14TreeAttnParamsE' for 'sm_90a'
ptxas info    : Function properties for _ZN10verify_ops16tree_attn_kernelI13__nv_bfloat16Li128ELi1ELi4ELb0ELNS_9OptionSetE0ES1_EEvNS_14TreeAttnParamsE
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 170 registers, used 1 barriers, 496 bytes cmem[0]
"""


def test_one_arch_is_read_and_kernels_match_across_template_arguments():
    base, cand = parse_log(_BASE), parse_log(_CAND)
    name = "tree_attn_kernel<bf16,128,1,4,false,plain,bf16>"
    assert base == {name: {"stack": 0, "spill_stores": 0, "spill_loads": 0, "registers": 168}}
    assert cand[name]["registers"] == 170 and cand[name]["spill_loads"] == 12
    assert parse_log(_BASE, "sm_100a")[name]["registers"] == 99
    c = compare(base, cand)
    assert c["matched"] == 1 and list(c["changed"]) == [name]
    assert c["only_base"] == c["only_cand"] == []
