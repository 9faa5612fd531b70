#!/usr/bin/env python3
"""Streaming (decoupled) benchmark (docs/PERFORMANCE.md).

    make bench-streaming    # or: python tests/bench/streaming.py --tern target/release/tern --plugins target/wasm32-wasip2/release

The greedy decoder plugin generating 16 tokens over BLS calls to `tiny_lm`
(eos disabled, so every run makes 16), measured two ways in the same run:

* baseline: `greedy_decoder`, not decoupled: one response with all tokens
  (unary gRPC ModelInfer);
* `greedy_decoder_stream`, decoupled: one response per token, over gRPC
  ModelStreamInfer and over HTTP generate_stream (server-sent events).

Reported (median of --runs): time to the first token, time to the last
token, and the streaming overhead per token (last-token time of the stream
minus the baseline's, divided by the tokens).
"""

import argparse
import http.client
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_load import free_port, wait_http  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gen_models  # noqa: E402

TOKENS = 16


def repo(root, plugins):
    gen_models.tiny_lm(f"{root}/tiny_lm/1/model.onnx")
    shutil.copy(os.path.join(ROOT, "model_repository", "tiny_lm", "config.pbtxt"), f"{root}/tiny_lm/config.pbtxt")
    for name in ("greedy_decoder", "greedy_decoder_stream"):
        os.makedirs(f"{root}/{name}/1", exist_ok=True)
        shutil.copy(os.path.join(plugins, "greedy_decoder.wasm"), f"{root}/{name}/1/model.wasm")
        cfg = open(os.path.join(ROOT, "model_repository", name, "config.pbtxt")).read()
        cfg = cfg.replace('string_value: "0" } }', 'string_value: "-1" } }')  # eos_token_id: never stop early
        with open(f"{root}/{name}/config.pbtxt", "w") as f:
            f.write(cfg)


def ids(mod):
    i = mod.InferInput("input_ids", [1, 1], "INT64")
    i.set_data_from_numpy(np.array([[1]], dtype=np.int64))
    return i


def unary(url, runs):
    import tritonclient.grpc as g

    c = g.InferenceServerClient(url)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        out = c.infer("greedy_decoder", [ids(g)]).as_numpy("output_ids")
        times.append(time.perf_counter() - t)
        assert out.shape[1] == TOKENS
    return times, times


def grpc_stream(url, runs):
    import tritonclient.grpc as g

    c = g.InferenceServerClient(url)
    q = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((time.perf_counter(), result, error)))
    first, last = [], []
    for _ in range(runs):
        t = time.perf_counter()
        c.async_stream_infer("greedy_decoder_stream", [ids(g)])
        n = 0
        while n < TOKENS:
            at, r, e = q.get(timeout=30)
            assert e is None, e
            if n == 0:
                first.append(at - t)
            n += 1
        last.append(at - t)
    c.stop_stream()
    return first, last


def sse(port, runs):
    first, last = [], []
    body = json.dumps({"input_ids": [1]})
    for _ in range(runs):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        t = time.perf_counter()
        conn.request("POST", "/v2/models/greedy_decoder_stream/generate_stream", body)
        resp = conn.getresponse()
        n = 0
        while n < TOKENS:
            line = resp.fp.readline()
            if line.startswith(b"data: "):
                if n == 0:
                    first.append(time.perf_counter() - t)
                n += 1
        last.append(time.perf_counter() - t)
        # The chunks were read raw (event lines counted as they arrive): just hang up.
        conn.close()
    return first, last


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--plugins", default=os.path.join(ROOT, "target", "wasm32-wasip2", "release"))
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-stream-")
    repo(root, args.plugins)
    http, grpc, metrics = free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [args.tern, f"--model-repository={root}", f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(http, "/v2/health/ready")
        url = f"127.0.0.1:{grpc}"
        for warm in (unary, grpc_stream):
            warm(url, 10)
        sse(http, 10)
        rows = [
            ("`greedy_decoder`, unary gRPC (baseline)", unary(url, args.runs)),
            ("`greedy_decoder_stream`, gRPC stream", grpc_stream(url, args.runs)),
            ("`greedy_decoder_stream`, HTTP generate_stream", sse(http, args.runs)),
        ]
        base = statistics.median(rows[0][1][1])
        print(f"{TOKENS} tokens, median of {args.runs} runs")
        print()
        print("| path | first token ms | last token ms | overhead per token vs baseline µs |")
        print("|---|---|---|---|")
        for name, (first, last) in rows:
            f, l = statistics.median(first) * 1000, statistics.median(last) * 1000
            over = (statistics.median(last) - base) / TOKENS * 1e6
            print(f"| {name} | {f:.2f} | {l:.2f} | {over:+.0f} |")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
