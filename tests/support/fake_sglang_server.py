"""A stand-in for ``python -m sglang.launch_server`` that speaks the part of its
HTTP API the live-server driver uses (``/health``, ``/generate`` with token ids,
streamed or not, log-probabilities, batches) and logs the lines the driver reads,
so that ``bench/device/live_server.py`` runs end to end without a GPU.

    python tests/support/fake_sglang_server.py --port N [any launch_server flags]

Output token k of a prompt is ``(sum(prompt) + 7 k) % 1000``; with
``FAKE_SHIFT=1`` the third token of every output is one more (a backend that
differs from the others).
"""

import json
import math
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ACCEPT = 3.5


def outputs(prompt, count):
    tokens = [(sum(prompt) + 7 * k) % 1000 for k in range(count)]
    if os.environ.get("FAKE_SHIFT") == "1" and count > 2:
        tokens[2] += 1
    return tokens


def meta(prompt, tokens, logprobs):
    info = {"spec_accept_length": ACCEPT, "spec_verify_ct": math.ceil(len(tokens) / ACCEPT),
            "completion_tokens": len(tokens), "prompt_tokens": len(prompt)}
    if logprobs:
        info["output_token_logprobs"] = [[-0.5, t, None] for t in tokens]
        info["output_top_logprobs"] = [[[-0.5, t, None], [-2.5, t + 1, None]] for t in tokens]
    return info


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        count = body["sampling_params"]["max_new_tokens"]
        logprobs = body.get("return_logprob", False)
        prompts = body["input_ids"]
        batch = isinstance(prompts[0], list)
        size = len(prompts) if batch else 1
        print(f"verify_ops: TARGET_VERIFY served by tree_attn (bs={size}, D=4)", flush=True)
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            tokens = outputs(prompts, count)
            for end in [1] + list(range(5, count, 4)) + [count]:
                chunk = {"output_ids": tokens[:end],
                         "meta_info": meta(prompts, tokens[:end], False)}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            return
        results = [{"output_ids": outputs(p, count),
                    "meta_info": meta(p, outputs(p, count), logprobs)}
                   for p in (prompts if batch else [prompts])]
        data = json.dumps(results if batch else results[0]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main():
    port = int(sys.argv[sys.argv.index("--port") + 1])
    print("live_dummy_init: LlamaForCausalLM filled (fake)", flush=True)
    print("live_dummy_init: LlamaForCausalLM filled (fake)", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
