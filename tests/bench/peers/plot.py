"""Plots for `make bench-peers`: `python plot.py RESULTS.json OUT_DIR` writes
OUT_DIR/peers-<model>.png (throughput and p99 latency against concurrency,
one line per server and protocol; ONNX Runtime alone as horizontal lines on
the `rec` plot). Runs in the MLServer venv, which has matplotlib."""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOUR = {"tern": "#d62728", "mlserver": "#1f77b4", "kserve": "#2ca02c"}
LABEL = {"tern": "Tern", "mlserver": "MLServer", "kserve": "KServe"}
STYLE = {"grpc": ("-", "o"), "http": ("--", "s"), "http-json": (":", "^")}
PROTO = {"grpc": "gRPC", "http": "HTTP binary", "http-json": "HTTP JSON"}
TITLE = {
    "simple": "simple (2 x INT32[1,16] -> sum, difference)",
    "rec": "PP-OCRv4 text recogniser (FP32[1,3,48,320] -> FP32[1,40,6625])",
}


def plot(result, model, out):
    meta = result["meta"]
    rows = [s for s in result["summary"] if s["model"] == model and s["throughput"]]
    if not rows:
        return None
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(10.5, 4.4))
    series = {}
    for s in rows:
        series.setdefault((s["server"], s["protocol"]), []).append(s)
    for (server, proto), ss in sorted(series.items(), key=lambda kv: (list(LABEL).index(kv[0][0]), list(STYLE).index(kv[0][1]))):
        ss.sort(key=lambda s: s["concurrency"])
        c = [s["concurrency"] for s in ss]
        ls, mk = STYLE[proto]
        kw = dict(color=COLOUR[server], linestyle=ls, marker=mk, markersize=4, linewidth=1.6, label=f"{LABEL[server]}, {PROTO[proto]}")
        ax_t.plot(c, [s["throughput"] for s in ss], **kw)
        ax_l.plot(c, [s["p99_ms"] for s in ss], **kw)
    if model == "rec":
        for o in result["ort_alone"]:
            if o["model"] == model and o["throughput"]:
                ls = "-" if o["batch"] == 1 else "-."
                ax_t.axhline(o["throughput"], color="0.35", linestyle=ls, linewidth=1.1, label=f"ONNX Runtime alone, batch {o['batch']}")
    concs = sorted({s["concurrency"] for s in rows})
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.minorticks_off()
        ax.set_xlabel("concurrent requests (perf_analyzer)")
        ax.grid(True, alpha=0.3)
    if model == "simple":  # the servers are an order of magnitude apart
        ax_t.set_yscale("log")
        ax_t.set_ylabel("inferences / s (log)")
    else:
        ax_t.set_ylim(bottom=0)
        ax_t.set_ylabel("inferences / s")
    ax_t.set_title("throughput (higher is better)", fontsize=10)
    ax_l.set_yscale("log")
    ax_l.set_ylabel("p99 latency, ms (log)")
    ax_l.set_title("p99 client latency (lower is better)", fontsize=10)
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    m = meta["machine"]
    rounds = f"median of {meta['rounds']} rounds" if meta["rounds"] > 1 else "1 round"
    present = [k for k in LABEL if any(s["server"] == k for s in rows)]
    versions = meta.get("versions", {})
    names = [LABEL[k] + (" " + versions[k].split()[0].split("==")[1] if versions.get(k) else "") for k in present if k != "tern"]
    fig.suptitle(f"{' vs '.join(['Tern'] + names)}: {TITLE.get(model, model)}\n"
                 f"{m['cpu']}, {m['cores']} cores shared by server and perf_analyzer; {rounds}", fontsize=10.5)
    fig.tight_layout(rect=(0, 0.12 if len(labels) > 4 else 0.08, 1, 1))
    path = os.path.join(out, f"peers-{model}.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main():
    with open(sys.argv[1]) as f:
        result = json.load(f)
    os.makedirs(sys.argv[2], exist_ok=True)
    for model in sorted({s["model"] for s in result["summary"]}):
        path = plot(result, model, sys.argv[2])
        if path:
            print(f"plot: {path} ({os.path.getsize(path) // 1024} KB)")


if __name__ == "__main__":
    main()
