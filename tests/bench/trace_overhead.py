#!/usr/bin/env python3
"""What request tracing costs (docs/configuration.md, "Tracing"): `simple`
(the ONNX add/sub model of model_repository/, INT32 [1,16]) driven by
perf_analyzer over gRPC at concurrency 16, on the same release binary with
tracing off (the baseline), at rate 1000 and at rate 1 (level TIMESTAMPS,
Triton's trace file), and at rate 1 in OpenTelemetry mode with a collector
that accepts and drops the spans — one run, the setups interleaved.

    make bench-trace   (or: python tests/bench/trace_overhead.py --tern target/release/tern)
"""

import argparse
import http.server
import os
import shutil
import tempfile
import threading

from response_cache import ROOT, Server, perf_grpc  # the same server harness



class Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector that counts the spans' bytes and drops them."""

    received = 0

    def do_POST(self):
        Sink.received += len(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


def perf(a, server):
    return perf_grpc(a.perf_analyzer, f"127.0.0.1:{server.grpc}", "simple", a.concurrency, a.duration)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tern", default=os.path.join(ROOT, "target", "release", "tern"))
    ap.add_argument("--perf-analyzer", default=os.path.join(ROOT, ".cache", "perf_analyzer", "perf_analyzer"))
    ap.add_argument("--duration", type=float, default=3.0, help="perf_analyzer window, seconds")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2, help="times each setup is measured, interleaved")
    a = ap.parse_args()
    os.environ.setdefault("ORT_DYLIB_PATH", os.path.join(ROOT, ".cache", "onnxruntime", "libonnxruntime.so"))
    scratch = tempfile.mkdtemp(prefix="tern-bench-trace-")
    repo = os.path.join(scratch, "models")
    shutil.copytree(os.path.join(ROOT, "model_repository", "simple"), os.path.join(repo, "simple"))
    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{collector.server_address[1]}/v1/traces"
    trace_file = os.path.join(scratch, "trace.json")
    on = ["--trace-config=level=TIMESTAMPS", f"--trace-config=triton,file={trace_file}",
          "--trace-config=triton,log-frequency=10000"]
    setups = [
        ("off (baseline)", []),
        ("rate 1000, trace file", [*on, "--trace-config=rate=1000"]),
        ("rate 1, trace file", [*on, "--trace-config=rate=1"]),
        ("rate 1, OpenTelemetry", ["--trace-config=mode=opentelemetry", "--trace-config=level=TIMESTAMPS",
                                   "--trace-config=rate=1", f"--trace-config=opentelemetry,url={url}",
                                   "--trace-config=opentelemetry,bsp_max_queue_size=65536"]),
    ]
    results = {label: [] for label, _ in setups}
    for _ in range(a.rounds):
        for label, args in setups:
            server = Server(a.tern, repo, args, os.path.join(scratch, "server.log"))
            try:
                results[label].append(perf(a, server))
            finally:
                server.stop()
    base = max(r[0] for r in results[setups[0][0]])
    print(f"| tracing | infer/s (best of {a.rounds}) | vs off | p99 ms |")
    print("|---|---|---|---|")
    for label, _ in setups:
        best = max(results[label])
        print(f"| {label} | {best[0]:,.0f} | {best[0] / base:.2f}× | {best[1]:.2f} |")
    written = sum(os.path.getsize(os.path.join(scratch, f)) for f in os.listdir(scratch) if f.startswith("trace.json"))
    print(f"\ntrace files written: {written / 1e6:.1f} MB; spans received by the collector: {Sink.received / 1e6:.1f} MB")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
