"""Imports what a live SGLang server (``launch_server``, its scheduler, a Llama
forward with STANDALONE/EAGLE speculative decoding, the ``triton``,
``verify_ops`` and optionally ``flashinfer`` attention backends) imports, and
names every package that is missing, in one pass.

On the lent H200 ``bench/device/live_server.sh`` runs it before the first
server start, so that a missing wheel shows up as one list in seconds rather
than as a scheduler process dying at its first missing import. Here (no GPU),
``--emulate-sm90`` makes torch report one sm_90 device, so that SGLang's CUDA-only
imports are taken as they are there; ``sgl_kernel`` then has to be the
import-only stub (``graph_tests/stubs``): the real one loads its CUDA library.

    python bench/device/live_import_probe.py [--emulate-sm90] [--flashinfer] [--no-verify-ops]

Exit status 1 and one line per missing top-level package when any is missing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections import defaultdict

# The main process, the scheduler (model runner, loader, Llama, the speculative
# workers and their CUDA-graph runners) and the detokenizer, as 0.5.17 lays them out.
SERVER_MODULES = [
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tp_worker",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.model_loader.loader",
    "sglang.srt.model_loader.weight_utils",
    "sglang.srt.models.llama",
    "sglang.srt.models.llama_eagle3",
    "sglang.srt.layers.layernorm",
    "sglang.srt.layers.activation",
    "sglang.srt.layers.rotary_embedding",
    "sglang.srt.layers.linear",
    "sglang.srt.layers.logits_processor",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.vocab_parallel_embedding",
    "sglang.srt.layers.radix_attention",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.attention.attention_registry",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.distributed.parallel_state",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.speculative.spec_utils",
    "sglang.srt.speculative.eagle_info",
    "sglang.srt.speculative.eagle_utils",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.standalone_worker_v2",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
    "sglang.srt.server_args",
]
VERIFY_OPS_MODULES = ["verify_ops.sglang.plugin", "verify_ops.sglang.backend"]
FLASHINFER_MODULES = ["flashinfer", "sglang.srt.layers.attention.flashinfer_backend"]


def emulate_sm90() -> None:
    """Make torch report one visible sm_90 device (no GPU here), for imports only."""
    import torch

    class Properties:
        name = "NVIDIA H200 (emulated)"
        major, minor = 9, 0
        multi_processor_count = 132
        total_memory = 143 * 1024**3
        L2_cache_size = 60 * 1024**2

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: Properties.name
    torch.cuda.get_device_properties = lambda device=None: Properties()


def missing_package(exc: BaseException) -> str | None:
    """The top-level package a ModuleNotFoundError in the chain names, if any."""
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            return exc.name.split(".")[0]
        exc = exc.__cause__ or exc.__context__
    return None


def probe(modules: list[str]) -> dict[str, list[str]]:
    """Imports each module; returns {missing package: [modules that needed it]} and
    prints any other failure with its traceback."""
    missing: dict[str, list[str]] = defaultdict(list)
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - report everything, go on
            package = missing_package(exc)
            if package is not None:
                missing[package].append(name)
            else:
                print(f"FAILED {name}: {type(exc).__name__}: {exc}")
                traceback.print_exc(limit=-4)
            if name == "sglang":  # everything else needs it
                break
    return missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emulate-sm90", action="store_true",
                        help="no GPU here: let torch report one sm_90 device")
    parser.add_argument("--flashinfer", action="store_true", help="also FlashInfer's backend")
    parser.add_argument("--no-verify-ops", action="store_true",
                        help="skip verify_ops (not built for this interpreter)")
    args = parser.parse_args()
    if args.emulate_sm90:
        emulate_sm90()
    modules = ["sglang"] + SERVER_MODULES
    if not args.no_verify_ops:
        modules += VERIFY_OPS_MODULES
    if args.flashinfer:
        modules += FLASHINFER_MODULES
    missing = probe(modules)
    sglang = sys.modules.get("sglang")
    if sglang is not None:
        print(f"sglang {sglang.__version__} from {sglang.__file__}")
    for package, needers in sorted(missing.items()):
        print(f"MISSING {package}: needed by {', '.join(needers[:3])}"
              + (f" and {len(needers) - 3} more" if len(needers) > 3 else ""))
    print(f"import probe: {len(modules)} modules, {len(missing)} missing packages")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
