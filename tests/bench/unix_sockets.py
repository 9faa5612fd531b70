#!/usr/bin/env python3
"""gRPC over a Unix-domain socket against loopback TCP (docs/PERFORMANCE.md,
"Unix-domain sockets"): `simple` (the ONNX add/sub model of
model_repository/, INT32 [1,16]) on the same release binary, one server
serving gRPC on both at once, perf_analyzer (gRPC's C core client, which
sends the socket path as `:authority`, so Tern's rewrite is on the measured
path) at concurrency 1 and 16, the two transports interleaved.

    make bench-unix   (or: python tests/bench/unix_sockets.py --tern target/release/tern)
"""

import argparse
import os
import shutil
import tempfile

from response_cache import ROOT, Server, perf_grpc  # the same server harness


def perf(a, url, conc):
    return perf_grpc(a.perf_analyzer, url, "simple", conc, a.duration)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tern", default=os.path.join(ROOT, "target", "release", "tern"))
    ap.add_argument("--perf-analyzer", default=os.path.join(ROOT, ".cache", "perf_analyzer", "perf_analyzer"))
    ap.add_argument("--duration", type=float, default=3.0, help="perf_analyzer window, seconds")
    ap.add_argument("--rounds", type=int, default=3, help="times each setup is measured, interleaved")
    a = ap.parse_args()
    os.environ.setdefault("ORT_DYLIB_PATH", os.path.join(ROOT, ".cache", "onnxruntime", "libonnxruntime.so"))
    scratch = tempfile.mkdtemp(prefix="tern-bench-unix-", dir="/tmp")
    repo = os.path.join(scratch, "models")
    shutil.copytree(os.path.join(ROOT, "model_repository", "simple"), os.path.join(repo, "simple"))
    sock = os.path.join(scratch, "grpc.sock")
    server = Server(a.tern, repo, [f"--grpc-address=unix:{sock},127.0.0.1"], os.path.join(scratch, "server.log"))
    try:
        with open(os.path.join(scratch, "server.log")) as f:
            log = f.read()
        port = int(log.split("started GRPCInferenceService at 127.0.0.1:")[1].split()[0].rstrip('"'))
        results = {}
        for _ in range(a.rounds):
            for conc in (1, 16):
                for label, url in (("loopback TCP", f"127.0.0.1:{port}"), ("Unix socket", f"unix:{sock}")):
                    results.setdefault((conc, label), []).append(perf(a, url, conc))
    finally:
        server.stop()
    print(f"| concurrency | transport | infer/s (median of {a.rounds}) | vs TCP | p99 ms (median) |")
    print("|---|---|---|---|---|")
    for conc in (1, 16):
        base = sorted(r[0] for r in results[(conc, "loopback TCP")])[a.rounds // 2]
        for label in ("loopback TCP", "Unix socket"):
            runs = results[(conc, label)]
            thr = sorted(r[0] for r in runs)[a.rounds // 2]
            p99 = sorted(r[1] for r in runs)[a.rounds // 2]
            print(f"| {conc} | {label} | {thr:,.0f} | {thr / base:.2f}× | {p99:.2f} |")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
