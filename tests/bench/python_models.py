#!/usr/bin/env python3
"""Triton Python-backend models on Tern's Python runner against Triton 2.51's
Python backend: the same unchanged model folder (tests/python_models), one
instance each, driven by perf_analyzer over gRPC.

    make bench-python        # or, after `make release python-runner TERN_TOOL=target/release/tern`:
    python tests/bench/python_models.py --tern target/release/tern \\
        --triton-ref .cache/triton-ref [--rounds 2] [--duration 1.5] [--models add_sub,strings,preprocess]

Models: `add_sub` (FP32 [4] x2 -> sum and difference: per-request cost),
`strings` (BYTES [1, 4] -> upper-cased, lengths) and `preprocess` (UINT8
[1, 32, 32, 3] image -> normalised FP32 CHW and an argmax per channel:
numpy-heavy). Per round, model and server (the order rotating): the server
starts alone with only that model; time to READY is from the spawn to the
first 200 of /v2/health/ready (Tern with a warm .cwasm cache, which a first
start of the round fills); perf_analyzer runs synchronously at concurrency 1
and 16 (three windows after warm-up, its own figures); then the resident
memory: Tern's process, Triton's server plus its stub processes. At
concurrency 1 it also records the median latency and the server's own time
per request from its statistics (compute input + infer + output: for Triton
that includes the IPC with its stub), which separate the model's cost from
the client's and the network's. Each figure
is the median over rounds; "Tern/Triton" is the ratio within a round, median
over rounds. The client shares the 2 cores with the server. For `add_sub`,
a third server, `tern-rust`, serves the Rust `add_sub` plugin
(plugins/add_sub, same inputs and outputs, one instance, no batching): what
Tern's request path costs with a compiled model, the ceiling of any Python
model on this machine; and a fourth, `tern-floor`, a Python model with
add_sub's config that copies each input's bytes to an output through the
runner's SDK (no numpy): what the runner's call costs before any model
code. Output: a markdown table on stdout and
target/bench-python/results.json.
"""

import argparse
import csv
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "tests", "python_models")
SHAPES = {"add_sub": [], "strings": ["--shape=TEXT:4"], "preprocess": []}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid):
    """Resident memory of a process and its descendants (Triton's stubs), in kB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            pass
    return total


# The `tern-floor` model: add_sub's inputs and outputs, no work.
FLOOR = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a, b = request.inputs()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor.from_bytes("OUTPUT0", a.datatype(), a.shape(), a.as_bytes()),
                pb_utils.Tensor.from_bytes("OUTPUT1", b.datatype(), b.shape(), b.as_bytes()),
            ]))
        return responses
'''

# The repository folder suffix of each Tern variant beside the plain one.
VARIANTS = {"tern-rust": "-rust", "tern-floor": "-floor"}


class Server:
    def __init__(self, kind, a, repo, scratch):
        self.kind = kind
        self.http, self.grpc, metrics = free_port(), free_port(), free_port()
        ports = [f"--http-port={self.http}", f"--grpc-port={self.grpc}", f"--metrics-port={metrics}"]
        env = dict(os.environ)
        if kind.startswith("tern"):
            cmd = [a.tern, f"--model-repository={repo}", f"--python-runner={a.runner}",
                   f"--wasm-cache-dir={os.path.join(scratch, 'cwasm', 'wasm')}", *ports]
        else:
            ts = os.path.join(a.triton_ref, "pytriton", "tritonserver")
            env["PATH"] = os.path.join(a.triton_ref, "venv", "bin") + os.pathsep + env["PATH"]
            env["LD_LIBRARY_PATH"] = os.path.join(a.triton_ref, "nvidia_pytriton.libs")
            cmd = [os.path.join(ts, "bin", "tritonserver"), f"--model-repository={repo}",
                   f"--backend-directory={os.path.join(ts, 'backends')}", *ports]
        self.log = open(os.path.join(scratch, f"{kind}.log"), "w")
        start = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.perf_counter() - start > 120:
                raise RuntimeError(f"{kind} did not become ready; see {self.log.name}")
            time.sleep(0.01)
        self.ready_s = time.perf_counter() - start

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def perf(a, server, model, conc):
    with tempfile.NamedTemporaryFile(suffix=".csv", delete=False) as f:
        report = f.name
    cmd = [a.perf_analyzer, "-m", model, "-i", "grpc", "-u", f"127.0.0.1:{server.grpc}", f"--concurrency-range={conc}",
           "--sync", "-p", str(int(a.duration * 1000)), "-s", "1000", "-r", "3",
           f"--warmup-request-count={max(8, 2 * conc)}", "--percentile=99", "-f", report, *SHAPES[model]]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        with open(report) as f:
            rows = list(csv.DictReader(f))
        if p.returncode != 0 or not rows:
            return {"error": (p.stdout + p.stderr).strip()[-600:]}
    finally:
        os.unlink(report)
    row = rows[0]
    # The server's own time per request, as its statistics report it
    # (compute input + infer + output; Triton's includes its stub's IPC).
    compute = sum(float(row.get(k) or 0) for k in ("Server Compute Input", "Server Compute Infer", "Server Compute Output"))
    return {"throughput": float(row["Inferences/Second"]), "p99_ms": float(row["p99 latency"]) / 1000,
            "latency_us": float(row["p50 latency"]), "compute_us": compute}


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tern", default=os.path.join(ROOT, "target", "release", "tern"))
    ap.add_argument("--runner", help="default: python-runner.wasm beside --tern")
    ap.add_argument("--triton-ref", default=os.path.join(ROOT, ".cache", "triton-ref"))
    ap.add_argument("--perf-analyzer", default=os.path.join(ROOT, ".cache", "perf_analyzer", "perf_analyzer"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=1.5, help="perf_analyzer window, seconds (three per figure)")
    ap.add_argument("--models", default="add_sub,strings,preprocess")
    ap.add_argument("--rust-plugins", default=os.path.join(ROOT, "target", "wasm32-wasip2", "release"),
                    help="folder with add_sub.wasm (the Rust twin of add_sub; skipped when missing)")
    a = ap.parse_args()
    a.runner = a.runner or os.path.join(os.path.dirname(a.tern), "python-runner.wasm")
    models = a.models.split(",")
    out_dir = os.path.join(ROOT, "target", "bench-python")
    os.makedirs(out_dir, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for m in models:
            repo = os.path.join(scratch, "repo-" + m)
            shutil.copytree(os.path.join(MODELS, m), os.path.join(repo, m))
        rust = os.path.join(a.rust_plugins, "add_sub.wasm")
        servers = {m: ["tern", "triton"] for m in models}
        if "add_sub" in models and os.path.isfile(rust):
            twin = os.path.join(scratch, "repo-add_sub-rust", "add_sub")
            os.makedirs(os.path.join(twin, "1"))
            shutil.copy(rust, os.path.join(twin, "1", "model.wasm"))
            with open(os.path.join(MODELS, "add_sub", "config.pbtxt")) as f:
                config = f.read().replace('backend: "python"', 'backend: "wasm"')
            with open(os.path.join(twin, "config.pbtxt"), "w") as f:
                f.write(config)
            servers["add_sub"].append("tern-rust")
        if "add_sub" in models:
            floor = os.path.join(scratch, "repo-add_sub-floor", "add_sub")
            shutil.copytree(os.path.join(MODELS, "add_sub"), floor)
            with open(os.path.join(floor, "1", "model.py"), "w") as f:
                f.write(FLOOR)
            servers["add_sub"].append("tern-floor")
        # Fill Tern's .cwasm cache once (a first start compiles the runner).
        Server("tern", a, os.path.join(scratch, "repo-" + models[0]), scratch).stop()
        for r in range(a.rounds):
            for i, m in enumerate(models):
                order = servers[m][(r + i) % len(servers[m]):] + servers[m][:(r + i) % len(servers[m])]
                for kind in order:
                    repo = os.path.join(scratch, "repo-" + m + VARIANTS.get(kind, ""))
                    s = Server(kind, a, repo, scratch)
                    try:
                        row = {"round": r, "model": m, "server": kind, "ready_s": s.ready_s}
                        for c in (1, 16):
                            row[f"c{c}"] = perf(a, s, m, c)
                        row["rss_mib"] = rss_kb(s.proc.pid) / 1024
                    finally:
                        s.stop()
                    runs.append(row)
                    print(json.dumps(row), flush=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"rounds": a.rounds, "duration_s": a.duration, "runs": runs}, f, indent=1)
    print("\n| model | server | c1 infer/s | c16 infer/s | p99 c16 ms | Tern/Triton c1 | Tern/Triton c16 | ready s | RSS MiB "
          "| c1 p50 latency us | c1 server compute us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in models:
        for kind in servers[m]:
            rs = [x for x in runs if x["model"] == m and x["server"] == kind]
            thr = {c: med([x[f"c{c}"].get("throughput") for x in rs]) for c in (1, 16)}
            ratio = {}
            for c in (1, 16):
                per_round = []
                for r in range(a.rounds):
                    t = [x for x in runs if x["model"] == m and x["round"] == r]
                    tt = {x["server"]: x[f"c{c}"].get("throughput") for x in t}
                    if tt.get(kind) and tt.get("triton"):
                        per_round.append(tt[kind] / tt["triton"])
                ratio[c] = med(per_round)
            p99 = med([x["c16"].get("p99_ms") for x in rs])
            fmt = lambda v, d=0: "—" if v is None else f"{v:,.{d}f}"  # noqa: E731
            print(f"| {m} | {kind} | {fmt(thr[1])} | {fmt(thr[16])} | {fmt(p99, 1)} | "
                  f"{fmt(ratio[1], 2) if kind != 'triton' else ''} | {fmt(ratio[16], 2) if kind != 'triton' else ''} | "
                  f"{fmt(med([x['ready_s'] for x in rs]), 2)} | {fmt(med([x['rss_mib'] for x in rs]))} | "
                  f"{fmt(med([x['c1'].get('latency_us') for x in rs]))} | {fmt(med([x['c1'].get('compute_us') for x in rs]))} |")


if __name__ == "__main__":
    main()
