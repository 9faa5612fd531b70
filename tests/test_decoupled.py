"""Decoupled models end to end: gRPC ModelStreamInfer through tritonclient
(every response with `triton_final_response`, the empty final response on
request, errors in-band on an open stream), HTTP generate and
generate_stream, Triton's errors for unary calls, cancellation when a
client goes away, a plugin answering after `execute` returned, the
decoupled plugin API in Rust, Python, JavaScript and C, and a component
built against tern:plugin@0.1.0 still served."""

import json
import os
import queue
import socket
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gen_models  # noqa: E402
from test_examples import expected_generation  # noqa: E402

WASM_DIR = os.environ.get("TERN_PLUGINS_DIR", os.path.join(ROOT, "target", "wasm32-wasip2", "release"))
LANGS = ["stream_count", "stream_python", "stream_js", "stream_c"]


@pytest.fixture(scope="module")
def dsrv(tmp_path_factory):
    if not os.path.exists(os.path.join(WASM_DIR, "stream_count.wasm")):
        pytest.fail("the decoupled test plugins are not built (make plugins lang-plugins)")
    root = str(tmp_path_factory.mktemp("decoupled") / "models")
    gen_models.decoupled_repo(root, WASM_DIR)
    t = Tern([f"--model-repository={root}", "--exit-on-error=false", "--metrics-config=histogram_latencies=true"])
    yield t
    t.stop()


class Stream:
    """A tritonclient gRPC stream collecting (result, error) pairs."""

    def __init__(self, server):
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.q = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.q.put((result, error)))

    def send(self, model, inputs, **kw):
        self.client.async_stream_infer(model, inputs, **kw)

    def take(self, timeout=10):
        return self.q.get(timeout=timeout)

    def until_final(self, timeout=10):
        """Messages up to and including the one with triton_final_response."""
        got = []
        while True:
            result, error = self.take(timeout)
            got.append((result, error))
            if error is None and result.get_response().parameters["triton_final_response"].bool_param:
                return got

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def count_input(mod, n):
    i = mod.InferInput("COUNT", [1], "INT32")
    i.set_data_from_numpy(np.array([n], dtype=np.int32))
    return i


def ids_input(mod, prompt):
    i = mod.InferInput("input_ids", [1, len(prompt)], "INT64")
    i.set_data_from_numpy(np.array([prompt], dtype=np.int64))
    return i


def outs(messages, name="OUT"):
    return [None if r.as_numpy(name) is None else int(r.as_numpy(name).reshape(-1)[0]) for r, _ in messages]


def test_grpc_streams_one_token_per_response(dsrv):
    s = Stream(dsrv)
    try:
        for prompt in ([1], [4], [5, 9, 3]):
            s.send("greedy_decoder_stream", [ids_input(grpcclient, prompt)], request_id=f"p{prompt[-1]}")
            got = s.until_final()
            assert all(e is None for _, e in got)
            assert outs(got, "output_ids") == expected_generation(prompt)
            finals = [r.get_response().parameters["triton_final_response"].bool_param for r, _ in got]
            assert finals == [False] * (len(got) - 1) + [True]
            assert {r.get_response().id for r, _ in got} == {f"p{prompt[-1]}"}
    finally:
        s.close()


@pytest.mark.parametrize("model", LANGS)
def test_every_guest_language_streams_and_reports_errors_in_band(dsrv, model):
    if not os.path.exists(os.path.join(WASM_DIR, f"{model}.wasm")):
        pytest.fail(f"{model} is not built (make lang-plugins)")
    s = Stream(dsrv)
    try:
        s.send(model, [count_input(grpcclient, 4)], enable_empty_final_response=True)
        got = s.until_final()
        assert outs(got) == [0, 1, 2, 3, None], "four responses, then the empty final response"
        # Without the opt-in a bare final flag sends nothing: the next message is the next request's.
        s.send(model, [count_input(grpcclient, 2)])
        got = [s.take(), s.take()]
        assert outs(got) == [0, 1]
        assert [r.get_response().parameters["triton_final_response"].bool_param for r, _ in got] == [False, False]
        time.sleep(0.3)
        assert s.q.empty()
        # Zero responses: only the empty final response, when asked for.
        s.send(model, [count_input(grpcclient, 0)], enable_empty_final_response=True)
        assert outs(s.until_final()) == [None]
        # An error is a message on the stream, which stays open.
        s.send(model, [count_input(grpcclient, -1)], enable_empty_final_response=True)
        result, error = s.take()
        assert error is not None and "COUNT must be >= 0, got -1" in str(error)
        s.send(model, [count_input(grpcclient, 1)], enable_empty_final_response=True)
        assert outs(s.until_final()) == [0, None]
        # An error response without the final flag (contract 0.1.3): more responses follow.
        s.send(model, [count_input(grpcclient, -3)], enable_empty_final_response=True)
        result, error = s.take()
        assert error is not None and "COUNT -3: an error response, the stream stays open" in str(error)
        assert outs(s.until_final()) == [7, None]
    finally:
        s.close()


def test_unary_calls_to_a_decoupled_model_get_tritons_errors(dsrv):
    g = grpcclient.InferenceServerClient(dsrv.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        g.infer("stream_count", [count_input(grpcclient, 1)])
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in e.value.message()
    h = httpclient.InferenceServerClient(dsrv.url)
    with pytest.raises(InferenceServerException) as e:
        h.infer("stream_count", [count_input(httpclient, 1)])
    assert e.value.status() == "501"
    assert "HTTP end point doesn't support models with decoupled transaction policy" in e.value.message()


def post(server, path, body):
    req = urllib.request.Request(f"http://{server.url}{path}", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def events(text):
    assert text.endswith("\n\n"), text
    return [json.loads(e[len("data: ") :]) for e in text.strip("\n").split("\n\n")]


def test_generate_stream_sends_server_sent_events(dsrv):
    status, ctype, text = post(dsrv, "/v2/models/greedy_decoder_stream/generate_stream", {"input_ids": [1], "id": "g1"})
    assert status == 200 and ctype.startswith("text/event-stream")
    got = events(text)
    assert [e["output_ids"] for e in got] == expected_generation([1])
    assert all(e["model_name"] == "greedy_decoder_stream" and e["model_version"] == "1" and e["id"] == "g1" for e in got)
    # A model that is not decoupled: one event.
    status, _, text = post(dsrv, "/v2/models/greedy_decoder/generate_stream", {"input_ids": [1]})
    assert status == 200 and [e["output_ids"] for e in events(text)] == [expected_generation([1])]
    # Errors after the stream started are events too.
    status, _, text = post(dsrv, "/v2/models/stream_count/generate_stream", {"COUNT": -1})
    assert status == 200 and events(text) == [{"error": "COUNT must be >= 0, got -1"}]


def test_generate_wants_exactly_one_response(dsrv):
    status, ctype, text = post(dsrv, "/v2/models/greedy_decoder/versions/1/generate", {"input_ids": [1]})
    assert status == 200 and ctype == "application/json"
    assert json.loads(text) == {"model_name": "greedy_decoder", "model_version": "1", "output_ids": expected_generation([1])}
    assert json.loads(post(dsrv, "/v2/models/stream_count/generate", {"COUNT": 1})[2]) == {
        "model_name": "stream_count",
        "model_version": "1",
        "OUT": 0,
    }
    status, _, text = post(dsrv, "/v2/models/stream_count/generate", {"COUNT": 3})
    assert status == 400
    assert json.loads(text)["error"].startswith("generate expects model to produce exactly 1 response")
    status, _, text = post(dsrv, "/v2/models/stream_count/generate", {"COUNT": 1, "bad": [1, 2]})
    assert status == 400
    assert json.loads(text)["error"] == "parameter 'bad' has invalid type. It should be either 'int', 'bool', or 'string'."
    status, _, text = post(dsrv, "/v2/models/stream_count/generate", {"nothing": 1})
    assert status == 400 and "missing required input(s) ['COUNT']" in json.loads(text)["error"]


def cancelled_line(server, model, before):
    deadline = time.time() + 10
    while time.time() < deadline:
        for line in server.lines[before:]:
            if "request cancelled after" in line and model in line:
                return line
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("model", ["stream_count", "stream_python"])
def test_a_client_that_goes_away_cancels_the_stream(dsrv, model):
    before = len(dsrv.lines)
    s = Stream(dsrv)
    s.send(model, [count_input(grpcclient, 200)], parameters={"delay_ms": 20})
    for _ in range(3):
        result, error = s.take()
        assert error is None
    s.close(cancel=True)
    line = cancelled_line(dsrv, model, before)
    assert line, "the plugin saw its request cancelled"
    done = int(line.split("request cancelled after ")[1].split()[0])
    assert 3 <= done < 200, line
    # The same over HTTP: read two events of generate_stream, then hang up.
    before = len(dsrv.lines)
    sock = socket.create_connection(tuple(dsrv.url.split(":")[0:1]) + (int(dsrv.url.split(":")[1]),))
    body = json.dumps({"COUNT": 200, "delay_ms": 20}).encode()
    sock.sendall(
        f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    seen = b""
    while seen.count(b"data: ") < 2:
        seen += sock.recv(4096)
    sock.close()
    line = cancelled_line(dsrv, model, before)
    assert line and int(line.split("request cancelled after ")[1].split()[0]) < 200


def test_a_plugin_may_answer_after_execute_returned(dsrv):
    """stream_count (one instance) keeps a `later` request's sender and
    answers it when its next `execute` call comes."""
    s = Stream(dsrv)
    try:
        kw = dict(enable_empty_final_response=True)
        s.send("stream_count", [count_input(grpcclient, 2)], parameters={"later": True}, request_id="held", **kw)
        time.sleep(0.5)
        assert s.q.empty(), "a held request is answered by a later call"
        s.send("stream_count", [count_input(grpcclient, 1)], request_id="now", **kw)
        got = [s.take() for _ in range(5)]
        assert all(e is None for _, e in got)
        by_id = {}
        for r, _ in got:
            by_id.setdefault(r.get_response().id, []).append(r)
        assert outs([(r, None) for r in by_id["held"]]) == [0, 1, None]
        assert outs([(r, None) for r in by_id["now"]]) == [0, None]
    finally:
        s.close(cancel=True)


def test_refused_and_compatible_models(dsrv):
    h = httpclient.InferenceServerClient(dsrv.url)
    index = {m["name"]: m for m in h.get_model_repository_index()}
    assert index["decoupled_onnx"]["state"] == "UNAVAILABLE"
    assert "its backend 'onnxruntime' cannot serve decoupled models" in index["decoupled_onnx"]["reason"]
    assert index["two_streams_ensemble"]["state"] == "UNAVAILABLE"
    assert (
        "in ensemble two_streams_ensemble, step of model 'pair_identity' receives inputs originated from different decoupled models"
        in index["two_streams_ensemble"]["reason"]
    )
    # A component built against tern:plugin@0.1.0 loads and runs on this server.
    i = httpclient.InferInput("INPUT0", [3], "INT32")
    i.set_data_from_numpy(np.array([7, 8, 9], dtype=np.int32))
    assert h.infer("compat_v0_1_0", [i]).as_numpy("OUTPUT0").tolist() == [7, 8, 9]
    assert dsrv.wait_log("compat plugin for 'compat_v0_1_0' (tern:plugin@0.1.0)")


@pytest.mark.parametrize("model", ["stream_relay", "stream_relay_python"])
def test_streaming_bls_returns_every_response(dsrv, model):
    """A plugin calling a decoupled model with exec(decoupled=True) gets each
    response in order; the decoupled model's error reaches it; a model that
    is not decoupled gives its one response; plain BLS to a decoupled model
    is refused."""
    if not os.path.exists(os.path.join(WASM_DIR, f"{model}.wasm")):
        pytest.fail(f"{model} is not built (make lang-plugins)")
    h = httpclient.InferenceServerClient(dsrv.url)
    assert h.infer(model, [count_input(httpclient, 5)]).as_numpy("OUTS").tolist() == [0, 1, 2, 3, 4]
    assert h.infer(model, [count_input(httpclient, 0)]).as_numpy("OUTS").tolist() == []
    with pytest.raises(InferenceServerException) as e:
        h.infer(model, [count_input(httpclient, -2)])
    assert "COUNT must be >= 0, got -2" in e.value.message()
    if model == "stream_relay":
        assert h.infer("relay_unary", [count_input(httpclient, 9)]).as_numpy("OUTS").tolist() == [9]


def test_an_ensemble_over_a_decoupled_step_streams(dsrv):
    """One ensemble response per response of the decoupled step, each
    through the step after it; an output from outside the stream goes with
    every response; the ensemble's config says it is decoupled."""
    h = httpclient.InferenceServerClient(dsrv.url)
    cfg = h.get_model_config("decoupled_ensemble")
    assert cfg["model_transaction_policy"] == {"decoupled": True}
    s = Stream(dsrv)
    try:
        s.send("decoupled_ensemble", [count_input(grpcclient, 3)], enable_empty_final_response=True)
        got = s.until_final()
        assert all(e is None for _, e in got)
        assert outs(got) == [0, 1, 2, None]
        assert outs(got[:3], "ECHO") == [3, 3, 3]
        # The decoupled step's error ends the ensemble's stream with it.
        s.send("decoupled_ensemble", [count_input(grpcclient, -1)])
        _, error = s.take()
        assert "in ensemble 'decoupled_ensemble', " in str(error) and "COUNT must be >= 0" in str(error)
    finally:
        s.close(cancel=True)
    status, _, text = post(dsrv, "/v2/models/decoupled_ensemble/generate_stream", {"COUNT": 2})
    assert [(e["OUT"], e["ECHO"]) for e in events(text)] == [(0, 2), (1, 2)]


def test_first_response_histogram_for_decoupled_models(dsrv):
    """With histogram_latencies=true, Triton's first-response histogram is
    exported for decoupled models only."""
    from prometheus_client.parser import text_string_to_metric_families

    s = Stream(dsrv)
    try:
        for _ in range(3):
            s.send("greedy_decoder_stream", [ids_input(grpcclient, [1])])
            s.until_final()
    finally:
        s.close()
    with urllib.request.urlopen(f"http://{dsrv.metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    fam = {f.name: f for f in text_string_to_metric_families(text)}["nv_inference_first_response_histogram_ms"]
    assert fam.type == "histogram"
    samples = {(x.name, x.labels.get("model"), x.labels.get("le")): x.value for x in fam.samples}
    assert samples[("nv_inference_first_response_histogram_ms_count", "greedy_decoder_stream", None)] >= 3
    assert samples[("nv_inference_first_response_histogram_ms_bucket", "greedy_decoder_stream", "100")] >= 3
    assert samples[("nv_inference_first_response_histogram_ms_bucket", "greedy_decoder_stream", "+Inf")] >= 3
    assert {m for _, m, _ in samples} <= {"greedy_decoder_stream", "stream_count", "stream_python", "stream_js", "stream_c", "decoupled_ensemble"}


def test_a_request_the_plugin_never_answers_still_ends(dsrv):
    """A decoupled plugin that never takes a request's sender: the stream
    still ends with the final flag (nobody waits forever)."""
    s = Stream(dsrv)
    try:
        s.send("stream_count", [count_input(grpcclient, 3)], parameters={"ignore": True}, enable_empty_final_response=True)
        assert outs(s.until_final()) == [None]
    finally:
        s.close(cancel=True)
    status, _, text = post(dsrv, "/v2/models/stream_count/generate_stream", {"COUNT": 3, "ignore": True})
    assert status == 200 and text == ""
