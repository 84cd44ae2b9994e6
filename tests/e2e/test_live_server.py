"""End to end: a real SGLang server on the CPU, with speculative decoding, serves
TARGET_VERIFY through ``--attention-backend verify_ops``.

A tiny random-weight fp32 Llama is built at test time (``tiny_llama``). For
STANDALONE (the Llama drafts for itself) and EAGLE (an EAGLE-1 head), each as a
chain (topk 1) and a tree (topk 2), one server per backend runs the same
prompts greedily, and over HTTP we check:

- ``output_ids`` equal Hugging Face's greedy continuation, for ``verify_ops``
  and ``triton`` alike, so the two are identical; and the two backends needed
  the same verify rounds (SGLang's ``spec_verify_ct`` and histogram), so the
  drafter got the same state from both;
- the op served every TARGET_VERIFY batch: the backend's per-batch log line
  (``VERIFY_OPS_LOG_VERIFY=1``) says so, and no fallback line or warning shows;
- the chains' acceptance is exactly what their drafts allow
  (``greedy_reference``). With the draft identical to the target, SGLang 0.5.23's
  STANDALONE does not reach ``num_steps + 1``: it feeds the draft EAGLE's
  shifted inputs, so the draft never sees a request's first token. The test
  asserts SGLang's figure and that a draft seeing the whole context would reach
  ``num_steps + 1``;
- with ``VERIFY_OPS_DEFRAG=2`` in a tight KV pool, live relocation moves a
  request mid-generation and the outputs stay the same;
- on a paged pool (``--page-size 16``), a tree gives Hugging Face's greedy
  continuation: the plugin lets SGLang pair trees with pages on this backend;
- with an fp8 KV cache (``--kv-cache-dtype fp8_e4m3``: a chain; ``fp8_e5m2``: a
  tree on 64-token pages), the output is the greedy continuation of a Hugging
  Face model that reads K/V as SGLang's fp8 pool holds them
  (``Fp8KvGreedyModel``), which differs from the exact one;
- a tiny Gemma-2 (``tiny_gemma2``: a sliding window of 8 on layer 0, an
  attention soft-cap on both layers) served as a STANDALONE tree gives Hugging
  Face's greedy continuation, which the window and the cap each change. Every
  token after the first comes from TARGET_VERIFY's logits, so the op applied
  both, with tree drafts at their depth's position. Triton is not run for it:
  SGLang 0.5.23's Triton extend kernel windows a draft by its flattened index
  in the tree (``q_id = prefix_len + m``), not its depth, and its tree outputs
  for this model are not greedy.
- a tiny gpt-oss (``tiny_gpt_oss``: SGLang's own ``GptOssForCausalLM``, a window
  of 8 on layer 0, attention sinks on both layers, head_dim 64, a 4-expert MoE)
  served as a STANDALONE tree gives Hugging Face's greedy continuation, which
  the window and the sinks each change. SGLang accepts the backend for gpt-oss
  because the plugin adds it to SGLang's list for that model;
- a tiny Exaone 4 (``tiny_exaone4``: a window of 8 on layer 0, a global NoPE
  layer, q/k norms), accepted the same way, served as a STANDALONE tree gives
  Hugging Face's greedy continuation, which the window changes.

Servers start one at a time and stop as soon as their prompts are answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

for _module in ("sglang", "transformers", "tokenizers", "safetensors"):
    pytest.importorskip(_module, reason=f"the live-server test needs {_module}")

from greedy_reference import (  # noqa: E402
    Fp8KvGreedyModel,
    GreedyModel,
    Rounds,
    chain_rounds,
    echo_drafter,
    standalone_drafter,
)
from live_server import LiveServer, ServerLog, SpecConfig  # noqa: E402
from tiny_gemma2 import SLIDING_WINDOW, build_tiny_gemma2  # noqa: E402
from tiny_exaone4 import build_tiny_exaone4  # noqa: E402
from tiny_gpt_oss import SERVER_ARGS as GPT_OSS_SERVER_ARGS, build_tiny_gpt_oss  # noqa: E402
from tiny_llama import MAX_POSITIONS, build_tiny_models  # noqa: E402

from tests.support.interpreter import interpreter_unusable_reason  # noqa: E402

# Different first tokens, so the radix cache shares nothing between them.
PROMPTS = ("def main(args):", "import os\nimport sys\n", "class Parser:")
NEW_TOKENS = 24
NUM_STEPS = 3
CHAIN = dict(topk=1, num_steps=NUM_STEPS, num_draft_tokens=NUM_STEPS + 1)
TREE = dict(topk=2, num_steps=NUM_STEPS, num_draft_tokens=6)
# Live relocation: looked for at every scheduling step (not every 64th), in a
# pool small enough that the running requests grow into each other, and
# without the radix cache, which would keep finished requests' KV in it.
RELOCATION_ENV = {"VERIFY_OPS_DEFRAG": "2", "E2E_RELOCATE_EVERY_STEPS": "1"}
TIGHT_POOL_TOKENS = 128
BACKENDS = ("verify_ops", "triton")


@dataclass(frozen=True)
class Case:
    spec: SpecConfig
    model: str = "llama"  # a key of the ``checkpoints`` fixture; "gemma2" is windowed
    backends: tuple[str, ...] = BACKENDS
    env: dict = field(default_factory=dict)
    max_total_tokens: int = 4096
    server_args: tuple[str, ...] = ()
    kv_cache_dtype: str = "auto"  # or fp8: its reference reads K/V as the pool holds them
    page_size: int = 1

    @property
    def name(self) -> str:
        name = f"{self.model}-{self.spec.name}"
        if self.kv_cache_dtype != "auto":
            name += f"-{self.kv_cache_dtype}"
        return name if self.page_size == 1 else f"{name}-page{self.page_size}"

    @property
    def all_server_args(self) -> tuple[str, ...]:
        return (*self.server_args, "--kv-cache-dtype", self.kv_cache_dtype,
                "--page-size", str(self.page_size))

    @property
    def relocates(self) -> bool:
        return self.env.get("VERIFY_OPS_DEFRAG") == "2"


STANDALONE_CHAIN = Case(SpecConfig("STANDALONE", **CHAIN))
STANDALONE_TREE = Case(SpecConfig("STANDALONE", **TREE), env=RELOCATION_ENV,
                       max_total_tokens=TIGHT_POOL_TOKENS,
                       server_args=("--disable-radix-cache",))
EAGLE_CHAIN = Case(SpecConfig("EAGLE", **CHAIN))
EAGLE_TREE = Case(SpecConfig("EAGLE", **TREE))
WINDOWED_TREE = Case(SpecConfig("STANDALONE", **TREE), model="gemma2",
                     backends=("verify_ops",))
PAGED_TREE = Case(SpecConfig("STANDALONE", **TREE), backends=("verify_ops",), page_size=16)
FP8_KV_CHAIN = Case(SpecConfig("STANDALONE", **CHAIN), backends=("verify_ops",),
                    kv_cache_dtype="fp8_e4m3")
FP8_KV_PAGED_TREE = Case(SpecConfig("STANDALONE", **TREE), backends=("verify_ops",),
                         kv_cache_dtype="fp8_e5m2", page_size=64)
GPT_OSS_TREE = Case(SpecConfig("STANDALONE", **TREE), model="gpt-oss", backends=("verify_ops",),
                    server_args=GPT_OSS_SERVER_ARGS)
EXAONE4_TREE = Case(SpecConfig("STANDALONE", **TREE), model="exaone4", backends=("verify_ops",))
CASES = {case.name: case for case in (STANDALONE_CHAIN, STANDALONE_TREE, EAGLE_CHAIN,
                                      EAGLE_TREE, WINDOWED_TREE, PAGED_TREE, FP8_KV_CHAIN,
                                      FP8_KV_PAGED_TREE, GPT_OSS_TREE, EXAONE4_TREE)}
SERVERS = [(name, backend) for name, case in CASES.items() for backend in case.backends]


@dataclass
class Served:
    """One server's answers: per prompt, its output ids and verify rounds."""
    output_ids: list[list[int]]
    rounds: list[Rounds]
    log: ServerLog


@pytest.fixture(scope="module", autouse=True)
def usable_interpreter():
    """The servers run SGLang's Triton kernels interpreted, on the CPU."""
    reason = interpreter_unusable_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The checkpoint folders by name: the targets ``llama``, ``gemma2``,
    ``gpt-oss`` and ``exaone4``, and ``llama-eagle``, the Llama's EAGLE head."""
    root = tmp_path_factory.mktemp("tiny-models")
    llama = build_tiny_models(root)
    return {"llama": llama.target, "llama-eagle": llama.eagle,
            "gemma2": build_tiny_gemma2(root), "gpt-oss": build_tiny_gpt_oss(root),
            "exaone4": build_tiny_exaone4(root)}


@pytest.fixture(scope="module")
def prompts(checkpoints) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoints["llama"])
    return [tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(checkpoints):
    """``reference(model, kv_cache_dtype)``: that target's Hugging Face greedy
    model (loaded once), as it runs on a pool of that KV dtype."""
    loaded: dict[tuple[str, str], GreedyModel] = {}

    def get(model: str, kv_cache_dtype: str = "auto") -> GreedyModel:
        if (model, kv_cache_dtype) not in loaded:
            loaded[model, kv_cache_dtype] = (
                GreedyModel(checkpoints[model]) if kv_cache_dtype == "auto"
                else Fp8KvGreedyModel(checkpoints[model], kv_cache_dtype))
        return loaded[model, kv_cache_dtype]

    return get


@pytest.fixture(scope="module")
def target(reference) -> GreedyModel:
    return reference("llama")


@pytest.fixture(scope="module")
def serve(checkpoints, prompts, tmp_path_factory):
    """``serve(case_name, backend)``: the server's answers, from one server per
    (case, backend), started on first use and stopped once it has answered."""
    logs = tmp_path_factory.mktemp("server-logs")
    answers: dict[tuple[str, str], Served | Exception] = {}

    def run(name: str, backend: str) -> Served:
        if (name, backend) not in answers:
            try:
                answers[name, backend] = answer(name, backend, logs / f"{name}-{backend}.log")
            except Exception as error:  # every test of this server fails with it, none retries
                answers[name, backend] = error
        result = answers[name, backend]
        if isinstance(result, Exception):
            raise RuntimeError(f"the {backend} server of {name} failed") from result
        return result

    def answer(name: str, backend: str, log_path: Path) -> Served:
        case = CASES[name]
        model = checkpoints[case.model]
        draft = model if case.spec.algorithm == "STANDALONE" else checkpoints[
            f"{case.model}-eagle"]
        with LiveServer(model=model, draft=draft, spec=case.spec, backend=backend,
                        log_path=log_path, env=case.env,
                        max_total_tokens=case.max_total_tokens,
                        extra_args=case.all_server_args) as server:
            try:
                results = server.generate(prompts, NEW_TOKENS)
            except Exception as error:
                raise RuntimeError(f"generate failed; server log tail:\n{server.log_tail()}"
                                   ) from error
        return Served([r["output_ids"] for r in results],
                      [Rounds.from_meta(r["meta_info"]) for r in results], server.log())

    return run


@pytest.mark.parametrize("name, backend", SERVERS)
def test_outputs_are_greedy(serve, reference, prompts, name, backend):
    case = CASES[name]
    served, model = serve(name, backend), reference(case.model, case.kv_cache_dtype)
    expected = [model.continuation(p, NEW_TOKENS) for p in prompts]
    assert served.output_ids == expected


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if "triton" in case.backends])
def test_same_rounds_as_triton(serve, name):
    """Same output and the same verify rounds: the drafter got the same state
    (hidden states, KV, accepted tokens) from verify_ops as from Triton."""
    ours, triton = serve(name, "verify_ops"), serve(name, "triton")
    assert ours.output_ids == triton.output_ids
    assert ours.rounds == triton.rounds


@pytest.mark.parametrize("name", CASES)
def test_op_served_every_verify(serve, name):
    served, spec = serve(name, "verify_ops"), CASES[name].spec
    log = served.log
    assert not log.has_fallback_warning, "a fallback warning was logged"
    assert log.fallback_reasons == []
    assert log.op_batches, ("no 'TARGET_VERIFY served by tree_attn' line: this verify_ops "
                            "does not log verify batches under VERIFY_OPS_LOG_VERIFY=1")
    assert {d for _, d in log.op_batches} == {spec.num_draft_tokens}
    # Every request's every round was in a batch the op served.
    assert sum(bs for bs, _ in log.op_batches) == sum(r.verify_ct for r in served.rounds)


def test_standalone_chain_acceptance(serve, target, prompts):
    """The draft is the target itself. SGLang's figure is what its shifted draft
    inputs allow; a draft fed the whole context would reach num_steps + 1."""
    served = serve(STANDALONE_CHAIN.name, "verify_ops")
    sglang_draft = standalone_drafter(target, NUM_STEPS, sees_first_token=False)
    whole_context_draft = standalone_drafter(target, NUM_STEPS, sees_first_token=True)
    for prompt, rounds in zip(prompts, served.rounds):
        assert rounds == chain_rounds(target, sglang_draft, prompt, NEW_TOKENS, NUM_STEPS)
        ideal = chain_rounds(target, whole_context_draft, prompt, NEW_TOKENS, NUM_STEPS)
        assert ideal.accept_length >= 0.9 * (NUM_STEPS + 1)


def test_eagle_chain_acceptance(serve, target, prompts):
    """The echo head proposes the last token again: accepted where the output repeats."""
    served = serve(EAGLE_CHAIN.name, "verify_ops")
    for prompt, rounds in zip(prompts, served.rounds):
        assert rounds == chain_rounds(target, echo_drafter(NUM_STEPS), prompt, NEW_TOKENS,
                                      NUM_STEPS)


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case.relocates])
def test_live_relocation_ran(serve, name):
    """The outputs of this case are checked above; here, that relocation did move KV."""
    relocations = serve(name, "verify_ops").log.relocations
    assert relocations and all(requests > 0 and slots > 0 for requests, slots in relocations)


@pytest.mark.parametrize("feature_off", [{"sliding_window": MAX_POSITIONS},
                                         {"attn_logit_softcapping": None}],
                         ids=["window", "soft-cap"])
def test_windowed_model_needs_its_features(reference, checkpoints, prompts, feature_off):
    """The windowed case can fail: without its window (or its soft-cap) the
    Gemma-2's greedy continuation differs, and a prompt alone exceeds the window."""
    assert max(len(p) for p in prompts) > SLIDING_WINDOW
    without = GreedyModel(checkpoints["gemma2"], **feature_off)
    assert any(without.continuation(p, NEW_TOKENS) != reference("gemma2").continuation(
        p, NEW_TOKENS) for p in prompts)


def _without_sinks(checkpoint: Path) -> GreedyModel:
    model = GreedyModel(checkpoint)
    with torch.no_grad():
        for layer in model.model.model.layers:
            layer.self_attn.sinks.fill_(float("-inf"))  # exp(-inf): nothing in the denominator
    return model


@pytest.mark.parametrize("feature_off", ["window", "sinks"])
def test_gpt_oss_needs_its_window_and_sinks(reference, checkpoints, prompts, feature_off):
    """The gpt-oss case can fail: without its window (or its sinks) the greedy
    continuation differs."""
    checkpoint = checkpoints["gpt-oss"]
    without = (GreedyModel(checkpoint, sliding_window=MAX_POSITIONS) if feature_off == "window"
               else _without_sinks(checkpoint))
    assert any(without.continuation(p, NEW_TOKENS) != reference("gpt-oss").continuation(
        p, NEW_TOKENS) for p in prompts)


def test_exaone4_needs_its_window(reference, checkpoints, prompts):
    """The Exaone 4 case can fail: without its window the greedy continuation differs."""
    without = GreedyModel(checkpoints["exaone4"], sliding_window=MAX_POSITIONS)
    assert any(without.continuation(p, NEW_TOKENS) != reference("exaone4").continuation(
        p, NEW_TOKENS) for p in prompts)


@pytest.mark.parametrize("kv_cache_dtype", sorted(Fp8KvGreedyModel.DTYPES))
def test_fp8_kv_reference_differs_from_the_exact_one(reference, prompts, kv_cache_dtype):
    """The fp8 cases can fail: rounding K/V to fp8 changes the greedy continuation."""
    exact, rounded = reference("llama"), reference("llama", kv_cache_dtype)
    assert any(rounded.continuation(p, NEW_TOKENS) != exact.continuation(p, NEW_TOKENS)
               for p in prompts)
