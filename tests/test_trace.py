"""Request tracing (Triton's --trace-config, the trace extension) through the
built binary with tritonclient: the settings over HTTP and gRPC with Triton's
texts, Triton's trace files for HTTP and gRPC requests (timestamps, tensors,
ensemble steps as child traces, rate, count and log-frequency files, the
file closed at shutdown), and OpenTelemetry spans sent to a collector this
test runs (span tree, attributes, a client's traceparent continued)."""

import http.server
import json
import signal
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from test_plugins import bls_inputs, cache_dir, plugin_repo  # noqa: F401 (fixtures)
from test_response_cache import inputs, pair, repo

ENSEMBLE = '''name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "B" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "m" model_version: -1
    input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "T0" } output_map { key: "OUTPUT1" value: "T1" } },
  { model_name: "m" model_version: -1
    input_map { key: "INPUT0" value: "T0" } input_map { key: "INPUT1" value: "T1" }
    output_map { key: "OUTPUT0" value: "Y" } }
] }
'''

A = np.array([[1, 2, 3, 4]], dtype=np.int32)
B = np.array([[5, 6, 7, 8]], dtype=np.int32)
CORE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]


def models(tmp_path):
    return repo(tmp_path, {"m": pair("m", cache=False), "other": pair("other", cache=False), "ens": ENSEMBLE})


def http_infer(t, model="m", request_id="", headers=None):
    c = httpclient.InferenceServerClient(t.url)
    return c.infer(model, inputs(httpclient, A, B), request_id=request_id, headers=headers)


def grpc_infer(t, model="m", request_id="", headers=None):
    c = grpcclient.InferenceServerClient(t.grpc_url)
    return c.infer(model, inputs(grpcclient, A, B), request_id=request_id, headers=headers)


def ens_infer(t):
    c = httpclient.InferenceServerClient(t.url)
    ins = [httpclient.InferInput("A", [1, 4], "INT32"), httpclient.InferInput("B", [1, 4], "INT32")]
    ins[0].set_data_from_numpy(A)
    ins[1].set_data_from_numpy(B)
    return c.infer("ens", ins)


def traces(records):
    """Trace id -> {"header": ..., "timestamps": [names in order], "ns": {name: ns}, "tensors": [...]}."""
    out = {}
    for r in records:
        t = out.setdefault(r["id"], {"header": None, "timestamps": [], "ns": {}, "tensors": []})
        if "model_name" in r:
            t["header"] = r
        elif "timestamps" in r:
            assert len(r["timestamps"]) == 1
            ts = r["timestamps"][0]
            t["timestamps"].append(ts["name"])
            t["ns"][ts["name"]] = ts["ns"]
        else:
            t["tensors"].append((r["activity"], r["tensor"]))
    return out


def stop_and_read(t, path):
    assert t.stop(sig=signal.SIGTERM) == 0
    with open(path) as f:
        return json.load(f)


def test_http_and_grpc_requests_in_tritons_trace_file(tmp_path, start_tern):
    path = tmp_path / "trace.json"
    t = start_tern([f"--model-repository={models(tmp_path)}", f"--trace-config=triton,file={path}",
                    "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1"])
    http_infer(t, request_id="h1")
    grpc_infer(t, request_id="g1")
    assert not path.exists(), "with log-frequency 0 the file is written when the setting ends"
    got = traces(stop_and_read(t, path))
    assert len(got) == 2
    h, g = (next(v for v in got.values() if v["header"].get("request_id") == rid) for rid in ("h1", "g1"))
    assert h["header"] == {"id": h["header"]["id"], "model_name": "m", "model_version": 1, "request_id": "h1"}
    assert h["timestamps"] == ["HTTP_RECV_START", "HTTP_RECV_END", *CORE, "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
    assert g["timestamps"] == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *CORE, "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START", "GRPC_SEND_END"]
    for trace in (h, g):
        ns = [trace["ns"][n] for n in CORE]
        assert ns == sorted(ns), trace
        assert ns[0] > 0
    assert h["ns"]["HTTP_RECV_START"] <= h["ns"]["REQUEST_START"] <= h["ns"]["HTTP_SEND_END"]


def test_tensors_ensemble_children_and_rate(tmp_path, start_tern):
    path = tmp_path / "trace.json"
    t = start_tern([f"--model-repository={models(tmp_path)}", f"--trace-config=triton,file={path}",
                    "--trace-config=level=TIMESTAMPS", "--trace-config=level=TENSORS", "--trace-config=rate=2"])
    for _ in range(4):
        http_infer(t)
    ens_infer(t)  # the 5th request: not sampled
    ens_infer(t)  # the 6th: sampled, with its two steps
    got = traces(stop_and_read(t, path))
    direct = [v for v in got.values() if v["header"]["model_name"] == "m" and "parent_id" not in v["header"]]
    assert len(direct) == 2, "rate 2: every second request"
    tensors = direct[0]["tensors"]
    assert ("TENSOR_QUEUE_INPUT", {"name": "INPUT0", "data": "1,2,3,4", "shape": "1,4", "dtype": "INT32"}) in tensors
    assert ("TENSOR_BACKEND_OUTPUT", {"name": "OUTPUT1", "data": "5,6,7,8", "shape": "1,4", "dtype": "INT32"}) in tensors
    [parent] = [v for v in got.values() if v["header"]["model_name"] == "ens"]
    children = [v for v in got.values() if v["header"].get("parent_id") == parent["header"]["id"]]
    assert len(children) == 2
    assert all(c["header"]["model_name"] == "m" and "COMPUTE_START" in c["timestamps"] for c in children)
    assert "COMPUTE_START" not in parent["timestamps"]
    assert parent["timestamps"][-2:] == ["HTTP_SEND_START", "HTTP_SEND_END"]


def test_count_and_log_frequency_files(tmp_path, start_tern):
    path = tmp_path / "t.json"
    t = start_tern([f"--model-repository={models(tmp_path)}", f"--trace-config=triton,file={path}",
                    "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1", "--trace-config=triton,log-frequency=2"])
    c = httpclient.InferenceServerClient(t.url)
    for _ in range(5):
        http_infer(t)
    assert len(traces(json.load(open(f"{path}.0")))) == 2
    assert len(traces(json.load(open(f"{path}.1")))) == 2
    # A count: the traces are written when the last one is taken (rate 1).
    c.update_trace_settings(settings={"trace_count": "2", "log_frequency": "0"})
    for _ in range(3):
        http_infer(t)
    assert c.get_trace_settings()["trace_count"] == "0"
    time.sleep(0.2)
    # The setting replaced by the update wrote the 5th trace to <file>.2 (log frequency 2).
    assert len(traces(json.load(open(f"{path}.2")))) == 1
    assert len(traces(json.load(open(f"{path}.3")))) == 2
    t.stop()
    assert not path.exists()


def test_settings_over_http_with_tritons_texts(tmp_path, start_tern):
    path = tmp_path / "t.json"
    t = start_tern([f"--model-repository={models(tmp_path)}", f"--trace-config=triton,file={path}"])
    c = httpclient.InferenceServerClient(t.url)
    assert "trace" in c.get_server_metadata()["extensions"]
    assert c.get_trace_settings() == {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
                                      "log_frequency": "0", "trace_file": str(path), "trace_mode": "triton"}
    raw = urllib.request.urlopen(f"http://{t.url}/v2/trace/setting").read().decode()
    assert raw.startswith('{"trace_level":["OFF"],"trace_rate":"1000"'), "Triton's key order"

    def post(body, route="/v2/trace/setting"):
        req = urllib.request.Request(f"http://{t.url}{route}", data=body.encode(), method="POST")
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    assert post('{"trace_rate":"abc"}') == (400, {"error": "Unable to parse 'trace_rate', got: abc"})
    assert post('{"trace_count":"-2"}') == (400, {"error": "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"})
    assert post('{"trace_level":["TIMESTAMPS","OFF"]}') == (400, {"error": "Expect only one trace level 'OFF' is specified"})
    assert post('{"trace_file":"/tmp/x"}') == (501, {"error": "trace file location can not be updated through network protocol"})
    assert post('{"trace_rate":5}')[0] == 500
    assert post('{"trace_level":["TIMESTAMPS"],"trace_rate":"0"}') == (400, {"error": "Attempting to set invalid trace setting :sample rate must be non-zero"})
    assert post('{"trace_level":["TIMESTAMPS"]}', "/v2/models/nosuch/trace/setting") == (400, {"error": "Request for unknown model : nosuch"})
    assert c.get_trace_settings()["trace_level"] == ["OFF"], "failed updates changed nothing"

    # A model's own setting; the others follow the global one.
    s = c.update_trace_settings(model_name="m", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    assert (s["trace_level"], s["trace_rate"]) == (["TIMESTAMPS"], "1")
    http_infer(t, "m")
    http_infer(t, "other")
    c.update_trace_settings(settings={"trace_count": "50"})
    assert c.get_trace_settings(model_name="m")["trace_count"] == "50", "m follows a global value it does not set"
    cleared = c.update_trace_settings(model_name="m", settings={"trace_level": None, "trace_rate": None})
    assert cleared["trace_level"] == ["OFF"] and cleared["trace_rate"] == "1000"
    got = traces(stop_and_read(t, path))
    assert [v["header"]["model_name"] for v in got.values()] == ["m"], "only m was traced"


def test_settings_over_grpc(tmp_path, start_tern):
    path = tmp_path / "t.json"
    t = start_tern([f"--model-repository={models(tmp_path)}", f"--trace-config=triton,file={path}"])
    c = grpcclient.InferenceServerClient(t.grpc_url)
    s = c.get_trace_settings(as_json=True)["settings"]
    assert s["trace_level"]["value"] == ["OFF"] and s["trace_file"]["value"] == [str(path)]
    s = c.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, as_json=True)["settings"]
    assert s["trace_rate"]["value"] == ["1"]
    grpc_infer(t)
    with pytest.raises(InferenceServerException) as e:
        c.update_trace_settings(settings={"trace_count": "-2"})
    assert "Unable to parse 'trace_count'. Expecting value >= -1, got: -2" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        c.update_trace_settings(settings={"trace_file": "/x"})
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException) as e:
        c.update_trace_settings(model_name="nosuch", settings={"trace_rate": "1"})
    assert "Request for unknown model : nosuch" in str(e.value)
    # An empty value list clears (tritonclient sends None as one).
    s = c.update_trace_settings(settings={"trace_rate": None}, as_json=True)["settings"]
    assert s["trace_rate"]["value"] == ["1000"]
    assert len(traces(stop_and_read(t, path))) == 1


@pytest.mark.parametrize("args,text", [
    (["--trace-config=level=BAD"], 'Bad option: "--trace-config level". invalid value for trace level option: bad'),
    (["--trace-config=rate=abc"], 'Bad option: "--trace-config rate". Invalid option value. Got abc'),
    (["--trace-config=mode=bad"], "invalid value for trace mode option: bad."),
    (["--trace-config=level"], "--trace-config option format is '<trace mode>,<setting>=<value>'. Got level"),
    (["--trace-config=mode=opentelemetry", "--trace-config=opentelemetry,url=https://c:4318/v1/traces"], "TLS is not built in"),
])
def test_bad_flags_stop_the_server(tmp_path, start_tern, args, text):
    t = start_tern([f"--model-repository={models(tmp_path)}", *args], wait_ready=False)
    assert t.wait(60) != 0
    # The message is logged as a JSON string, as Triton logs messages.
    assert json.dumps(text)[1:-1] in t.log()


class Collector:
    """An OTLP/HTTP collector: keeps the JSON bodies posted to /v1/traces."""

    def __init__(self):
        bodies = self.bodies = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                bodies.append((self.path, self.headers["Content-Type"], json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self):
        out = []
        for _, _, body in self.bodies:
            for rs in body["resourceSpans"]:
                attrs = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        out.append((attrs, ss["scope"]["name"], s))
        return out

    def wait_spans(self, n, timeout=15):
        deadline = time.time() + timeout
        while len(self.spans()) < n and time.time() < deadline:
            time.sleep(0.1)
        return self.spans()


def test_opentelemetry_spans_and_a_continued_traceparent(tmp_path, start_tern):
    col = Collector()
    t = start_tern([f"--model-repository={models(tmp_path)}", "--trace-config=mode=opentelemetry",
                    "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
                    f"--trace-config=opentelemetry,url={col.url}", "--trace-config=opentelemetry,resource=test.key=v",
                    "--trace-config=opentelemetry,bsp_schedule_delay=200"])
    s = httpclient.InferenceServerClient(t.url).get_trace_settings()
    assert s["trace_mode"] == "opentelemetry" and "trace_file" not in s and s["url"] == col.url
    assert s["bsp_schedule_delay"] == "200" and s["bsp_max_queue_size"] == "2048"
    http_infer(t, request_id="o1")
    spans = col.wait_spans(3)
    assert len(spans) == 3
    assert all(p == "/v1/traces" and ct == "application/json" for p, ct, _ in col.bodies)
    resource, scope, _ = spans[0]
    assert resource["service.name"] == {"stringValue": "triton-inference-server"}
    assert resource["test.key"] == {"stringValue": "v"}
    assert scope == "triton-server"
    by_name = {s["name"]: s for _, _, s in spans}
    root, model, compute = by_name["InferRequest"], by_name["m"], by_name["compute"]
    assert "parentSpanId" not in root or not root["parentSpanId"]
    assert model["parentSpanId"] == root["spanId"] and compute["parentSpanId"] == model["spanId"]
    assert len({s["traceId"] for s in (root, model, compute)}) == 1
    attrs = {a["key"]: a["value"] for a in model["attributes"]}
    assert attrs["triton.model_name"] == {"stringValue": "m"}
    assert attrs["triton.model_version"] == {"intValue": "1"}
    assert attrs["triton.trace_parent_id"] == {"intValue": "0"}
    assert attrs["triton.request_id"] == {"stringValue": "o1"}
    assert [e["name"] for e in root["events"]] == ["HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
    assert [e["name"] for e in model["events"]] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert [e["name"] for e in compute["events"]] == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    assert all(s["kind"] in (2, "SPAN_KIND_SERVER") for s in (root, model, compute))

    # A client's traceparent over gRPC is continued, and forces the sample at any rate.
    httpclient.InferenceServerClient(t.url).update_trace_settings(settings={"trace_rate": "1000"})
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    grpc_infer(t, headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    http_infer(t)  # not sampled at rate 1000
    spans = col.wait_spans(6)
    time.sleep(0.5)
    spans = col.spans()
    assert len(spans) == 6
    grpc_root = next(s for _, _, s in spans if s["name"] == "InferRequest" and s["traceId"] == trace_id)
    assert grpc_root["parentSpanId"] == parent
    assert grpc_root["events"][0]["name"] == "GRPC_WAITREAD_START"
    t.stop()


def test_opentelemetry_ensemble_tree_and_an_unreachable_collector(tmp_path, start_tern):
    col = Collector()
    t = start_tern([f"--model-repository={models(tmp_path)}", "--trace-config=mode=opentelemetry",
                    "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
                    f"--trace-config=opentelemetry,url={col.url}", "--trace-config=opentelemetry,bsp_schedule_delay=200"])
    ens_infer(t)
    spans = [s for _, _, s in col.wait_spans(6)]
    names = sorted(s["name"] for s in spans)
    assert names == ["InferRequest", "compute", "compute", "ens", "m", "m"]
    ens = next(s for s in spans if s["name"] == "ens")
    for step in (s for s in spans if s["name"] == "m"):
        assert step["parentSpanId"] == ens["spanId"]
        attrs = {a["key"]: a["value"] for a in step["attributes"]}
        assert attrs["triton.trace_parent_id"] == next(a["value"] for a in ens["attributes"] if a["key"] == "triton.trace_id")
    col.server.shutdown()
    col.server.server_close()
    # Nothing listens any more: requests are answered as before.
    start = time.perf_counter()
    for _ in range(20):
        http_infer(t)
    assert time.perf_counter() - start < 10
    assert t.stop() == 0


def test_a_plugins_bls_calls_are_child_traces(plugin_repo, cache_dir, start_tern, tmp_path):
    path = tmp_path / "t.json"
    t = start_tern([f"--model-repository={plugin_repo}", f"--wasm-cache-dir={cache_dir}", f"--trace-config=triton,file={path}",
                    "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1"])
    inputs, a, b = bls_inputs("bls_caller2,simple")
    np.testing.assert_array_equal(httpclient.InferenceServerClient(t.url).infer("bls_caller", inputs).as_numpy("OUTPUT0"), a + b)
    got = traces(stop_and_read(t, path))
    by_model = {v["header"]["model_name"]: v["header"] for v in got.values()}
    assert set(by_model) == {"bls_caller", "bls_caller2", "simple"}
    assert "parent_id" not in by_model["bls_caller"]
    assert by_model["bls_caller2"]["parent_id"] == by_model["bls_caller"]["id"]
    assert by_model["simple"]["parent_id"] == by_model["bls_caller2"]["id"]
