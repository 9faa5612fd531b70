"""GPU checks for Tern, run on a machine with an NVIDIA GPU (see tests/gpu/README.md).

Builds a small GPU model repository, starts the given tern binary on it and checks, with
tritonclient's gRPC client:
  * device discovery and KIND_GPU placement (log), outputs on the CUDA provider == CPU,
  * a TensorRT-configured model either loads or fails with a clear reason,
  * CUDA shared memory (tritonclient.utils.cuda_shared_memory) for inputs and outputs,
  * NVML gauges, the pinned pool and the CUDA device pool (GPU inputs staged through it) in
    /metrics,
  * throughput through Tern vs ONNX Runtime's own Python InferenceSession (CUDA EP) at the
    same batch size, pinned vs pageable staging, and the device pool vs ORT's own arena.
Prints one JSON line per figure; exits non-zero when a check fails.
"""

import json
import re
import os
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import Tern  # noqa: E402

ROOT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpu_repo"
HIDDEN = 8192  # heavy enough that the GPU, not the Python client, sets the pace
LAYERS = 4
FEATURES = 1024
BATCH = 64
failures = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def mlp(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    sizes = [FEATURES] + [HIDDEN] * LAYERS + [16]
    weights, nodes, prev = [], [], "INPUT0"
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        last = i == len(sizes) - 2
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], ["OUTPUT0" if last else f"h{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
            prev = f"r{i}"
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 16])],
        weights,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(m, path)


def config(name, kind, extra=""):
    return f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: {BATCH}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ kind: {kind} count: 1 }} ]
{extra}
"""


def build_repo():
    for name, kind, extra in [
        ("mlp_gpu", "KIND_GPU", ""),
        ("mlp_cpu", "KIND_CPU", ""),
        (
            "mlp_trt",
            "KIND_GPU",
            'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" '
            'parameters { key: "precision_mode" value: "FP16" } } ] } }',
        ),
        ("mlp_bad_gpu", "KIND_GPU", ""),
    ]:
        d = os.path.join(ROOT, name)
        mlp(os.path.join(d, "1", "model.onnx"))
        cfg = config(name, kind, extra)
        if name == "mlp_bad_gpu":
            cfg = cfg.replace("count: 1 }", "count: 1 gpus: [ 7 ] }")
        with open(os.path.join(d, "config.pbtxt"), "w") as f:
            f.write(cfg)


def metrics(t):
    return urllib.request.urlopen(f"http://{t.metrics_url}/metrics").read().decode()


def _client_loop(args):
    url, model, stop_at = args
    import tritonclient.grpc as g

    x = np.random.default_rng(1).standard_normal((BATCH, FEATURES)).astype(np.float32)
    c = g.InferenceServerClient(url)
    inp = g.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    n = 0
    while time.time() < stop_at:
        c.infer(model, [inp])
        n += 1
    return n


def throughput(url, model, seconds=10.0, concurrency=8):
    """Inferences/s with `concurrency` client processes (no GIL between them)."""
    import multiprocessing as mp

    _client_loop((url, model, time.time() + 2.0))  # warm-up
    stop_at = time.time() + 1.0 + seconds
    with mp.get_context("spawn").Pool(concurrency) as pool:
        t0 = time.time() + 1.0
        counts = pool.map(_client_loop, [(url, model, stop_at)] * concurrency)
    return sum(counts) * BATCH / (time.time() - t0)


def ort_python(path, seconds=8.0):
    import onnxruntime as ort

    s = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
    assert "CUDAExecutionProvider" in s.get_providers(), s.get_providers()
    x = np.random.default_rng(1).standard_normal((BATCH, FEATURES)).astype(np.float32)
    for _ in range(20):
        s.run(None, {"INPUT0": x})
    n = 0
    t0 = time.time()
    while time.time() - t0 < seconds:
        s.run(None, {"INPUT0": x})
        n += 1
    return n * BATCH / (time.time() - t0)


def main():
    import tritonclient.grpc as g
    import tritonclient.utils.cuda_shared_memory as cudashm

    build_repo()
    print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout, flush=True)
    t = Tern([f"--model-repository={ROOT}", "--exit-on-error=false", "--allow-client-shm=true"])
    try:
        log = "".join(t.lines)
        check("CUDA device" in log, "device discovery logged")
        print("\n".join(line.rstrip() for line in t.lines if "CUDA device" in line or "mlp_" in line), flush=True)
        c = g.InferenceServerClient(t.grpc_url)
        check(c.is_model_ready("mlp_gpu"), "KIND_GPU model ready on the CUDA provider")
        check(not c.is_model_ready("mlp_bad_gpu"), "gpus: [7] refused")
        idx = {m.name: m for m in c.get_model_repository_index().models}
        print("mlp_bad_gpu:", idx["mlp_bad_gpu"].reason, flush=True)
        print("mlp_trt:", idx["mlp_trt"].state, idx["mlp_trt"].reason, flush=True)
        check(idx["mlp_trt"].state == "READY" or "TensorRT" in idx["mlp_trt"].reason or "tensorrt" in idx["mlp_trt"].reason.lower(),
              "TensorRT model loads or names TensorRT in its error")

        x = np.random.default_rng(2).standard_normal((8, FEATURES)).astype(np.float32)
        inp = g.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        gpu = c.infer("mlp_gpu", [inp]).as_numpy("OUTPUT0")
        cpu = c.infer("mlp_cpu", [inp]).as_numpy("OUTPUT0")
        err = float(np.max(np.abs(gpu - cpu)))
        print(json.dumps({"figure": "gpu_vs_cpu_max_abs_diff", "value": err}), flush=True)
        rel = err / float(np.max(np.abs(cpu)))
        print(json.dumps({"figure": "gpu_vs_cpu_max_rel_diff", "value": rel}), flush=True)
        check(rel < 1e-2, "CUDA provider output == CPU output (within TF32 rounding)")

        # CUDA shared memory: input and output regions on GPU 0.
        nbytes_in = x.nbytes
        nbytes_out = 8 * 16 * 4
        h_in = cudashm.create_shared_memory_region("in_gpu", nbytes_in, 0)
        h_out = cudashm.create_shared_memory_region("out_gpu", nbytes_out, 0)
        cudashm.set_shared_memory_region(h_in, [x])
        c.register_cuda_shared_memory("in_gpu", cudashm.get_raw_handle(h_in), 0, nbytes_in)
        c.register_cuda_shared_memory("out_gpu", cudashm.get_raw_handle(h_out), 0, nbytes_out)
        status = c.get_cuda_shared_memory_status()
        check(set(status.regions) == {"in_gpu", "out_gpu"}, "CUDA shm status lists both regions")
        for model in ("mlp_gpu", "mlp_cpu"):
            i = g.InferInput("INPUT0", list(x.shape), "FP32")
            i.set_shared_memory("in_gpu", nbytes_in)
            o = g.InferRequestedOutput("OUTPUT0")
            o.set_shared_memory("out_gpu", nbytes_out)
            c.infer(model, [i], outputs=[o])
            got = cudashm.get_contents_as_numpy(h_out, np.float32, [8, 16])
            ref = gpu if model == "mlp_gpu" else cpu
            check(np.allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(ref)))), f"CUDA shm in/out through {model}")
        try:
            bad = g.InferInput("INPUT0", list(x.shape), "FP32")
            bad.set_shared_memory("in_gpu", nbytes_in, offset=64)
            c.infer("mlp_gpu", [bad])
            check(False, "CUDA shm out-of-range offset refused")
        except Exception as e:  # noqa: BLE001
            check("Invalid offset + byte size for shared memory region: 'in_gpu'" in str(e), "CUDA shm out-of-range offset refused")
        try:
            c.register_cuda_shared_memory("too_big", cudashm.get_raw_handle(h_in), 0, nbytes_in * 4)
            check(False, "CUDA shm byte_size beyond the allocation refused")
        except Exception as e:  # noqa: BLE001
            print("too_big:", e, flush=True)
            check("exceeds" in str(e), "CUDA shm byte_size beyond the allocation refused")
        c.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(h_in)
        cudashm.destroy_shared_memory_region(h_out)

        text = metrics(t)
        lines = [l for l in text.splitlines() if l.startswith(("nv_gpu", "nv_energy", "nv_pinned", "tern_cuda"))]
        print("\n".join(lines), flush=True)
        check(any(l.startswith("nv_gpu_utilization{gpu_uuid=") for l in lines), "nv_gpu_utilization with gpu_uuid")
        check(any(l.startswith("nv_gpu_memory_used_bytes{") for l in lines), "nv_gpu_memory_used_bytes")
        check("nv_pinned_memory_pool_total_bytes 268435456" in text, "pinned pool total = 256 MiB")

        # Pinned blocks go back to the pool when each request ends.
        check("nv_pinned_memory_pool_used_bytes 0" in metrics(t), "pinned pool blocks returned after requests")
        # GPU inputs went through the device pool (blocks reserved on GPU 0, all returned).
        text = metrics(t)
        reserved = re.search(r'^tern_cuda_memory_pool_reserved_bytes\{gpu="0"\} (\S+)$', text, re.M)
        check(reserved is not None and float(reserved.group(1)) > 0, "CUDA device pool used for GPU inputs")
        check('tern_cuda_memory_pool_used_bytes{gpu="0"} 0' in text, "CUDA device pool blocks returned after requests")
    finally:
        t.stop()
    # Same run, interleaved twice: ORT's own Python session, Tern with pinned staging, Tern with
    # pageable staging (each Tern on a fresh server with only mlp_gpu loaded).
    only = ["--model-control-mode=explicit", "--load-model=mlp_gpu"]
    variants = (
        ("tern_grpc_pinned", []),
        ("tern_grpc_pageable", ["--pinned-memory-pool-byte-size=0"]),
        ("tern_grpc_no_device_pool", ["--cuda-memory-pool-byte-size=0:0"]),
    )
    rates = {"ort_python_cuda": [], **{key: [] for key, _ in variants}}
    for _ in range(2):
        rates["ort_python_cuda"].append(ort_python(os.path.join(ROOT, "mlp_gpu", "1", "model.onnx")))
        for key, extra in variants:
            t = Tern([f"--model-repository={ROOT}", *only, *extra])
            try:
                rates[key].append(throughput(t.grpc_url, "mlp_gpu"))
            finally:
                t.stop()
    best = {k: max(v) for k, v in rates.items()}
    print(json.dumps({
        "figure": "throughput_inferences_per_s",
        "batch": BATCH,
        "model": f"MLP {FEATURES}->{HIDDEN}x{LAYERS}->16 FP32",
        "runs": {k: [round(x) for x in v] for k, v in rates.items()},
        "tern_vs_ort": round(best["tern_grpc_pinned"] / best["ort_python_cuda"], 3),
        "pinned_vs_pageable": round(best["tern_grpc_pinned"] / best["tern_grpc_pageable"], 3),
        "device_pool_vs_ort_arena": round(best["tern_grpc_pinned"] / best["tern_grpc_no_device_pool"], 3),
    }), flush=True)
    print("FAILURES:", failures, flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
