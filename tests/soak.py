#!/usr/bin/env python3
"""Soak test (not part of `make test`; `make soak`, results in docs/PERFORMANCE.md).

    python tests/soak.py --tern target/release/tern [--duration 600] [--clients 16]

Drives a mixed HTTP and gRPC load through an ONNX model (`simple`), a Rust
plugin (`add_sub`) and an ensemble over the ONNX model (`simple_ens`), each
request with its own id and its own random data, while another thread
reloads `simple` every two seconds (load-then-swap through the model control
API, alternating one and two instances). Every answer is checked: its id,
and its outputs against the sum and difference computed here. Reports sent,
answered, wrong (bad data or id), lost (an error or no answer) and
duplicated answers; and the server's resident memory (with its slope after
the first minute), open file descriptors and threads over the run. Exits 1
when anything was wrong, lost or duplicated.
"""

import argparse
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(HERE, "bench"))
import gen_models  # noqa: E402
from http_load import free_port, wait_http  # noqa: E402

SIMPLE = gen_models.SIMPLE_CONFIG.format(name="simple", t="TYPE_INT32")


def repo(root, plugins):
    gen_models.add_sub(f"{root}/simple/1/model.onnx", gen_models.TensorProto.INT32, "batch")
    gen_models.write(f"{root}/simple/config.pbtxt", SIMPLE)
    os.makedirs(f"{root}/add_sub/1", exist_ok=True)
    shutil.copy(os.path.join(plugins, "add_sub.wasm"), f"{root}/add_sub/1/model.wasm")
    shutil.copy(os.path.join(ROOT, "model_repository", "add_sub", "config.pbtxt"), f"{root}/add_sub/config.pbtxt")
    t = gen_models.tensor
    pair = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
    outs = {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}
    gen_models.ensemble(
        root,
        "simple_ens",
        [t("INPUT0", "TYPE_INT32", "16"), t("INPUT1", "TYPE_INT32", "16")],
        [t("OUTPUT0", "TYPE_INT32", "16"), t("OUTPUT1", "TYPE_INT32", "16")],
        [gen_models.step("simple", pair, outs)],
    )


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = self.answered = self.wrong = self.lost = self.duplicated = 0
        self.seen = set()
        self.errors = {}

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def answer(self, rid):
        with self.lock:
            if rid in self.seen:
                self.duplicated += 1
                return False
            self.seen.add(rid)
            self.answered += 1
            return True

    def error(self, e):
        with self.lock:
            self.lost += 1
            key = str(e).splitlines()[0][:120]
            self.errors[key] = self.errors.get(key, 0) + 1


def client_loop(n, http_url, grpc_url, stop, tally, ids):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    rng = random.Random(n)
    clients = {"http": httpclient.InferenceServerClient(http_url), "grpc": grpcclient.InferenceServerClient(grpc_url)}
    mods = {"http": httpclient, "grpc": grpcclient}
    while not stop.is_set():
        model, proto = rng.choice([("simple", "http"), ("simple", "grpc"), ("add_sub", "http"), ("add_sub", "grpc"), ("simple_ens", "grpc"), ("simple_ens", "http")])
        mod, c = mods[proto], clients[proto]
        rid = f"{n}-{next(ids)}"
        if model == "add_sub":
            a = np.array([rng.uniform(-100, 100) for _ in range(4)], dtype=np.float32)
            b = np.array([rng.uniform(-100, 100) for _ in range(4)], dtype=np.float32)
            a, b = a.reshape(1, 4), b.reshape(1, 4)
            shape, dt = [1, 4], "FP32"
        else:
            a = np.array([[rng.randint(-1000, 1000) for _ in range(16)]], dtype=np.int32)
            b = np.array([[rng.randint(-1000, 1000) for _ in range(16)]], dtype=np.int32)
            shape, dt = [1, 16], "INT32"
        inputs = [mod.InferInput("INPUT0", shape, dt), mod.InferInput("INPUT1", shape, dt)]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        tally.add(sent=1)
        try:
            r = c.infer(model, inputs, request_id=rid)
        except Exception as e:  # noqa: BLE001 (every failure is counted as lost)
            tally.error(e)
            continue
        got_id = r.get_response()["id"] if proto == "http" else r.get_response().id
        if not tally.answer(got_id):
            continue
        ok = got_id == rid and np.allclose(r.as_numpy("OUTPUT0"), a + b) and np.allclose(r.as_numpy("OUTPUT1"), a - b)
        if not ok:
            tally.add(wrong=1)


def reloader(http_url, stop, counts):
    cfg = json.loads(json.dumps({"name": "simple"}))
    k = 0
    while not stop.wait(2):
        k += 1
        body = {"parameters": {"config": json.dumps({**cfg, "instance_group": [{"kind": "KIND_CPU", "count": 1 + k % 2}]})}}
        req = urllib.request.Request(f"http://{http_url}/v2/repository/models/simple/load", data=json.dumps(body).encode())
        try:
            urllib.request.urlopen(req, timeout=30).read()
            counts["reloads"] += 1
        except Exception as e:  # noqa: BLE001
            counts["reload_errors"] += 1
            print("reload failed:", e, file=sys.stderr)


def sample(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


def slope(points):
    """Least-squares slope of (seconds, KiB) in KiB per minute."""
    if len(points) < 2:
        return 0.0
    xs, ys = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    return float(np.polyfit(xs, ys, 1)[0] * 60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--plugins", default=os.path.join(ROOT, "target", "wasm32-wasip2", "release"))
    ap.add_argument("--duration", type=int, default=600)
    ap.add_argument("--clients", type=int, default=16)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="tern-soak-")
    repo(root, args.plugins)
    http, grpc, metrics = free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [args.tern, f"--model-repository={root}", f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
         "--model-control-mode=explicit", "--load-model=*"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(http, "/v2/health/ready")
        http_url, grpc_url = f"127.0.0.1:{http}", f"127.0.0.1:{grpc}"
        stop, tally, ids = threading.Event(), Tally(), itertools.count()
        counts = {"reloads": 0, "reload_errors": 0}
        threads = [threading.Thread(target=client_loop, args=(n, http_url, grpc_url, stop, tally, ids), daemon=True) for n in range(args.clients)]
        threads.append(threading.Thread(target=reloader, args=(http_url, stop, counts), daemon=True))
        for t in threads:
            t.start()
        started = time.time()
        samples = []
        while time.time() - started < args.duration:
            time.sleep(5)
            samples.append((time.time() - started, *sample(server.pid)))
        stop.set()
        for t in threads:
            t.join(60)
        rss_after_warmup = [(t, rss) for t, rss, _, _ in samples if t >= 60]
        first, last = samples[0], samples[-1]
        print(f"soak: {args.duration} s, {args.clients} clients, HTTP and gRPC, simple (ONNX) / add_sub (plugin) / simple_ens (ensemble), reloading simple every 2 s")
        print()
        print("| sent | answered | wrong | lost | duplicated | reloads (failed) |")
        print("|---|---|---|---|---|---|")
        print(f"| {tally.sent} | {tally.answered} | {tally.wrong} | {tally.lost} | {tally.duplicated} | {counts['reloads']} ({counts['reload_errors']}) |")
        print()
        print("| | first sample | last sample | min | max |")
        print("|---|---|---|---|---|")
        for i, name in ((1, "RSS (MiB)"), (2, "open fds"), (3, "threads")):
            values = [s[i] for s in samples]
            scale = 1024 if i == 1 else 1
            print(f"| {name} | {first[i] / scale:.1f} | {last[i] / scale:.1f} | {min(values) / scale:.1f} | {max(values) / scale:.1f} |")
        print()
        print(f"RSS slope after the first minute: {slope(rss_after_warmup):+.1f} KiB/min")
        if tally.errors:
            print("errors:", json.dumps(tally.errors, indent=1))
        bad = tally.wrong + tally.lost + tally.duplicated + counts["reload_errors"]
        sys.exit(1 if bad else 0)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
