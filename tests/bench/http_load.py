#!/usr/bin/env python3
"""HTTP load benchmark: Tern vs. a minimal hyper baseline, measured in the same run.

    make bench            # or:
    python tests/bench/http_load.py --tern target/release/tern --baseline target/release/examples/baseline

Drives `simple` (INT32 [1,16] x2, JSON body) with wrk at several concurrencies and
prints a markdown table (throughput, p50/p99 latency, ratio to the baseline, each
server's CPU time per request) plus Tern's idle RSS with the example repository loaded.
A third server, Tern with `simple` on the identity backend (tests/bench/identity_repo.py),
shows what Tern's own request path costs without ONNX Runtime's per-call cost, and a
fourth, the baseline given the model repository, runs `simple` through ONNX Runtime inline
(one session per worker thread, no scheduler): about the most a server running the
model can serve here. The
servers take turns in `--rounds` interleaved rounds (order reversed every other round),
since this kind of machine's speed drifts between minutes; figures are medians over the
rounds, the ratios medians of each round's ratio. Results go in docs/PERFORMANCE.md.
"""

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import identity_repo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ]
    }
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port, path, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not come up")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def to_ms(value):
    m = re.match(r"([\d.]+)(us|ms|s)", value)
    n, unit = float(m.group(1)), m.group(2)
    return n / 1000 if unit == "us" else n * 1000 if unit == "s" else n


def run_wrk(port, conc, duration, script, model="simple"):
    threads = min(2, conc)
    cmd = ["wrk", f"-t{threads}", f"-c{conc}", f"-d{duration}s", "--latency", "-s", script, f"http://127.0.0.1:{port}/v2/models/{model}/infer"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = to_ms(re.search(r"\s50%\s+(\S+)", out).group(1))
    p99 = to_ms(re.search(r"\s99%\s+(\S+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if bad:
        raise RuntimeError(f"{bad.group(1)} failed responses on port {port}:\n{out}")
    return rps, p50, p99


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(port, pid, conc, duration, script):
    """wrk's (req/s, p50 ms, p99 ms) plus the server's CPU µs per request."""
    cpu0 = cpu_seconds(pid)
    rps, p50, p99 = run_wrk(port, conc, duration, script)
    return rps, p50, p99, (cpu_seconds(pid) - cpu0) / (rps * duration) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--repo", default=os.path.join(ROOT, "model_repository"))
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n')
        f.write(f"wrk.body = {json.dumps(BODY)}\n")
        script = f.name

    work = tempfile.mkdtemp(prefix="tern-bench-http-")
    tern_port, base_port, ident_port, ort_port = free_port(), free_port(), free_port(), free_port()
    serve = ["--http-address=127.0.0.1", "--allow-metrics=false", "--allow-grpc=false", "--log-info=false"]
    tern = subprocess.Popen([args.tern, f"--model-repository={args.repo}", f"--http-port={tern_port}", *serve])
    ident = subprocess.Popen([args.tern, f"--model-repository={identity_repo.make(work)}", f"--http-port={ident_port}", *serve])
    base = subprocess.Popen([args.baseline, str(base_port)])
    base_ort = subprocess.Popen([args.baseline, str(ort_port), args.repo])
    try:
        wait_http(tern_port, "/v2/health/ready")
        wait_http(ident_port, "/v2/health/ready")
        wait_http(base_port, "/")
        wait_http(ort_port, "/")
        time.sleep(1)
        idle_rss = rss_kib(tern.pid)
        servers = {
            "base": (base_port, base.pid),
            "tern": (tern_port, tern.pid),
            "ident": (ident_port, ident.pid),
            "base_ort": (ort_port, base_ort.pid),
        }
        rows = []
        for conc in [int(c) for c in args.concurrency.split(",")]:
            for port, _ in servers.values():
                run_wrk(port, conc, 2, script)  # warm-up
            got = {k: [] for k in servers}
            for r in range(args.rounds):
                for k in list(servers) if r % 2 == 0 else list(servers)[::-1]:
                    got[k].append(measure(*servers[k], conc, args.duration, script))
            rows.append((conc, got))
        loaded_rss = rss_kib(tern.pid)
    finally:
        for proc in (tern, ident, base, base_ort):
            proc.terminate()
            proc.wait()
        os.unlink(script)
        shutil.rmtree(work, ignore_errors=True)

    med = statistics.median
    print(f"\nwrk, {args.duration}s per point, {args.rounds} interleaved rounds (medians), JSON body for `simple` (2 x INT32[1,16]), {os.cpu_count()} cores shared by client and server\n")
    print("| concurrency | Tern req/s | baseline req/s | Tern/baseline | Tern p50 ms | Tern p99 ms | baseline p50 ms | baseline p99 ms | identity backend req/s | identity/baseline | CPU µs/req: Tern, identity, baseline |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratio = lambda got, k, of="base": med(x[0] / y[0] for x, y in zip(got[k], got[of]))
    for conc, got in rows:
        t, b, i = (list(zip(*got[k])) for k in ("tern", "base", "ident"))
        cpu = ", ".join(f"{med(v[3]):.1f}" for v in (t, i, b))
        print(f"| {conc} | {med(t[0]):.0f} | {med(b[0]):.0f} | {ratio(got, 'tern'):.2f} | {med(t[1]):.3f} | {med(t[2]):.3f} | {med(b[1]):.3f} | {med(b[2]):.3f} | {med(i[0]):.0f} | {ratio(got, 'ident'):.2f} | {cpu} |")
    print("\nThe baseline running `simple` through ONNX Runtime inline (baseline + ORT), against Tern on the same model:\n")
    print("| concurrency | Tern req/s | baseline + ORT req/s | Tern/(baseline + ORT) | baseline + ORT p50 / p99 ms | (baseline + ORT)/baseline | CPU µs/req: Tern, baseline + ORT |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for conc, got in rows:
        t, o = (list(zip(*got[k])) for k in ("tern", "base_ort"))
        print(f"| {conc} | {med(t[0]):.0f} | {med(o[0]):.0f} | {ratio(got, 'tern', 'base_ort'):.2f} | {med(o[1]):.3f} / {med(o[2]):.3f} | {ratio(got, 'base_ort'):.2f} | {med(t[3]):.1f}, {med(o[3]):.1f} |")
    print("\nPer round, Tern/baseline, identity/baseline and Tern/(baseline + ORT):")
    for conc, got in rows:
        rounds = ", ".join(f"{t[0] / b[0]:.2f}/{i[0] / b[0]:.2f}/{t[0] / o[0]:.2f}" for t, b, i, o in zip(got["tern"], got["base"], got["ident"], got["base_ort"]))
        print(f"  concurrency {conc}: {rounds}")
    print(f"\nTern RSS: idle with model_repository loaded {idle_rss / 1024:.1f} MiB; after the load {loaded_rss / 1024:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
