"""The kernel names of bench/probes/kernel_names.py."""

from pathlib import Path

from bench.probes.kernel_names import read_cases, variant


def test_attention_and_merge_kernels_get_short_names():
    name = ("void verify_ops::tree_attn_kernel<__nv_bfloat16, 128, 4, 4, false, "
            "(verify_ops::OptionSet)1, __nv_bfloat16>(verify_ops::TreeAttnParams)")
    assert variant(name) == "tree_attn_kernel<bf16,128,4,4,false,totals,bf16>"
    # Builds from before the option sets: a bool, or no option arguments at all.
    assert variant("void verify_ops::tree_attn_kernel<__half, 64, 1, 12, false, true, "
                   "__nv_fp8_e4m3>(verify_ops::TreeAttnParams)") == \
        "tree_attn_kernel<fp16,64,1,12,false,all,__nv_fp8_e4m3>"
    assert variant("void verify_ops::tree_attn_kernel<__half, 64, 2, 4, true>(p)") == \
        "tree_attn_kernel<fp16,64,2,4,true,plain,fp16>"
    assert (variant("void verify_ops::merge_few_splits_kernel<__half, 64, true>"
                    "(verify_ops::TreeAttnParams)")
            == "merge_few_splits_kernel<fp16,64,true>")
    assert variant("void verify_ops::merge_splits_kernel<__nv_bfloat16, 256, false>(p)") == \
        "merge_splits_kernel<bf16,256,false>"
    assert variant("void verify_ops::merge_splits_kernel<__half, 128>(p)") == \
        "merge_splits_kernel<fp16,128,false>"


def test_other_kernels_are_not_the_ops():
    assert variant("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>()") is None
    assert variant("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn") is None


def test_the_restructure_case_file_reads_as_the_list_ab_run_gets():
    cases = read_cases(f"@{Path(__file__).parents[1] / 'restructure_ab_cases.txt'}")
    assert len(cases) == 25 and len(set(cases)) == 25
    assert cases[0] == "1/4096/8/8/1/128/fragmented"
    assert read_cases("a,b") == ["a", "b"]
