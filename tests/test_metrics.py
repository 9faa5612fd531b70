"""Prometheus metrics on the metrics port: Triton's names, labels and types,
values that agree with the statistics extension after known traffic,
failure reasons (queue full -> REJECTED, plugin trap -> BACKEND, invalid
request -> OTHER), latency summaries, Tern's own families and the flags."""

import os
import shutil
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from conftest import Tern, gen_models
from test_plugins import plugins_dir

TRITON_COUNTERS = [
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
]
TRITON_GAUGES = [
    "nv_inference_pending_request_count",
    "nv_model_load_duration_secs",
    "nv_cpu_utilization",
    "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
    "nv_pinned_memory_pool_total_bytes",
    "nv_pinned_memory_pool_used_bytes",
]


def scrape(t):
    with urllib.request.urlopen(f"http://{t.metrics_url}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families, name, family=None, **labels):
    """The value of the one sample of `name` whose labels include `labels`
    (the parser exposes counter samples as `<family>_total`)."""
    fam_name = family or (name[: -len("_total")] if name.endswith("_total") else name)
    fam = families[fam_name]
    names = {name, name + "_total"} if fam.type == "counter" else {name}
    found = [
        s.value
        for s in fam.samples
        if s.name in names and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, f"{name} {labels}: {found}"
    return found[0]


@pytest.fixture(scope="module")
def metrics_repo(tmp_path_factory):
    """simple, a slow model with a one-request queue, a plugin that traps on demand, a tagged model."""
    root = str(tmp_path_factory.mktemp("metrics") / "models")
    gen_models.example(root)
    for name in os.listdir(root):
        if name not in ("simple",):
            shutil.rmtree(os.path.join(root, name))
    gen_models.write(
        f"{root}/tiny_queue/config.pbtxt",
        gen_models.io_config(
            "tiny_queue",
            "TYPE_INT32",
            [-1],
            4,
            "identity",
            'parameters { key: "execute_delay_ms" value: { string_value: "400" } }\n'
            "dynamic_batching { max_queue_delay_microseconds: 0 default_queue_policy { max_queue_size: 1 } }\n"
            'metric_tags { key: "team" value: "edge" }',
        ),
    )
    os.makedirs(f"{root}/tiny_queue/1")
    plugins = str(tmp_path_factory.mktemp("metrics-plugins"))
    gen_models.plugin_repo(plugins, plugins_dir())
    shutil.copytree(f"{plugins}/misbehave", f"{root}/misbehave")
    return root


@pytest.fixture(scope="module")
def msrv(metrics_repo):
    t = Tern([f"--model-repository={metrics_repo}", "--wasm-cache-dir=none", "--metrics-interval-ms=200"])
    yield t
    t.stop()


def simple_inputs():
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    ins = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(a)
    return ins


def test_names_types_and_agreement_with_statistics(msrv):
    c = httpclient.InferenceServerClient(msrv.url)
    for _ in range(5):
        c.infer("simple", simple_inputs())
    with pytest.raises(InferenceServerException):
        c.infer("simple", simple_inputs()[:1])  # a missing input: OTHER
    fams = scrape(msrv)
    for name in TRITON_COUNTERS:
        assert fams[name].type == "counter", name
    for name in TRITON_GAUGES:
        assert fams[name].type == "gauge", name
    stats = c.get_inference_statistics("simple")["model_stats"][0]
    inf = stats["inference_stats"]
    labels = {"model": "simple", "version": "1"}
    assert value(fams, "nv_inference_request_success", **labels) == inf["success"]["count"] == 5
    assert value(fams, "nv_inference_count", **labels) == stats["inference_count"] == 5
    assert value(fams, "nv_inference_exec_count", **labels) == stats["execution_count"]
    assert value(fams, "nv_inference_request_duration_us", **labels) == inf["success"]["ns"] // 1000
    assert value(fams, "nv_inference_queue_duration_us", **labels) == inf["queue"]["ns"] // 1000
    for part in ("input", "infer", "output"):
        assert value(fams, f"nv_inference_compute_{part}_duration_us", **labels) == inf[f"compute_{part}"]["ns"] // 1000
    assert value(fams, "nv_inference_request_failure", reason="OTHER", **labels) == inf["fail"]["count"] == 1
    for reason in ("REJECTED", "CANCELED", "BACKEND"):
        assert value(fams, "nv_inference_request_failure", reason=reason, **labels) == 0
    assert value(fams, "nv_inference_pending_request_count", **labels) == 0
    assert 0 < value(fams, "nv_model_load_duration_secs", **labels) < 60
    assert 0 <= value(fams, "nv_cpu_utilization") <= 1
    total = value(fams, "nv_cpu_memory_total_bytes")
    assert 0 < value(fams, "nv_cpu_memory_used_bytes") <= total
    assert value(fams, "nv_pinned_memory_pool_total_bytes") == 0
    # Labels carry the config's metric_tags, as Triton names them: `_<key>`.
    assert value(fams, "nv_inference_count", model="tiny_queue", version="1", _team="edge") == 0


def test_failure_reasons_rejected_and_backend(msrv):
    c = httpclient.InferenceServerClient(msrv.url, concurrency=8)
    inp = httpclient.InferInput("INPUT0", [1, 2], "INT32")
    inp.set_data_from_numpy(np.array([[1, 2]], dtype=np.int32))
    pending = [c.async_infer("tiny_queue", [inp]) for _ in range(6)]
    outcomes = []
    for p in pending:
        try:
            p.get_result()
            outcomes.append("ok")
        except InferenceServerException as e:
            assert "Exceeds maximum queue size" in str(e), e
            outcomes.append("rejected")
    rejected = outcomes.count("rejected")
    assert rejected >= 1 and "ok" in outcomes, outcomes
    mode = httpclient.InferInput("MODE", [1], "BYTES")
    mode.set_data_from_numpy(np.array([b"panic"], dtype=np.object_))
    with pytest.raises(InferenceServerException, match="trapped"):
        c.infer("misbehave", [mode])
    fams = scrape(msrv)
    tq = {"model": "tiny_queue", "version": "1"}
    assert value(fams, "nv_inference_request_failure", reason="REJECTED", **tq) == rejected
    assert value(fams, "nv_inference_request_success", **tq) == outcomes.count("ok")
    mb = {"model": "misbehave", "version": "1"}
    assert value(fams, "nv_inference_request_failure", reason="BACKEND", **mb) == 1
    assert value(fams, "tern_plugin_traps_total", model="misbehave") == 1
    assert fams["tern_plugin_traps"].type == "counter"
    assert value(fams, "tern_wasm_cache_misses_total") >= 1
    stats = c.get_inference_statistics("tiny_queue")["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == rejected


def test_summaries_behind_metrics_config(metrics_repo):
    t = Tern(
        [
            f"--model-repository={metrics_repo}",
            "--wasm-cache-dir=none",
            "--metrics-config=summary_latencies=true",
            "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001",
            "--metrics-config=counter_latencies=false",
        ]
    )
    try:
        c = httpclient.InferenceServerClient(t.url)
        for _ in range(20):
            c.infer("simple", simple_inputs())
        fams = scrape(t)
        assert "nv_inference_request_duration_us" not in fams
        summary = fams["nv_inference_request_summary_us"]
        assert summary.type == "summary"
        labels = {"model": "simple", "version": "1"}
        p50 = value(fams, "nv_inference_request_summary_us", quantile="0.5", **labels)
        p99 = value(fams, "nv_inference_request_summary_us", quantile="0.99", **labels)
        assert 0 < p50 <= p99
        assert value(fams, "nv_inference_request_summary_us_count", family="nv_inference_request_summary_us", **labels) == 20
        for kind in ("queue", "compute_input", "compute_infer", "compute_output"):
            assert fams[f"nv_inference_{kind}_summary_us"].type == "summary"
    finally:
        t.stop()


def test_metrics_flags(metrics_repo):
    off = Tern([f"--model-repository={metrics_repo}", "--wasm-cache-dir=none", "--allow-metrics=false"])
    try:
        assert off.metrics_url is None
        assert "Metrics Service" not in off.log()
    finally:
        off.stop()
    no_cpu = Tern([f"--model-repository={metrics_repo}", "--wasm-cache-dir=none", "--allow-cpu-metrics=false"])
    try:
        fams = scrape(no_cpu)
        assert "nv_cpu_utilization" not in fams and "nv_inference_count" in fams
    finally:
        no_cpu.stop()
    bad = Tern([f"--model-repository={metrics_repo}", "--metrics-config=histogram_latencies=often"], wait_ready=False)
    assert bad.wait() != 0
    assert "histogram_latencies" in bad.log()
