#!/usr/bin/env python3
"""gRPC load benchmark: Tern vs. a minimal tonic server, measured in the same run.

    make bench-grpc    # or: python tests/bench/grpc_load.py --tern target/release/tern --baseline target/release/examples/grpc_baseline

1. Unary ModelInfer on `simple` (2 x INT32[1,16], raw contents) driven by h2load
   (Debian nghttp2-client) with a pre-serialised gRPC message, at concurrency 1, 16, 64
   (one HTTP/2 connection per concurrent client). Mean latency is what h2load reports,
   and each server's CPU time per request (utime + stime from /proc) is reported beside
   throughput: on a machine whose cores are shared by client and servers it is the
   steadier figure. `--rounds N` repeats the whole sweep and reports the median ratio.
2. Streaming vs unary on Tern through the same client, so the ratio compares the two RPC
   styles, not clients: perf_analyzer (C++, installed by `make setup`) at concurrency 16,
   async unary then `--streaming`, median of `--rounds`; and the Python client
   (tritonclient.grpc.aio), which is itself the bottleneck at these rates.
3. Both servers through perf_analyzer (synchronous unary, concurrency 1 and 16, one round
   each per `--rounds`, alternating): throughput, p50 and p99 from a heavier client than
   h2load, the latency target's measure (the baseline answers metadata and config for it),
   and each server's CPU per request. A third server joins them: Tern with `simple` on
   the identity backend, which splits Tern's cost into its own request path and ONNX
   Runtime's per-call cost; and a fourth, the baseline given the model repository, which
   runs `simple` through ONNX Runtime inline (one session per worker thread, no scheduler):
   about the most a server running the model can serve here.
"""

import argparse
import asyncio
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_load import ROOT, free_port, rss_kib  # noqa: E402,F401
import identity_repo  # noqa: E402


def message():
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
    req.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    req.raw_input_contents.append(np.ones(16, dtype=np.int32).tobytes())
    payload = req.SerializeToString()
    return b"\x00" + struct.pack(">I", len(payload)) + payload


def wait_grpc(url, timeout=30):
    import tritonclient.grpc as grpcclient

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if grpcclient.InferenceServerClient(url).is_server_live():
                return
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    raise RuntimeError(f"no gRPC server at {url}")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def h2load(port, conc, duration, body, pid=None):
    cpu0 = cpu_seconds(pid) if pid else 0.0
    out = subprocess.run(
        [
            "h2load",
            f"-D{duration}",
            f"-c{conc}",
            "-m1",
            f"-t{min(2, conc)}",
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "-d",
            body,
            f"http://127.0.0.1:{port}/inference.GRPCInferenceService/ModelInfer",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"finished in [^,]+, ([\d.]+) req/s", out).group(1))
    m = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)

    def ms(v):
        n = float(re.match(r"[\d.]+", v).group(0))
        return n / 1000 if v.endswith("us") else n * 1000 if v.endswith("s") and not v.endswith("ms") else n

    ok = re.search(r"status codes: (\d+) 2xx", out)
    if not ok or int(ok.group(1)) == 0:
        raise RuntimeError(out)
    cpu_us = (cpu_seconds(pid) - cpu0) * 1e6 / int(ok.group(1)) if pid else 0.0
    return rps, ms(m.group(3)), cpu_us


async def unary_vs_stream(url, n=2000, conc=16):
    import tritonclient.grpc.aio as aio

    a = np.arange(16, dtype=np.int32).reshape(1, 16)

    def inputs():
        ins = [aio.InferInput("INPUT0", [1, 16], "INT32"), aio.InferInput("INPUT1", [1, 16], "INT32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(a)
        return ins

    c = aio.InferenceServerClient(url)
    sem = asyncio.Semaphore(conc)

    async def one():
        async with sem:
            await c.infer("simple", inputs())

    t0 = time.time()
    await asyncio.gather(*[one() for _ in range(n)])
    unary = n / (time.time() - t0)

    async def requests():
        for i in range(n):
            yield {"model_name": "simple", "inputs": inputs(), "request_id": str(i)}

    t0 = time.time()
    got = 0
    async for result, error in c.stream_infer(requests()):
        assert error is None, error
        got += 1
        if got == n:
            break
    stream = n / (time.time() - t0)
    await c.close()
    return unary, stream


PERF_ANALYZER = os.path.join(ROOT, ".cache", "perf_analyzer", "perf_analyzer")


def pa_throughput(port, *mode):
    """perf_analyzer's infer/s for `simple` at concurrency 16 (None if it gave no figure)."""
    out = subprocess.run(
        [PERF_ANALYZER, "-m", "simple", "-i", "grpc", "-u", f"127.0.0.1:{port}", "--concurrency-range=16", "-p", "3000", *mode],
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(r"Concurrency: 16, throughput: ([\d.]+) infer/sec", out)
    return float(m.group(1)) if m else None


def pa_sync(port, conc, pid=None):
    """(infer/s, p50 ms, p99 ms, server CPU µs per request) of perf_analyzer's
    synchronous unary `simple` at `conc` (None on no figure); the CPU figure
    (utime + stime of `pid` over the whole run, warm-up included) is NaN without `pid`."""
    cpu0, start = (cpu_seconds(pid) if pid else 0.0), time.monotonic()
    out = subprocess.run(
        [PERF_ANALYZER, "-m", "simple", "-i", "grpc", "-u", f"127.0.0.1:{port}", f"--concurrency-range={conc}",
         "-p", "3000", "--percentile=99", "-s", "50", "-r", "10"],
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(rf"Concurrency: {conc}, throughput: ([\d.]+) infer/sec, latency (\d+) usec", out)
    p50 = re.search(r"p50 latency: (\d+) usec", out)
    if not m or not p50:
        return None
    rate = float(m.group(1))
    cpu = (cpu_seconds(pid) - cpu0) / (rate * (time.monotonic() - start)) * 1e6 if pid else float("nan")
    return rate, int(p50.group(1)) / 1000, int(m.group(2)) / 1000, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile(suffix=".bin", delete=False) as f:
        f.write(message())
        body = f.name
    tport, bport, iport, oport = free_port(), free_port(), free_port(), free_port()
    work = tempfile.mkdtemp(prefix="tern-bench-grpc-")
    serve = ["--allow-http=false", "--grpc-address=127.0.0.1", "--log-info=false", "--allow-metrics=false"]
    tern = subprocess.Popen([args.tern, f"--model-repository={ROOT}/model_repository", f"--grpc-port={tport}", *serve])
    # The same server with `simple` on the identity backend: Tern's own request path.
    ident = subprocess.Popen([args.tern, f"--model-repository={identity_repo.make(work)}", f"--grpc-port={iport}", *serve])
    base = subprocess.Popen([args.baseline, str(bport)])
    # The baseline running `simple` through ONNX Runtime: the ceiling with the model.
    base_ort = subprocess.Popen([args.baseline, str(oport), f"{ROOT}/model_repository"])
    try:
        for port in (tport, bport, iport, oport):
            wait_grpc(f"127.0.0.1:{port}")
        rows = []
        for _ in range(args.rounds):
            for conc in (1, 16, 64):
                h2load(bport, conc, 2, body)
                h2load(tport, conc, 2, body)
                b = h2load(bport, conc, args.duration, body, base.pid)
                t = h2load(tport, conc, args.duration, body, tern.pid)
                rows.append((conc, t, b))
        unary, stream = asyncio.run(unary_vs_stream(f"127.0.0.1:{tport}"))
        pa, sync = [], []
        if os.path.exists(PERF_ANALYZER):
            for _ in range(args.rounds):
                pa.append((pa_throughput(tport, "-a"), pa_throughput(tport, "--streaming")))
            for r in range(args.rounds):
                for conc in (1, 16):
                    order = [("tern", tport, tern), ("identity", iport, ident), ("baseline", bport, base), ("baseline+ORT", oport, base_ort)]
                    for who, port, proc in order if r % 2 == 0 else order[::-1]:
                        sync.append((conc, who, pa_sync(port, conc, proc.pid)))
    finally:
        for proc in (tern, ident, base, base_ort):
            proc.terminate()
            proc.wait()
        os.unlink(body)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nh2load, {args.duration}s per point, unary ModelInfer on `simple` (raw contents), {os.cpu_count()} cores shared by client and servers\n")
    print("| concurrency | Tern req/s | tonic baseline req/s | Tern/baseline | Tern mean ms | baseline mean ms | Tern CPU µs/req | baseline CPU µs/req |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for conc, t, b in rows:
        print(f"| {conc} | {t[0]:.0f} | {b[0]:.0f} | {t[0] / b[0]:.2f} | {t[1]:.3f} | {b[1]:.3f} | {t[2]:.1f} | {b[2]:.1f} |")
    if args.rounds > 1:
        for conc in (1, 16, 64):
            ratios = sorted(t[0] / b[0] for c, t, b in rows if c == conc)
            print(f"concurrency {conc}: median Tern/baseline over {args.rounds} rounds {statistics.median(ratios):.2f} (all: {', '.join(f'{r:.2f}' for r in ratios)})")
    print(f"\ntritonclient.grpc.aio, 2000 requests, 16 in flight: unary {unary:.0f} req/s, streaming {stream:.0f} req/s (stream/unary {stream / unary:.2f})")
    if not pa:
        print(f"perf_analyzer not found at {PERF_ANALYZER} (make setup installs it): no streaming/unary figure from it")
    for u, st in pa:
        ratio = f"{st / u:.2f}" if u and st else "n/a"
        print(f"perf_analyzer, concurrency 16: async unary {u or 0:.0f} infer/s, streaming {st or 0:.0f} infer/s (stream/unary {ratio})")
    ratios = sorted(st / u for u, st in pa if u and st)
    if ratios:
        print(f"perf_analyzer stream/unary, median of {len(ratios)}: {statistics.median(ratios):.2f}")
    if sync:
        print("\nperf_analyzer, synchronous unary, medians over rounds (each 3 s windows until stable);")
        print("'identity': the same Tern with `simple` on the identity backend instead of ONNX Runtime;")
        print("'baseline+ORT': the baseline running `simple` through ONNX Runtime inline\n")
        print("| concurrency | server | infer/s | / baseline | / baseline+ORT | p50 / p99 ms | server CPU µs/req |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        for conc in (1, 16):
            def med(who, i):
                vals = [r[i] for c, w, r in sync if c == conc and w == who and r]
                return statistics.median(vals) if vals else float("nan")
            for who in ("tern", "identity", "baseline", "baseline+ORT"):
                print(f"| {conc} | {who} | {med(who, 0):.0f} | {med(who, 0) / med('baseline', 0):.2f} | "
                      f"{med(who, 0) / med('baseline+ORT', 0):.2f} | {med(who, 1):.3f} / {med(who, 2):.3f} | {med(who, 3):.1f} |")


if __name__ == "__main__":
    sys.exit(main())
