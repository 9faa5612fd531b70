#!/usr/bin/env python3
"""Sequence batcher benchmark (docs/PERFORMANCE.md).

    make bench-sequences    # or: python tests/bench/sequences.py --tern target/release/tern

The identity backend with a fixed cost per execution (execute_delay_ms 10,
max_batch_size 8, one instance: at most 800 inferences/s however requests
are batched), carrying a 1 KiB implicit state per sequence. N concurrent
sequences of 20 requests each, one request in flight per sequence, over
gRPC (asyncio tritonclient), through:

* `oldest` (max_candidate_sequences N, preferred_batch_size 8,
  max_queue_delay 2 ms);
* `direct` (8 slots: the other sequences wait in the backlog; a batch waits
  up to 2 ms for all 8 slots, minimum_slot_utilization 1.0);
* the baseline in the same run: the same model and load with
  `dynamic_batching` and no sequences (ideal batching: any request may join
  any batch; the client sends the state itself).

Reported: inferences/s, mean batch size (statistics extension) and request
latency p50/p99.
"""

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_load import free_port, wait_http  # noqa: E402

BASE = """name: "{name}"
backend: "identity"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }}{extra_in} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}{extra_out} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "10" }} }}
{scheduling}
"""

STATE = """sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  {strategy}
  state [ {{ input_name: "STATE" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 256 ]
            initial_state {{ data_type: TYPE_FP32 dims: [ 256 ] zero_data: true name: "zeros" }} }} ]
}}"""


def repo(root, sequences):
    models = {
        "seq_oldest": BASE.format(
            name="seq_oldest",
            extra_in="",
            extra_out="",
            scheduling=STATE.format(
                strategy=f"oldest {{ max_candidate_sequences: {sequences} preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 2000 }}"
            ),
        ),
        "seq_direct": BASE.format(name="seq_direct", extra_in="", extra_out="", scheduling=STATE.format(
                strategy="direct { max_queue_delay_microseconds: 2000 minimum_slot_utilization: 1.0 }"
            ),),
        "ideal": BASE.format(
            name="ideal",
            extra_in=', { name: "STATE" data_type: TYPE_FP32 dims: [ 256 ] }',
            extra_out=', { name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 256 ] }',
            scheduling="dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 2000 }",
        ),
    }
    for name, cfg in models.items():
        os.makedirs(os.path.join(root, name, "1"), exist_ok=True)
        with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
            f.write(cfg)


async def drive(url, model, sequences, length):
    import tritonclient.grpc.aio as aio
    import tritonclient.grpc as grpcclient

    client = aio.InferenceServerClient(url)
    latencies = []

    async def one(s):
        state = np.zeros((1, 256), dtype=np.float32)
        for k in range(length):
            x = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            x.set_data_from_numpy(np.full((1, 1), k, dtype=np.int32))
            inputs = [x]
            kw = {}
            if model == "ideal":
                st = grpcclient.InferInput("STATE", [1, 256], "FP32")
                st.set_data_from_numpy(state)
                inputs.append(st)
            else:
                kw = dict(sequence_id=s + 1, sequence_start=k == 0, sequence_end=k == length - 1)
            t = time.perf_counter()
            r = await client.infer(model, inputs, **kw)
            latencies.append(time.perf_counter() - t)
            if model == "ideal":
                state = r.as_numpy("STATE_OUT")

    start = time.perf_counter()
    await asyncio.gather(*(one(s) for s in range(sequences)))
    elapsed = time.perf_counter() - start
    stats = (await client.get_inference_statistics(model, as_json=True))["model_stats"][0]
    await client.close()
    lat = np.array(latencies) * 1000
    return {
        "rate": len(latencies) / elapsed,
        "batch": int(stats["inference_count"]) / max(1, int(stats["execution_count"])),
        "p50": float(np.percentile(lat, 50)),
        "p99": float(np.percentile(lat, 99)),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--sequences", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--length", type=int, default=20)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-seq-")
    try:
        rows = []
        for n in args.sequences:
            repo(root, n)
            http, grpc, metrics = free_port(), free_port(), free_port()
            server = subprocess.Popen(
                [args.tern, f"--model-repository={root}", f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_http(http, "/v2/health/ready")
                for model in ("ideal", "seq_oldest", "seq_direct"):
                    r = asyncio.run(drive(f"127.0.0.1:{grpc}", model, n, args.length))
                    rows.append((n, model, r))
            finally:
                server.terminate()
                server.wait()
        print("| sequences | scheduler | inferences/s | of ideal | mean batch | p50 ms | p99 ms |")
        print("|---|---|---|---|---|---|---|")
        ideal = {n: r["rate"] for n, m, r in rows if m == "ideal"}
        for n, model, r in rows:
            name = {"ideal": "dynamic batching (baseline)", "seq_oldest": "sequence `oldest`", "seq_direct": "sequence `direct`"}[model]
            print(
                f"| {n} | {name} | {r['rate']:.0f} | {r['rate'] / ideal[n]:.0%} | {r['batch']:.2f} | {r['p50']:.1f} | {r['p99']:.1f} |"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
