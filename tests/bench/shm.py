#!/usr/bin/env python3
"""A 16 MB FP32 tensor through the `identity_fp32` model: system shared memory
(input and output in /dev/shm regions) against the binary HTTP extension,
measured in the same run with tritonclient's HTTP client.

    make bench-shm     # or:
    python tests/bench/shm.py --tern target/release/tern

Prints one JSON line; results go in docs/PERFORMANCE.md.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def timed(fn, n):
    for _ in range(3):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out), sorted(out)[int(0.9 * len(out)) - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", default=os.path.join(ROOT, "target", "release", "tern"))
    ap.add_argument("--iterations", type=int, default=30)
    a = ap.parse_args()
    os.environ["TERN_BIN"] = a.tern
    from conftest import Tern
    import tritonclient.http as http
    import tritonclient.utils.shared_memory as shm

    n = 4 * 1024 * 1024  # 16 MiB of FP32
    x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
    t = Tern([f"--model-repository={os.path.join(ROOT, 'model_repository')}", "--allow-client-shm=true",
              "--http-max-input-size=67108864"])
    h_in = shm.create_shared_memory_region("bench_in", "/bench_in", x.nbytes)
    h_out = shm.create_shared_memory_region("bench_out", "/bench_out", x.nbytes)
    try:
        c = http.InferenceServerClient(t.url, connection_timeout=60, network_timeout=60)
        c.register_system_shared_memory("bench_in", "/bench_in", x.nbytes)
        c.register_system_shared_memory("bench_out", "/bench_out", x.nbytes)
        shm.set_shared_memory_region(h_in, [x])

        def binary():
            i = http.InferInput("INPUT0", list(x.shape), "FP32")
            i.set_data_from_numpy(x, binary_data=True)
            r = c.infer("identity_fp32", [i], outputs=[http.InferRequestedOutput("OUTPUT0", binary_data=True)])
            assert r.as_numpy("OUTPUT0").shape == x.shape

        def via_shm():
            i = http.InferInput("INPUT0", list(x.shape), "FP32")
            i.set_shared_memory("bench_in", x.nbytes)
            o = http.InferRequestedOutput("OUTPUT0")
            o.set_shared_memory("bench_out", x.nbytes)
            c.infer("identity_fp32", [i], outputs=[o])
            assert shm.get_contents_as_numpy(h_out, np.float32, list(x.shape))[0, -1] == x[0, -1]

        b50, b90 = timed(binary, a.iterations)
        s50, s90 = timed(via_shm, a.iterations)
        print(json.dumps({
            "tensor_mib": x.nbytes >> 20,
            "binary_http_ms": {"p50": round(b50, 2), "p90": round(b90, 2)},
            "system_shm_ms": {"p50": round(s50, 2), "p90": round(s90, 2)},
            "speedup_p50": round(b50 / s50, 2),
        }))
    finally:
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
        t.stop()


if __name__ == "__main__":
    main()
