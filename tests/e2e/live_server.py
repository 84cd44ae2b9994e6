"""Start a real SGLang server on the CPU with speculative decoding, talk to it
over HTTP, and read what the verify_ops backend logged.

The server runs SGLang's Triton kernels in Triton's interpreter
(``TRITON_INTERPRET=1``) in fp32 (bf16 gives garbage there), with the CPU
bridges of ``cpu_bridges/`` on its ``PYTHONPATH`` and the checkout's
``verify_ops`` ahead of any installed one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import verify_ops

PLUGINS = Path(__file__).resolve().parent / "sglang_plugins"
CHECKOUT = Path(verify_ops.__file__).resolve().parent.parent

OP_LINE = re.compile(r"verify_ops: TARGET_VERIFY served by tree_attn \(bs=(\d+), D=(\d+)\)")
FALLBACK_LINE = re.compile(r"verify_ops: TARGET_VERIFY served by Triton fallback \((.*)\)")
FALLBACK_WARNING = "is not supported by the tree op"
RELOCATION_LINE = re.compile(r"verify_ops defrag: moved (\d+) requests \((\d+) slots\)")


@dataclass(frozen=True)
class SpecConfig:
    """One server's speculative-decoding setup."""
    algorithm: str  # "STANDALONE" or "EAGLE"
    topk: int
    num_steps: int
    num_draft_tokens: int

    @property
    def name(self) -> str:
        shape = "chain" if self.topk == 1 else "tree"
        return (f"{self.algorithm.lower()}-{shape}-steps{self.num_steps}-topk{self.topk}-"
                f"drafts{self.num_draft_tokens}")


@dataclass
class ServerLog:
    """What a server printed, and what verify_ops said about TARGET_VERIFY in it."""
    text: str
    op_batches: list[tuple[int, int]] = field(init=False)  # (bs, D) per batch the op served
    fallback_reasons: list[str] = field(init=False)  # one per batch Triton's path served
    relocations: list[tuple[int, int]] = field(init=False)  # (requests, slots) per move

    def __post_init__(self):
        self.op_batches = [(int(bs), int(d)) for bs, d in OP_LINE.findall(self.text)]
        self.fallback_reasons = FALLBACK_LINE.findall(self.text)
        self.relocations = [(int(r), int(s)) for r, s in RELOCATION_LINE.findall(self.text)]

    @property
    def has_fallback_warning(self) -> bool:
        return FALLBACK_WARNING in self.text


class LiveServer:
    """``python -m sglang.launch_server`` in its own process group, logging to ``log_path``."""

    def __init__(self, *, model: Path, draft: Path, spec: SpecConfig, backend: str,
                 log_path: Path, env: Optional[dict[str, str]] = None,
                 max_total_tokens: int = 4096, extra_args: Sequence[str] = (),
                 start_timeout_s: float = 300):
        self.port = free_port()
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.command = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", str(model), "--device", "cpu", "--dtype", "float32",
            # EAGLE's draft worker knows only SGLang's own backend names.
            "--attention-backend", backend, "--speculative-draft-attention-backend", "triton",
            "--disable-cuda-graph",
            "--speculative-algorithm", spec.algorithm,
            "--speculative-draft-model-path", str(draft),
            "--speculative-num-steps", str(spec.num_steps),
            "--speculative-eagle-topk", str(spec.topk),
            "--speculative-num-draft-tokens", str(spec.num_draft_tokens),
            # One KV split: Triton's interpreter runs every program of the grid.
            "--triton-attention-num-kv-splits", "1",
            "--max-total-tokens", str(max_total_tokens), "--skip-server-warmup", "--random-seed", "0",
            "--host", "127.0.0.1", "--port", str(self.port), *extra_args]
        self.env = server_env(env or {})
        self.process: Optional[subprocess.Popen] = None

    def __enter__(self) -> "LiveServer":
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"SGLang server exited with {self.process.returncode} "
                                   f"before it was ready:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/model_info", timeout=5):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1)
        self.stop()
        raise TimeoutError(f"SGLang server not ready after {self.start_timeout_s:.0f} s:\n"
                           f"{self.log_tail()}")

    def generate(self, input_ids: list[list[int]], max_new_tokens: int,
                 timeout_s: float = 600) -> list[dict]:
        """Greedy generation of exactly ``max_new_tokens`` per prompt, as one batch;
        returns each request's ``{"output_ids": [...], "meta_info": {...}}``."""
        body = {"input_ids": input_ids,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens,
                                    "ignore_eos": True}}
        request = urllib.request.Request(self.url + "/generate", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def log(self) -> ServerLog:
        return ServerLog(self.log_path.read_text(errors="replace"))

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def server_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(CHECKOUT), str(PLUGINS)] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p]
    # CUDA_VISIBLE_DEVICES: SGLang's CPU path on a GPU machine too (it picks
    # kernels by the platform it sees, not by --device). TORCHDYNAMO_DISABLE:
    # SGLang's few torch.compile'd helpers run eagerly instead of waiting for a
    # C++ compiler.
    env.update(PYTHONPATH=os.pathsep.join(paths), CUDA_VISIBLE_DEVICES="",
               TRITON_INTERPRET="1", TORCHDYNAMO_DISABLE="1", VERIFY_OPS_LOG_VERIFY="1")
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
