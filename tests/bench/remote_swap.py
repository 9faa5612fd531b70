#!/usr/bin/env python3
"""A new version landing in an S3 bucket, until it answers: for a 10 MB and
a 200 MB ONNX model served from `s3://` (moto's S3 server on this machine),
the seconds from the upload's end to the new version's first answer, and
the requests that failed meanwhile (must be 0) out of those sent to the
model without a version (the swap under load, 4 clients). Beside it, in the
same run, the same model's reload from a local folder (copy in, then poll):
the baseline a remote repository adds its download to.

    make bench-remote     # or:
    python tests/bench/remote_swap.py --tern target/release/tern

Results go in docs/PERFORMANCE.md.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import onnx
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_load import free_port, wait_http  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("ORT_DYLIB_PATH", os.path.join(ROOT, ".cache", "onnxruntime", "libonnxruntime.so"))

CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def model_bytes(megabytes, bias):
    """Y = X + sum over rows of W (W: megabytes of FP32 zeros) + bias: the
    whole initializer is read, and each version answers its bias."""
    rows = megabytes * (1 << 20) // (16 * 4)
    w = np.zeros((rows, 16), dtype=np.float32)
    nodes = [
        helper.make_node("ReduceSum", ["W", "axes"], ["S"], keepdims=0),
        helper.make_node("Add", ["X", "S"], ["T"]),
        helper.make_node("Add", ["T", "B"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes, "big",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [16])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([0], dtype=np.int64), "axes"),
         numpy_helper.from_array(np.full(16, bias, dtype=np.float32), "B")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m.SerializeToString()


class Load:
    """Clients asking the model (latest version) without pause; counts failures."""

    def __init__(self, url, name, clients=4):
        self.url, self.name = url, name
        self.stop = threading.Event()
        self.sent = self.failed = 0
        self.seen = set()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def run(self):
        c = httpclient.InferenceServerClient(self.url)
        x = np.zeros(16, dtype=np.float32)
        while not self.stop.is_set():
            i = httpclient.InferInput("X", [16], "FP32")
            i.set_data_from_numpy(x)
            try:
                y = c.infer(self.name, [i]).as_numpy("Y")
                with self.lock:
                    self.sent += 1
                    self.seen.add(round(float(y[0])))
            except Exception as e:  # noqa: BLE001
                with self.lock:
                    self.sent += 1
                    self.failed += 1
                    if self.failed <= 3:
                        print(f"  request failed: {e}", file=sys.stderr)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)


def wait_answer(url, name, bias, timeout):
    c = httpclient.InferenceServerClient(url)
    x = np.zeros(16, dtype=np.float32)
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        i = httpclient.InferInput("X", [16], "FP32")
        i.set_data_from_numpy(x)
        try:
            y = c.infer(name, [i]).as_numpy("Y")
            last = y[0]
            if abs(float(y[0]) - bias) < 1e-3:
                return time.time()
        except Exception as e:  # noqa: BLE001
            last = e
        time.sleep(0.02)
    raise RuntimeError(f"version with bias {bias} did not answer within {timeout}s (last answer: {last})")


def run_case(tern, mb, remote, tmp, poll_secs, s3):
    name = f"big{mb}"
    v1, v2 = model_bytes(mb, 1.0), model_bytes(mb, 2.0)
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    local = os.path.join(tmp, f"local{mb}")
    if remote:
        s3.put_object(Bucket="bench", Key=f"r{mb}/{name}/config.pbtxt", Body=CONFIG.format(name=name).encode())
        s3.put_object(Bucket="bench", Key=f"r{mb}/{name}/1/model.onnx", Body=v1)
        repo = f"s3://{s3.meta.endpoint_url.split('://')[1]}/bench/r{mb}"
    else:
        os.makedirs(f"{local}/{name}/1")
        open(f"{local}/{name}/config.pbtxt", "w").write(CONFIG.format(name=name))
        open(f"{local}/{name}/1/model.onnx", "wb").write(v1)
        repo = local
    port = free_port()
    proc = subprocess.Popen(
        [tern, f"--model-repository={repo}", f"--model-cache-dir={tmp}/cache{mb}", f"--http-port={port}",
         "--http-address=127.0.0.1", "--allow-grpc=false", "--allow-metrics=false", "--log-info=false",
         "--model-control-mode=poll", f"--repository-poll-secs={poll_secs}"], env=env)
    try:
        wait_http(port, "/v2/health/live", 300)
        url = f"127.0.0.1:{port}"
        wait_answer(url, name, 1.0, 300)
        load = Load(url, name)
        time.sleep(1)
        if remote:
            s3.put_object(Bucket="bench", Key=f"r{mb}/{name}/2/model.onnx", Body=v2)
        else:
            os.makedirs(f"{local}/{name}/2.tmp")
            open(f"{local}/{name}/2.tmp/model.onnx", "wb").write(v2)
            os.rename(f"{local}/{name}/2.tmp", f"{local}/{name}/2")
        landed = time.time()
        answered = wait_answer(url, name, 2.0, 600)
        time.sleep(1)
        load.finish()
        return answered - landed, load.sent, load.failed, sorted(load.seen)
    finally:
        proc.terminate()
        proc.wait(60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--sizes", default="10,200", help="model sizes in MB")
    ap.add_argument("--poll-secs", type=int, default=1)
    args = ap.parse_args()
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    s3 = boto3.client("s3", endpoint_url=f"http://{host}:{port}", aws_access_key_id="bench",
                      aws_secret_access_key="bench", region_name="us-east-1")
    s3.create_bucket(Bucket="bench")
    print(f"poll every {args.poll_secs} s; 4 clients asking the latest version throughout")
    print("| model | repository | new version landed → answering | requests during the swap | failed |")
    print("|---|---|---|---|---|")
    try:
        for mb in (int(s) for s in args.sizes.split(",")):
            for remote in (False, True):
                with tempfile.TemporaryDirectory() as tmp:
                    secs, sent, failed, seen = run_case(args.tern, mb, remote, tmp, args.poll_secs, s3)
                where = "s3:// (moto, loopback)" if remote else "local folder"
                print(f"| {mb} MB | {where} | {secs:.2f} s | {sent} | {failed} |", flush=True)
                assert seen == [1, 2], f"answers other than versions 1 and 2: {seen}"
                if failed:
                    raise SystemExit(f"{failed} requests failed during the swap")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
