"""Stand-in for DeepGEMM on the lent box, which has no wheel of it.

SGLang 0.5.17's EAGLE v2 worker imports its DSA backend while capturing the draft's
graphs, and that module imports deep_gemm at the top on CUDA; only DeepSeek sparse
attention models call into it. Any use raises.
"""


def __getattr__(name):
    raise ImportError(f"deep_gemm.{name}: DeepGEMM is not installed (a live-run stand-in)")
