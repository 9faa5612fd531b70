"""Bad input gets the right status and a clear message, and the server keeps serving."""

import gzip
import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from test_http import infer_simple, raw


def body(inputs, outputs=None):
    b = {"inputs": inputs}
    if outputs is not None:
        b["outputs"] = outputs
    return json.dumps(b).encode()


def simple_inputs(shape0=(1, 16), data0=None, dtype0="INT32"):
    n0 = int(np.prod(shape0))
    return [
        {"name": "INPUT0", "shape": list(shape0), "datatype": dtype0, "data": data0 if data0 is not None else [1] * n0},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
    ]


CASES = [
    ("malformed json", "/v2/models/simple/infer", b'{"inputs": [', {}, 400, "failed to parse the request JSON"),
    ("wrong dtype", "/v2/models/simple/infer", body(simple_inputs(dtype0="FP32")), {}, 400, "unexpected datatype TYPE_FP32 for inference input 'INPUT0', expecting TYPE_INT32 for model 'simple'"),
    ("wrong shape", "/v2/models/simple/infer", body(simple_inputs(shape0=(1, 15))), {}, 400, "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,15]"),
    ("data shorter than shape", "/v2/models/simple/infer", body(simple_inputs(data0=[1] * 15)), {}, 400, "shape [1,16] has 16 element(s) but 'data' has 15"),
    ("data longer than shape", "/v2/models/simple/infer", body(simple_inputs(data0=[1] * 17)), {}, 400, "but 'data' has 17"),
    ("missing input", "/v2/models/simple/infer", body(simple_inputs()[:1]), {}, 400, "missing required input(s) ['INPUT1']"),
    ("unknown input", "/v2/models/simple/infer", body(simple_inputs() + [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]), {}, 400, "unexpected inference input 'X' for model 'simple'"),
    ("unknown output", "/v2/models/simple/infer", body(simple_inputs(), [{"name": "NOPE"}]), {}, 400, "unexpected inference output 'NOPE' for model 'simple'"),
    ("unknown model", "/v2/models/nope/infer", body(simple_inputs()), {}, 404, "Request for unknown model: 'nope' is not found"),
    ("unknown version", "/v2/models/simple/versions/9/infer", body(simple_inputs()), {}, 404, "'simple' version 9 is not found"),
    ("bad version", "/v2/models/simple/versions/x/infer", body(simple_inputs()), {}, 400, "'x' is not a valid model version"),
    ("batch over max", "/v2/models/simple/infer", json.dumps({"inputs": [{"name": n, "shape": [9, 16], "datatype": "INT32", "data": [1] * 144} for n in ("INPUT0", "INPUT1")]}).encode(), {}, 400, "batch-size must be <= 8"),
    # As Triton: a model with no ready version is "unknown" (404), with the load error after Triton's words.
    ("failed model", "/v2/models/gpu_only/infer", body([{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]), {}, 404, "Request for unknown model: 'gpu_only' has no available versions (model 'gpu_only': instance_group"),
    ("oversized body", "/v2/models/simple/infer", b" " * (1024 * 1024 + 1), {}, 400, "exceeds the maximum input size"),
    ("oversized after gzip", "/v2/models/simple/infer", gzip.compress(b" " * (2 * 1024 * 1024)), {"Content-Encoding": "gzip"}, 400, "exceeds the maximum input size"),
    ("garbage gzip", "/v2/models/simple/infer", b"not gzip at all", {"Content-Encoding": "gzip"}, 400, "failed to decompress"),
    ("unknown encoding", "/v2/models/simple/infer", body(simple_inputs()), {"Content-Encoding": "br"}, 501, "unsupported Content-Encoding 'br'"),
    ("non-numeric header length", "/v2/models/simple/infer", body(simple_inputs()), {"Inference-Header-Content-Length": "abc"}, 400, "must be a non-negative integer"),
    ("lying header length (too long)", "/v2/models/simple/infer", body(simple_inputs()), {"Inference-Header-Content-Length": "100000"}, 400, "larger than the request body"),
    ("lying header length (too short)", "/v2/models/simple/infer", body(simple_inputs()), {"Inference-Header-Content-Length": "10"}, 400, "failed to parse the request JSON"),
    ("shape whose size overflows", "/v2/models/identity_fp32/infer", body([{"name": "INPUT0", "shape": [8, 2**61], "datatype": "FP32", "data": []}]), {}, 400, "shape [8,2305843009213693952] is too large"),
    ("shape whose byte size overflows", "/v2/models/identity_fp32/infer", body([{"name": "INPUT0", "shape": [1, 2**62], "datatype": "FP32", "data": []}]), {}, 400, "is too large"),
    ("bad dtype name", "/v2/models/simple/infer", body([{"name": "INPUT0", "shape": [1], "datatype": "FLOAT", "data": [1]}]), {}, 400, "unknown datatype 'FLOAT'"),
    ("int out of range", "/v2/models/identity_int8/infer", body([{"name": "INPUT0", "shape": [1, 1], "datatype": "INT8", "data": [300]}]), {}, 400, "300 is not a valid INT8 value"),
    ("classification of strings", "/v2/models/identity_bytes/infer", body([{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}], [{"name": "OUTPUT0", "parameters": {"classification": 1}}]), {}, 400, "not numeric"),
]


@pytest.mark.parametrize("name,path,payload,headers,status,message", CASES, ids=[c[0] for c in CASES])
def test_bad_requests(server, client, name, path, payload, headers, status, message):
    got_status, got_message = raw_error(server, path, payload, headers)
    assert got_status == status, got_message
    assert message in got_message
    # The server keeps serving.
    a = np.ones((1, 16), dtype=np.int32)
    np.testing.assert_array_equal(infer_simple(client, a, a).as_numpy("OUTPUT0"), a * 2)


def raw_error(server, path, payload, headers):
    status, resp_headers, data = raw(server, "POST", path, payload, headers)
    assert resp_headers.get("content-type", resp_headers.get("Content-Type")) == "application/json"
    return status, json.loads(data)["error"]


def test_truncated_binary_part(server):
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}).encode()
    status, message = raw_error(server, "/v2/models/identity_fp32/infer", header + b"\0" * 10, {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "unexpected size for input 'INPUT0', expecting 16 additional bytes for model 'identity_fp32'" in message


def test_binary_size_disagrees_with_shape(server):
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 12}}]}).encode()
    status, message = raw_error(server, "/v2/models/identity_fp32/infer", header + b"\0" * 12, {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "unexpected total byte size 12 for input 'INPUT0', expecting 16" in message


def test_truncated_bytes_element(server):
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}]}).encode()
    payload = header + (10).to_bytes(4, "little") + b"ab"
    status, message = raw_error(server, "/v2/models/identity_bytes/infer", payload, {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "claims 10 byte(s)" in message


def test_unknown_routes_and_methods(server):
    status, _, data = raw(server, "GET", "/v2/nothing/here")
    assert status == 404 and "error" in json.loads(data)
    status, _, _ = raw(server, "GET", "/v2/models/simple/infer")
    assert status == 405
    status, _, _ = raw(server, "DELETE", "/v2/health/live")
    assert status == 405


def test_inference_paths_answer_alike(server):
    """Inference requests skip the router unless a path segment is percent-escaped; both
    ways give the same answers, and near-miss paths are still unknown."""
    payload = body(simple_inputs())
    headers = lambda r: {k.lower(): v for k, v in r[1].items() if k.lower() in ("content-type", "content-length")}
    plain = raw(server, "POST", "/v2/models/simple/infer", payload)
    assert plain[0] == 200
    for path in ("/v2/models/simple/versions/1/infer", "/v2/models/%73imple/infer", "/v2/models/simple/versions/%31/infer"):
        r = raw(server, "POST", path, payload)
        assert (r[0], headers(r), r[2]) == (200, headers(plain), plain[2]), path
    for fast, routed in (("/v2/models/simple/versions/x/infer", "/v2/models/%73imple/versions/x/infer"), ("/v2/models/nope/infer", "/v2/models/n%6Fpe/infer")):
        a, b = raw(server, "POST", fast, payload), raw(server, "POST", routed, payload)
        assert a[0] in (400, 404) and (a[0], headers(a), a[2]) == (b[0], headers(b), b[2]), (fast, a, b)
    for path in ("/v2/models/simple/infer/", "/v2/models/simple/versions/1/2/infer", "//v2/models/simple/infer", "/v2/models/simple/version/1/infer"):
        assert raw(server, "POST", path, payload)[0] == 404, path


def test_tritonclient_sees_clear_errors(client):
    a = np.ones((1, 15), dtype=np.int32)
    with pytest.raises(InferenceServerException) as e:
        infer_simple(client, a, a)
    assert e.value.status() == "400"
    assert "Expected [-1,16], got [1,15]" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_config("nope")
    assert e.value.status() == "404"


def test_repository_index_reports_failures(server):
    status, _, data = raw(server, "POST", "/v2/repository/index", b"{}")
    assert status == 200
    rows = {(r["name"], r.get("version")): r for r in json.loads(data)}
    assert rows[("simple", "1")]["state"] == "READY"
    broken = rows[("broken_config", None)]
    assert broken["state"] == "UNAVAILABLE" and "max_batch_sise" in broken["reason"]
    # What a person sees for a typo: where it is and the name meant.
    assert "failed to parse config.pbtxt at line 2, column 1: field 'max_batch_sise' not found" in broken["reason"]
    assert broken["reason"].endswith("(did you mean 'max_batch_size'?)"), broken["reason"]
    assert rows[("broken_onnx", None)]["state"] == "UNAVAILABLE"
    assert "KIND_GPU" in rows[("gpu_only", "1")]["reason"]
    status, _, data = raw(server, "POST", "/v2/repository/index", b'{"ready": true}')
    assert all(r["state"] == "READY" for r in json.loads(data))
