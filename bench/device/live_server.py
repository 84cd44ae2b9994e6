"""A live SGLang server on the lent GPU, one attention backend at a time: greedy
outputs compared between backends, and decode speed at batch 1 from 4k to 64k
tokens of context.

For each speculative shape (``chain``: 3 steps, topk 1, 4 draft tokens;
``tree``: 3 steps, topk 4, 8 draft tokens) and each backend, it launches
``python -m sglang.launch_server`` on the random-weight Llama-3.1-8B-shaped
model that ``live_model.py`` wrote (``--load-format dummy``, filled by
``live_dummy_init.py``) with a STANDALONE draft of its first layers, CUDA graphs
on, then over HTTP:

- ``check``: a few prompts, greedy, 32 tokens, each alone and then all in one
  batch, with the top-2 log-probabilities of every output token;
- ``speed``: one prompt of random token ids per context length (the same ids
  for every backend), 128 tokens, ``ignore_eos``, streamed: decode tokens/s is
  the tokens after the first streamed chunk over the time after it; run twice,
  the second time with the prompt in SGLang's prefix cache;
- for ``verify_ops``, the ``VERIFY_OPS_LOG_VERIFY=1`` lines of the server log:
  TARGET_VERIFY batches served by the op, and by Triton's fallback (per reason).

Each run is saved as ``<results>/<shape>-<backend>.json`` (kept on the box while
it is warm, so runs split over calls still meet), its server log in ``--out``.
Then ``report`` compares every backend's outputs with Triton's, prints the table
and writes ``live_table.json`` and ``live_runs.json`` (every run in full) to ``--out``.

    python bench/device/live_server.py run --shapes chain --backends triton,verify_ops \\
        --models .live/models --results .live/results --out $OUT
    python bench/device/live_server.py report --results .live/results --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {  # --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens
    "chain": (3, 1, 4),
    "tree": (3, 4, 8),
}
LENGTHS = (4096, 16384, 32768, 65536)
CONTEXT_LENGTH = 70000
CHECK_TOKENS = 32
# Log-probability gap (nats) under which two tokens count as tied for the
# greedy choice: bf16 logits of two correct kernels differ by about 1e-2.
TIE_NATS = 0.1
SERVED = re.compile(r"TARGET_VERIFY served by tree_attn")
FALLBACK = re.compile(r"TARGET_VERIFY served by Triton fallback \((.*)\)")
INIT_LINE = "live_dummy_init:"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def server_command(args, shape: str, backend: str, port: int) -> list[str]:
    steps, topk, drafts = SHAPES[shape]
    command = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(args.models / "target"),
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", str(args.models / "draft"),
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(drafts),
        "--attention-backend", backend,
        "--load-format", "dummy",
        "--dtype", "bfloat16",
        "--context-length", str(CONTEXT_LENGTH),
        "--mem-fraction-static", str(args.mem_fraction),
        # Decode graphs (which also hold TARGET_VERIFY and the draft's steps) up to
        # batch 4; no prefill graphs (0.5.17 captures 58 of them, up to 8192 tokens, by
        # default): they would only add start-up time, and prefill is not timed.
        "--cuda-graph-max-bs-decode", "4",
        "--disable-prefill-cuda-graph",
        "--max-running-requests", "4",
        "--grammar-backend", "none",
        "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "info",
    ]
    if backend == "verify_ops":  # EAGLE's draft worker knows only the built-in backends
        command += ["--speculative-draft-attention-backend", "triton"]
    return command + args.server_args


def server_env(backend: str, draft_layers: int) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", LIVE_DUMMY_INIT="1",
               LIVE_IDENTITY_FROM=str(draft_layers))
    if backend == "verify_ops":
        env["VERIFY_OPS_LOG_VERIFY"] = "1"
    return env


class Server:
    """One launch_server process group, its log in a file."""

    def __init__(self, command, env, log_path: Path, port: int):
        self.port = port
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        self.process = subprocess.Popen(command, env=env, stdout=self.log_file,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float) -> None:
        import requests

        start = time.time()
        while time.time() - start < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode} while starting")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        raise TimeoutError(f"server not ready after {timeout_s:.0f} s")

    def _group_gone(self, timeout_s: float) -> bool:
        give_up = time.time() + timeout_s
        while time.time() < give_up:
            self.process.poll()  # reaps the leader
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.5)
        return False

    def stop(self) -> None:
        """SIGTERM to the whole group (the scheduler holds the GPU), SIGKILL to
        what is left after 20 s; returns once no process of it remains."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            if self._group_gone(20):
                break
        self.process.wait()
        self.log_file.close()

    def log_text(self) -> str:
        self.log_file.flush()
        return self.log_path.read_text(errors="replace")


def generate(url: str, payload: dict, timeout_s: float) -> dict | list:
    import requests

    response = requests.post(url + "/generate", json=payload, timeout=timeout_s)
    if response.status_code != 200:
        raise RuntimeError(f"/generate {response.status_code}: {response.text[:500]}")
    return response.json()


def check_prompts(count: int) -> list[list[int]]:
    """Token-id prompts of a few lengths, from a fixed seed (the same everywhere)."""
    rng = random.Random(1234)
    lengths = [7, 100, 1000, 3000, 300, 30][:count]
    return [[rng.randrange(0, 128000) for _ in range(n)] for n in lengths]


def summarize_output(out: dict) -> dict:
    meta = out.get("meta_info", {})
    summary = {"output_ids": out.get("output_ids"),
               "accept_length": meta.get("spec_accept_length"),
               "verify_ct": meta.get("spec_verify_ct")}
    if "output_token_logprobs" in meta:
        summary["logprobs"] = [entry[0] for entry in meta["output_token_logprobs"]]
        summary["top2"] = [[[e[0], e[1]] for e in top[:2]] if top else []
                           for top in meta.get("output_top_logprobs") or []]
    return summary


def run_check(server: Server, prompts, timeout_s: float) -> dict:
    """Greedy outputs of each prompt alone, then of all in one batch."""
    params = {"temperature": 0, "max_new_tokens": CHECK_TOKENS, "ignore_eos": True}
    with_logprobs = {"return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": -1}
    result = {"alone": [], "batch": None, "logprobs": True}
    for ids in prompts:
        payload = {"input_ids": ids, "sampling_params": params, **with_logprobs}
        try:
            out = generate(server.url, payload, timeout_s)
        except RuntimeError as exc:  # logprobs unsupported here: outputs alone still compare
            log(f"check with log-probabilities failed ({exc}); retrying without")
            result["logprobs"] = False
            with_logprobs = {}
            out = generate(server.url, {"input_ids": ids, "sampling_params": params}, timeout_s)
        result["alone"].append(summarize_output(out))
    batch = generate(server.url, {"input_ids": prompts, "sampling_params": params,
                                  **with_logprobs}, timeout_s)
    result["batch"] = [summarize_output(out) for out in batch]
    return result


def stream_decode(url: str, ids: list[int], new_tokens: int, timeout_s: float) -> dict:
    """One streamed request; times the chunks after the first (the prefill's)."""
    import requests

    payload = {"input_ids": ids, "stream": True,
               "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens,
                                   "ignore_eos": True}}
    start = time.perf_counter()
    first = None
    chunks = 0
    final = None
    with requests.post(url + "/generate", json=payload, stream=True, timeout=timeout_s) as r:
        if r.status_code != 200:
            raise RuntimeError(f"/generate {r.status_code}: {r.text[:500]}")
        for line in r.iter_lines():
            if not line.startswith(b"data:"):
                continue
            body = line[5:].strip()
            if body == b"[DONE]":
                break
            chunk = json.loads(body)
            now = time.perf_counter()
            tokens = len(chunk.get("output_ids") or [])
            if tokens == 0:
                continue
            chunks += 1
            if first is None:
                first = (now, tokens)
            final = (now, tokens, chunk)
    end_time, end_tokens, last = final
    meta = last.get("meta_info", {})
    decode_s = end_time - first[0]
    decode_tokens = end_tokens - first[1]
    return {
        "ttft_s": first[0] - start,
        "decode_s": decode_s,
        "decode_tokens": decode_tokens,
        "tokens_per_s": decode_tokens / decode_s if decode_s > 0 else None,
        # Verify steps when SGLang counts them; else the streamed chunks, one a step
        # unless the client fell behind.
        "step_ms": 1e3 * decode_s / (meta.get("spec_verify_ct") or max(chunks - 1, 1)),
        "steps": chunks - 1,
        "accept_length": meta.get("spec_accept_length"),
        "verify_ct": meta.get("spec_verify_ct"),
        "output_ids": last.get("output_ids"),
    }


def run_speed(server: Server, lengths, new_tokens: int, repeats: int, timeout_s: float,
              deadline: float) -> list[dict]:
    rows = []
    for length in lengths:
        if time.time() > deadline:
            log(f"speed: skipping {length} and longer (call deadline)")
            break
        rng = random.Random(length)
        ids = [rng.randrange(0, 128000) for _ in range(length)]
        for repeat in range(repeats):
            row = stream_decode(server.url, ids, new_tokens, timeout_s)
            row.update(context=length, repeat=repeat)
            rows.append(row)
            log(f"  {length:6d} tokens, run {repeat}: {row['tokens_per_s']:.1f} tok/s, "
                f"step {row['step_ms']:.2f} ms, accept {row['accept_length']}, "
                f"ttft {row['ttft_s']:.2f} s")
    return rows


def verify_counts(log_text: str) -> dict:
    fallbacks: dict[str, int] = {}
    for match in FALLBACK.finditer(log_text):
        fallbacks[match.group(1)] = fallbacks.get(match.group(1), 0) + 1
    return {"served": len(SERVED.findall(log_text)), "fallbacks": fallbacks,
            "fallback_warnings": [line for line in log_text.splitlines()
                                  if "verify_ops" in line and "fall" in line.lower()
                                  and "WARNING" in line][:10]}


def run_one(args, shape: str, backend: str, port: int, deadline: float) -> dict:
    log_path = args.logs / f"server-{shape}-{backend}.log"
    command = server_command(args, shape, backend, port)
    log(f"{shape}/{backend}: starting: {' '.join(command[1:])}")
    result = {"shape": shape, "backend": backend, "spec": SHAPES[shape], "command": command,
              "device": gpu_name()}
    started = time.time()
    server = Server(command, server_env(backend, args.draft_layers), log_path, port)
    try:
        server.wait_ready(min(args.start_timeout, max(30.0, deadline - time.time())))
        result["start_s"] = time.time() - started
        log(f"{shape}/{backend}: ready in {result['start_s']:.0f} s")
        fills = server.log_text().count(INIT_LINE)
        if fills < 2:
            raise RuntimeError(f"{INIT_LINE} logged {fills} times, expected 2 (target and "
                               "draft): the live weights plugin did not run")
        before = verify_counts(server.log_text())
        result["check"] = run_check(server, check_prompts(args.check_prompts), args.timeout)
        log(f"{shape}/{backend}: check done; accept lengths "
            f"{[o['accept_length'] for o in result['check']['alone']]}")
        result["speed"] = run_speed(server, args.lengths, args.new_tokens, args.repeats,
                                    args.timeout, deadline - 20)
        if backend == "verify_ops":
            counts = verify_counts(server.log_text())
            counts["served_during_check_and_speed"] = counts["served"] - before["served"]
            result["verify"] = counts
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001 - keep what was measured, show the log
        result["ok"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"
        log(f"{shape}/{backend}: FAILED: {result['error']}")
        tail = server.log_text().splitlines()[-60:]
        print("\n".join("    | " + line for line in tail), flush=True)
    finally:
        server.stop()
    result["wall_s"] = time.time() - started
    return result


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def compare_outputs(reference: dict, other: dict) -> dict:
    """Per prompt: identical, or where the two first differ and whether the
    reference's own top-2 log-probabilities call that position a tie."""
    rows = []
    for mode in ("alone", "batch"):
        for i, (ref, oth) in enumerate(zip(reference["check"][mode], other["check"][mode])):
            a, b = ref["output_ids"], oth["output_ids"]
            same = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
            row = {"mode": mode, "prompt": i, "identical": a == b, "first_difference": same}
            if ref.get("logprobs") and oth.get("logprobs"):
                upto = len(a) if same is None else same + 1
                diffs = [abs(x - y) for x, y in zip(ref["logprobs"][:upto],
                                                    oth["logprobs"][:upto])
                         if x is not None and y is not None]
                row["max_logprob_diff"] = max(diffs) if diffs else 0.0
                if same is not None and ref.get("top2") and len(ref["top2"][same]) == 2:
                    (lp1, _), (lp2, _) = ref["top2"][same]
                    row["gap_at_difference"] = abs(lp1 - lp2)
            row["tie"] = (not row["identical"]) and row.get("gap_at_difference", 1e9) < TIE_NATS
            row["ok"] = ((row["identical"] or row["tie"])
                         and row.get("max_logprob_diff", 0) < TIE_NATS)
            rows.append(row)
    diffs = [r["max_logprob_diff"] for r in rows if "max_logprob_diff" in r]
    return {"prompts": rows, "ok": all(r["ok"] for r in rows),
            "identical": sum(r["identical"] for r in rows), "of": len(rows),
            "max_logprob_diff": max(diffs) if diffs else None}


def report(results_dir: Path, out: Path | None) -> int:
    runs = {}
    for path in sorted(results_dir.glob("*.json")):
        data = json.loads(path.read_text())
        # One run, or a live_runs.json of several (as fetched from calls on
        # machines that went cold between them); the later file wins a duplicate.
        for run in data if isinstance(data, list) else [data]:
            if isinstance(run, dict) and "shape" in run:
                runs[(run["shape"], run["backend"])] = run
    if not runs:
        print("no runs in", results_dir)
        return 1
    table = []
    for (shape, backend), run in sorted(runs.items()):
        row = {"shape": shape, "backend": backend, "ok": run.get("ok"), "device": run.get("device"),
               "error": run.get("error")}
        speed: dict[int, list[float]] = {}
        for s in run.get("speed", []):
            speed.setdefault(s["context"], []).append(s)
        # The best of the repeats: the second runs with the prompt cached.
        row["tokens_per_s"] = {c: max(x["tokens_per_s"] for x in v) for c, v in speed.items()}
        row["step_ms"] = {c: min(x["step_ms"] for x in v) for c, v in speed.items()}
        row["accept_length"] = {c: v[-1]["accept_length"] for c, v in speed.items()}
        reference = runs.get((shape, "triton"))
        if backend != "triton" and reference and reference.get("check") and run.get("check"):
            row["vs_triton"] = compare_outputs(reference, run)
        if "verify" in run:
            row["verify"] = {k: run["verify"][k] for k in ("served", "fallbacks")}
        table.append(row)
    if out:
        (out / "live_table.json").write_text(json.dumps(table, indent=1) + "\n")
        (out / "live_runs.json").write_text(json.dumps(list(runs.values())) + "\n")
    contexts = sorted({c for row in table for c in row["tokens_per_s"]})
    print("\n=== live server: decode tokens/s at batch 1, best of the repeats "
          "(ms per decode step), mean accept length ===")
    header = f"{'shape':6} {'backend':11} " + " ".join(f"{c:>6} tok/s (ms)" for c in contexts)
    print(header + "  accept  outputs vs triton (max |d logprob|)  verify served/fallback")
    for row in table:
        cells = []
        for c in contexts:
            tps, ms = row["tokens_per_s"].get(c), row["step_ms"].get(c)
            cells.append(f"{tps:9.1f} ({ms:5.2f})" if tps else f"{'-':>17}")
        accept = [a for a in row["accept_length"].values() if a]
        accept_text = f"{sum(accept) / len(accept):5.2f}" if accept else "    -"
        if "vs_triton" in row:
            v = row["vs_triton"]
            versus = f"{'OK' if v['ok'] else 'DIFFER'} {v['identical']}/{v['of']} same"
            if v.get("max_logprob_diff") is not None:
                versus += f" dlp {v['max_logprob_diff']:.3f}"
        else:
            versus = "(reference)" if row["backend"] == "triton" else "-"
        verify = ""
        if "verify" in row:
            verify = f"{row['verify']['served']}/{sum(row['verify']['fallbacks'].values())}"
        status = "" if row["ok"] else f"  FAILED: {row['error']}"
        print(f"{row['shape']:6} {row['backend']:11} {' '.join(cells)}  {accept_text}  "
              f"{versus:33} {verify}{status}")
    for row in table:
        if "vs_triton" in row and not row["vs_triton"]["ok"]:
            print(f"{row['shape']}/{row['backend']} differs from triton:",
                  json.dumps([p for p in row["vs_triton"]["prompts"] if not p["ok"]])[:800])
    devices = sorted({row["device"] for row in table if row.get("device")})
    print("device:", ", ".join(devices))
    def passed(row) -> bool:
        verify = row.get("verify", {"served": 1, "fallbacks": {}})
        return (row["ok"] and row.get("vs_triton", {"ok": True})["ok"]
                and verify["served"] > 0 and not verify["fallbacks"])

    return 0 if all(passed(row) for row in table) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="launch, check and time each shape x backend")
    run.add_argument("--shapes", default="chain", help=f"comma list of {sorted(SHAPES)}")
    run.add_argument("--backends", default="triton,verify_ops")
    run.add_argument("--models", type=Path, required=True)
    run.add_argument("--results", type=Path, required=True)
    run.add_argument("--out", type=Path, default=None)
    run.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    run.add_argument("--new-tokens", type=int, default=128)
    run.add_argument("--repeats", type=int, default=2)
    run.add_argument("--check-prompts", type=int, default=4)
    run.add_argument("--draft-layers", type=int, default=2)
    run.add_argument("--mem-fraction", type=float, default=0.6)
    run.add_argument("--port", type=int, default=30123)
    run.add_argument("--start-timeout", type=float, default=420)
    run.add_argument("--timeout", type=float, default=180, help="per request, seconds")
    run.add_argument("--server-args", default="",
                     help="more launch_server arguments for every run, space-separated")
    run.add_argument("--deadline", type=float, default=None,
                     help="epoch seconds after which no new server starts (the call's limit)")
    rep = sub.add_parser("report", help="compare the saved runs (one per file, or "
                         "live_runs.json files) and print the table")
    rep.add_argument("--results", type=Path, required=True)
    rep.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "report":
        return report(args.results, args.out)
    args.lengths = [int(x) for x in args.lengths.split(",") if x]
    args.server_args = args.server_args.split()
    args.results.mkdir(parents=True, exist_ok=True)
    args.logs = args.out or args.results
    args.logs.mkdir(parents=True, exist_ok=True)
    deadline = args.deadline or time.time() + 1e9
    status = 0
    runs = [(shape, backend) for shape in args.shapes.split(",")
            for backend in args.backends.split(",")]
    for index, (shape, backend) in enumerate(runs):
        # A launch with CUDA-graph capture, the checks and four lengths: ~2-3 min.
        if time.time() > deadline - 150:
            log(f"{shape}/{backend}: not started, too close to the call's deadline")
            status = 1
            continue
        # A port of its own: the last server's may linger in TIME_WAIT.
        result = run_one(args, shape, backend, args.port + index, deadline)
        (args.results / f"{shape}-{backend}.json").write_text(json.dumps(result) + "\n")
        status |= 0 if result["ok"] else 1
    return status


if __name__ == "__main__":
    sys.exit(main())
