"""`make bench-ort`: Tern on a real compute-bound model against ONNX Runtime
alone, for docs/PERFORMANCE.md: RapidOCR's PP-OCRv4 text recogniser (from
the `rapidocr-onnxruntime` wheel, fetched at benchmark time; one 3x48x320
FP32 line in, a 1 MB FP32 score matrix out), one instance.

    python tests/bench/ort_real_model.py --tern target/release/tern \\
        --perf-analyzer .cache/perf_analyzer/perf_analyzer [--rounds 3]

Three questions, measured in interleaved rounds (medians):

1. ONNX Runtime's thread spinning: Tern's default (ONNX Runtime's, spinning
   on, as Triton) against `allow_spinning: "false"`, at concurrency 1 over
   gRPC, with the server's CPU time per request, and its CPU use in the 5 s
   after the load stops (do idle cores stay quiet?).
2. The ceiling: ONNX Runtime alone in this process, same input, batch 1.
3. Large responses under concurrency: gRPC against binary HTTP at
   concurrency 1 and 16 (no dynamic batching: the 1 MB output per request is
   what the frontends carry).
4. Dynamic batching at concurrency 16 (`dynamic_batching {}`, max_batch_size
   8) against ONNX Runtime alone at batch 8 (the script prints the batch size
   Tern formed on average: inferences over executions in its statistics),
   both as inferences/s.

With `--isolate` the client is taken off the model's core: Tern (started under
`taskset -c 0`) and ONNX Runtime alone both run on core 0 with one intra-op
thread (`intra_op_thread_count: 1`, `intra_op_num_threads = 1`), perf_analyzer
on core 1. The ratio is then what the server itself costs on the core the
model runs on (frontends, hand-offs, copies), not what the client running on
the same cores takes from ONNX Runtime. Concurrency 1 without batching and 16
with dynamic batching, over gRPC and binary HTTP.

Each Tern figure is bracketed by ONNX Runtime alone, measured just before and
just after it (the server idles meanwhile), and its ratio is to their mean:
the speed of a small cloud VM can change by 2x for minutes at a time, so a
ceiling measured once per round is not comparable. A figure whose two
brackets differ by more than 15% is left out of the ratio's median (the
number of figures kept is printed beside it).
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import peers  # noqa: E402
from grpc_load import cpu_seconds  # noqa: E402
from conftest import Tern  # noqa: E402

def served(url):
    """(inferences, executions) the server has run for `rec` (statistics extension)."""
    with urllib.request.urlopen(f"http://{url}/v2/models/rec/stats") as r:
        stats = json.load(r)["model_stats"][0]
        return stats["inference_count"], stats["execution_count"]


@contextlib.contextmanager
def on_cores(cores):
    """Runs the block (and the processes it starts) on `cores`; None = unchanged."""
    if cores is None:
        yield
        return
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


class SingleThreaded:
    """The model's input with an ONNX Runtime session on one intra-op thread (`--isolate`)."""

    def __init__(self, model):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.inputs = model.inputs
        self.session = ort.InferenceSession(model.path, options, providers=["CPUExecutionProvider"])


def repo(directory, model, spinning, batching=False, single_thread=False):
    """A repository with the recogniser as `rec`; `spinning` None = Tern's default."""
    root = os.path.join(directory, f"repo-{spinning}-{batching}-{single_thread}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "rec", "1"))
    shutil.copy(model.path, os.path.join(root, "rec", "1", "model.onnx"))
    (inp,), (out,) = model.io_meta()
    extra = "" if spinning is None else f'parameters {{ key: "allow_spinning" value {{ string_value: "{spinning}" }} }}\n'
    if single_thread:
        extra += 'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'
    if batching:
        extra += "dynamic_batching { }\n"
    with open(os.path.join(root, "rec", "config.pbtxt"), "w") as f:
        f.write(
            f'name: "rec"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            f'input [ {{ name: "{inp["name"]}" data_type: TYPE_FP32 dims: {inp["shape"][1:]} }} ]\n'
            f'output [ {{ name: "{out["name"]}" data_type: TYPE_FP32 dims: {out["shape"][1:]} }} ]\n'
            "instance_group [ { kind: KIND_CPU count: 1 } ]\n" + extra
        )
    return root


MAX_DRIFT = 0.15


def measure(a, model, root, data, runs, batch, isolate=False):
    """perf_analyzer runs against a server on `root`: [(protocol, concurrency)] -> result dicts,
    each with ONNX Runtime alone at `batch` measured just before and after it. `isolate`: the
    server and ONNX Runtime alone on core 0 (`model` single-threaded), perf_analyzer on core 1."""
    model_cores, client_cores = ({0}, {1}) if isolate else (None, None)
    wrapper = ("taskset", "-c", "0") if isolate else ()
    t = Tern([f"--model-repository={root}"], binary=a.tern, wrapper=wrapper)
    try:
        server = type("S", (), {"http": t.url.split(":")[1], "grpc": t.grpc_url.split(":")[1]})
        out = {}
        for protocol, conc in runs:
            with on_cores(model_cores):
                before = peers.ort_alone(model, batch, a.duration)["throughput"]
            cpu0, (n0, e0) = cpu_seconds(t.proc.pid), served(t.url)
            with on_cores(client_cores):
                r = peers.perf_analyzer(a, server, "rec", data, protocol, conc)
            cpu1, (n1, e1) = cpu_seconds(t.proc.pid), served(t.url)
            if "error" in r:
                raise RuntimeError(f"perf_analyzer {protocol} c{conc}: {r['error']}")
            r["cpu_per_request"] = (cpu1 - cpu0) / max(1, n1 - n0)
            r["mean_batch"] = (n1 - n0) / max(1, e1 - e0)
            with on_cores(model_cores):
                after = peers.ort_alone(model, batch, a.duration)["throughput"]
            r["ort_alone"] = (before + after) / 2
            r["steady"] = abs(before - after) <= MAX_DRIFT * max(before, after)
            out[(protocol, conc)] = r
        idle_before = cpu_seconds(t.proc.pid)
        time.sleep(5)
        out["idle_cpu_pct"] = (cpu_seconds(t.proc.pid) - idle_before) / 5 * 100
        return out
    finally:
        t.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tern", default=os.path.join(peers.ROOT, "target", "release", "tern"))
    p.add_argument("--perf-analyzer", default=os.path.join(peers.ROOT, ".cache", "perf_analyzer", "perf_analyzer"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=4.0, help="perf_analyzer measurement window, seconds")
    p.add_argument("--isolate", action="store_true", help="server and ONNX Runtime alone on core 0, one intra-op thread; client on core 1")
    a = p.parse_args()
    a.tern = os.path.abspath(a.tern)
    if a.isolate:
        if not {0, 1} <= os.sched_getaffinity(0) or not shutil.which("taskset"):
            sys.exit("--isolate needs cores 0 and 1 and taskset")
        return isolated(a)
    work = tempfile.mkdtemp(prefix="tern-bench-ort-")
    try:
        model = peers.Model("rec", peers.rec_model(), {"x": peers.rec_input()})
        data = model.input_data(work, batched=True)
        variants = {"default (spinning on)": None, 'allow_spinning: "false"': "false"}
        roots = {name: repo(work, model, spin) for name, spin in variants.items()}
        batched_root = repo(work, model, None, batching=True)
        runs = [("grpc", 1), ("http", 1), ("grpc", 16), ("http", 16)]
        results = {name: [] for name in variants}
        batched = []
        for r in range(a.rounds):
            for name, root in roots.items():
                peers.log(f"round {r + 1}: {name}")
                results[name].append(measure(a, model, root, data, runs if name.startswith("default") else runs[:1], 1))
            peers.log(f"round {r + 1}: dynamic batching")
            batched.append(measure(a, model, batched_root, data, runs[2:], 8))
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731

        def ratio(rounds, key):
            kept = [x[key]["throughput"] / x[key]["ort_alone"] for x in rounds if x[key]["steady"]]
            return f"{med(kept):.2f} ({len(kept)}/{len(rounds)})"

        print(f"\n{peers.machine()['cpu']}, {os.cpu_count()} cores; medians of {a.rounds} rounds")
        print("ratio: median of Tern / ONNX Runtime alone measured just before and after it (figures kept)\n")
        print("| variant | protocol | concurrency | inferences/s | ORT alone, batch 1 | ratio | p99 ms | server CPU per request | idle CPU after load |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, rounds in results.items():
            for key in [k for k in rounds[0] if k != "idle_cpu_pct"]:
                thr = med([x[key]["throughput"] for x in rounds])
                alone = med([x[key]["ort_alone"] for x in rounds])
                p99 = med([x[key]["p99_ms"] for x in rounds])
                cpu = med([x[key]["cpu_per_request"] for x in rounds])
                idle = med([x["idle_cpu_pct"] for x in rounds])
                print(f"| {name} | {key[0]} | {key[1]} | {thr:.1f} | {alone:.1f} | {ratio(rounds, key)} | {p99:.1f} | {cpu * 1000:.1f} ms | {idle:.1f}% |")
        print("\nDynamic batching (max_batch_size 8) against ONNX Runtime alone at batch 8\n")
        print("| protocol | concurrency | Tern inferences/s | mean batch | ORT alone, batch 8 | ratio | p99 ms |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for key in runs[2:]:
            thr = med([x[key]["throughput"] for x in batched])
            size = med([x[key]["mean_batch"] for x in batched])
            alone = med([x[key]["ort_alone"] for x in batched])
            p99 = med([x[key]["p99_ms"] for x in batched])
            print(f"| {key[0]} | {key[1]} | {thr:.1f} | {size:.1f} | {alone:.1f} | {ratio(batched, key)} | {p99:.1f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def isolated(a):
    """`--isolate`: the server's own cost on the model's core, the client on the other core."""
    work = tempfile.mkdtemp(prefix="tern-bench-ort-")
    try:
        model = peers.Model("rec", peers.rec_model(), {"x": peers.rec_input()})
        single = SingleThreaded(model)
        data = model.input_data(work, batched=True)
        plain = repo(work, model, None, single_thread=True)
        batched_root = repo(work, model, None, batching=True, single_thread=True)
        unbatched_runs, batched_runs = [("grpc", 1), ("http", 1)], [("grpc", 16), ("http", 16)]
        rounds = []
        for r in range(a.rounds):
            peers.log(f"round {r + 1}: concurrency 1")
            x = measure(a, single, plain, data, unbatched_runs, 1, isolate=True)
            peers.log(f"round {r + 1}: dynamic batching")
            x.update(measure(a, single, batched_root, data, batched_runs, 8, isolate=True))
            rounds.append(x)
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        print(f"\n{peers.machine()['cpu']}; server and ONNX Runtime alone on core 0 (one intra-op thread), perf_analyzer on core 1")
        print(f"medians of {a.rounds} rounds; ratio: Tern / ONNX Runtime alone just before and after it (figures kept)\n")
        print("| protocol | concurrency | batching | Tern inferences/s | mean batch | ORT alone | ratio | p99 ms | server CPU per inference |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
        for key in unbatched_runs + batched_runs:
            kept = [x[key]["throughput"] / x[key]["ort_alone"] for x in rounds if x[key]["steady"]]
            col = lambda k: med([x[key][k] for x in rounds])  # noqa: E731
            batching = "dynamic, max 8" if key[1] > 1 else "none"
            print(
                f"| {key[0]} | {key[1]} | {batching} | {col('throughput'):.1f} | {col('mean_batch'):.1f} | {col('ort_alone'):.1f} "
                f"| {med(kept):.2f} ({len(kept)}/{len(rounds)}) | {col('p99_ms'):.1f} | {col('cpu_per_request') * 1000:.1f} ms |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
