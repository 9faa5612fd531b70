"""Bad input gets the right status and a clear message, and the server keeps serving."""

import gzip
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
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


# `server` runs with --http-max-input-size=1048576.
LIMIT = 1 << 20
TO_RAISE = "Use --http-max-input-size to increase the limit."

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
    # As Triton: an unknown model is not found whatever version was asked for.
    ("unknown model, a version", "/v2/models/nope/versions/3/infer", body(simple_inputs()), {}, 404, "Request for unknown model: 'nope' is not found"),
    ("bad version", "/v2/models/simple/versions/x/infer", body(simple_inputs()), {}, 400, "'x' is not a valid model version"),
    ("batch over max", "/v2/models/simple/infer", json.dumps({"inputs": [{"name": n, "shape": [9, 16], "datatype": "INT32", "data": [1] * 144} for n in ("INPUT0", "INPUT1")]}).encode(), {}, 400, "batch-size must be <= 8"),
    # As Triton: a model with no ready version is "unknown" (404), with the load error after Triton's words.
    ("failed model", "/v2/models/gpu_only/infer", body([{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]), {}, 404, "Request for unknown model: 'gpu_only' has no available versions (model 'gpu_only': instance_group"),
    # The size limits in current Triton's words.
    ("oversized body", "/v2/models/simple/infer", b" " * (LIMIT + 1), {}, 400, f"request JSON size of {LIMIT + 1} bytes exceeds the maximum allowed input size of {LIMIT} bytes. {TO_RAISE}"),
    ("oversized JSON on another endpoint", "/v2/repository/index", b" " * (LIMIT + 1), {}, 400, f"request JSON size of {LIMIT + 1} bytes exceeds the maximum allowed input size of {LIMIT} bytes. {TO_RAISE}"),
    ("oversized JSON header", "/v2/models/simple/infer", b" " * (LIMIT + 10), {"Inference-Header-Content-Length": str(LIMIT + 1)}, 400, f"request JSON size of {LIMIT + 1} bytes exceeds the maximum allowed input size of {LIMIT} bytes. {TO_RAISE}"),
    ("oversized raw body", "/v2/models/identity_fp32/infer", b"\0" * (LIMIT + 4), {"Inference-Header-Content-Length": "0"}, 400, f"Raw input has a byte_size ({LIMIT + 4} bytes) that exceeds the maximum allowed value of {LIMIT} bytes. {TO_RAISE}"),
    ("oversized after gzip", "/v2/models/simple/infer", gzip.compress(b" " * (2 * LIMIT)), {"Content-Encoding": "gzip"}, 400, f"Decompressed data size exceeds the maximum allowed value of {LIMIT} bytes. {TO_RAISE}"),
    ("garbage gzip", "/v2/models/simple/infer", b"not gzip at all", {"Content-Encoding": "gzip"}, 400, "failed to decompress"),
    ("unknown encoding", "/v2/models/simple/infer", body(simple_inputs()), {"Content-Encoding": "br"}, 501, "unsupported Content-Encoding 'br'"),
    ("non-numeric header length", "/v2/models/simple/infer", body(simple_inputs()), {"Inference-Header-Content-Length": "abc"}, 400, "Unable to parse Inference-Header-Content-Length, got: abc"),
    ("negative header length", "/v2/models/simple/infer", body(simple_inputs()), {"Inference-Header-Content-Length": "-5"}, 400, f"inference header size should be in range (0, {len(body(simple_inputs()))}), got: -5"),
    ("lying header length (too long)", "/v2/models/simple/infer", body(simple_inputs()), {"Inference-Header-Content-Length": "100000"}, 400, f"inference header size should be in range (0, {len(body(simple_inputs()))}), got: 100000"),
    ("lying header length (too short)", "/v2/models/simple/infer", body(simple_inputs()), {"Inference-Header-Content-Length": "10"}, 400, "failed to parse the request JSON"),
    # Shapes as current Triton's HTTP frontend reads them: unsigned dims, its own texts for JSON data.
    ("negative dim", "/v2/models/identity_fp32/infer", body([{"name": "INPUT0", "shape": [1, -4], "datatype": "FP32", "data": [1]}]), {}, 500, "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("dim of 2^63", "/v2/models/identity_fp32/infer", body([{"name": "INPUT0", "shape": [2**63, 1], "datatype": "FP32", "data": [1]}]), {}, 400, "invalid shape for input 'INPUT0': shape [-9223372036854775808,1] contains one or more invalid dimensions"),
    ("shape whose size overflows", "/v2/models/identity_fp32/infer", body([{"name": "INPUT0", "shape": [8, 2**61], "datatype": "FP32", "data": []}]), {}, 400, "invalid shape for input 'INPUT0': shape [8,2305843009213693952] causes total element count to exceed maximum size of 9223372036854775807"),
    ("shape whose byte size overflows", "/v2/models/identity_fp32/infer", body([{"name": "INPUT0", "shape": [1, 2**62], "datatype": "FP32", "data": []}]), {}, 400, "byte size overflow for input 'INPUT0': element count (4611686018427387904) * data type size (4) exceeds maximum allowed size (9223372036854775807)"),
    # The same request twice in a row: Triton's core texts, with its request-id prefix.
    ("input given twice", "/v2/models/simple/infer", body(simple_inputs() + simple_inputs()[1:]), {}, 400, "[request id: <id_unknown>] input 'INPUT1' already exists in request"),
    ("output requested twice", "/v2/models/simple/infer", body(simple_inputs(), [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]), {}, 400, "[request id: <id_unknown>] output 'OUTPUT0' already exists in request"),
    ("output requested twice, with an id", "/v2/models/simple/infer", json.dumps({"id": "r9", "inputs": simple_inputs(), "outputs": [{"name": "OUTPUT1"}, {"name": "OUTPUT1"}]}).encode(), {}, 400, "[request id: r9] output 'OUTPUT1' already exists in request"),
    ("bad dtype name", "/v2/models/simple/infer", body([{"name": "INPUT0", "shape": [1], "datatype": "FLOAT", "data": [1]}]), {}, 400, "unknown datatype 'FLOAT'"),
    ("int out of range", "/v2/models/identity_int8/infer", body([{"name": "INPUT0", "shape": [1, 1], "datatype": "INT8", "data": [300]}]), {}, 400, "300 is not a valid INT8 value"),
    ("classification of strings", "/v2/models/identity_bytes/infer", body([{"name": "INPUT0", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}], [{"name": "OUTPUT0", "parameters": {"classification": 1}}]), {}, 400, "not numeric"),
]


@pytest.mark.parametrize("name,path,payload,headers,status,message", CASES, ids=[c[0] for c in CASES])
def test_bad_requests(server, client, name, path, payload, headers, status, message):
    got_status, got_message = raw_error(server, path, payload, headers)
    assert got_status == status, got_message
    assert message in got_message, got_message
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
    assert status == 400 and message == "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. Expected 16, got 12", message


def test_binary_data_after_the_json_header_is_not_bounded_by_the_input_size_limit(server):
    """As in Triton, --http-max-input-size (1 MiB here) bounds the JSON header, not
    the binary tensors after it: a 2 MiB binary tensor is served."""
    c = httpclient.InferenceServerClient(server.url)
    x = np.arange(2 * LIMIT // 4, dtype=np.float32).reshape(1, -1)
    i = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=True)
    r = c.infer("identity_fp32", [i], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
    # Not as JSON: then the body is all JSON, and over the limit.
    i.set_data_from_numpy(x, binary_data=False)
    with pytest.raises(InferenceServerException) as e:
        c.infer("identity_fp32", [i])
    assert e.value.status() == "400" and "exceeds the maximum allowed input size of 1048576 bytes" in e.value.message()
    c.close()


def test_grpc_shapes_and_duplicates_get_tritons_core_texts(server):
    g = grpcclient.InferenceServerClient(server.grpc_url)

    def error(inputs, outputs=None, request_id=""):
        with pytest.raises(InferenceServerException) as e:
            g.infer("identity_fp32", inputs, outputs=outputs, request_id=request_id)
        return e.value.status(), e.value.message()

    def fp32(shape, n):
        i = grpcclient.InferInput("INPUT0", [1, n], "FP32")
        i.set_data_from_numpy(np.zeros((1, n), dtype=np.float32))
        del i._get_tensor().shape[:]
        i._get_tensor().shape.extend(shape)
        return i

    assert error([fp32([-2, -2], 4)]) == ("StatusCode.INVALID_ARGUMENT", "tensor 'INPUT0' contains an invalid dimension [-2,-2]")
    assert error([fp32([1, 2**62], 4)]) == ("StatusCode.INVALID_ARGUMENT", "byte size for tensor 'INPUT0' exceeds maximum size of 9223372036854775807")
    assert error([fp32([1, 4], 2)]) == (
        "StatusCode.INVALID_ARGUMENT",
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. Expected 16, got 8",
    )
    outs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT0")]
    assert error([fp32([1, 4], 4)], outs, request_id="g1") == ("StatusCode.INVALID_ARGUMENT", "[request id: g1] output 'OUTPUT0' already exists in request")
    g.close()


def test_log_file_cannot_be_set_over_the_network(server):
    """Any log_file, even the current "", is UNSUPPORTED (HTTP 501, gRPC UNIMPLEMENTED)
    in Triton's words, before the other settings are applied."""
    text = "log file location can not be updated through network protocol"
    before = json.loads(raw(server, "GET", "/v2/logging")[2])
    for value in ["", "/tmp/x.log", 5]:
        status, message = raw_error(server, "/v2/logging", json.dumps({"log_verbose_level": before["log_verbose_level"] + 1, "log_file": value}).encode(), {})
        assert (status, message) == (501, text), value
    assert json.loads(raw(server, "GET", "/v2/logging")[2]) == before
    # A null value is no change, for log_file as for every setting (Triton's HTTP handler).
    status, _, got = raw(server, "POST", "/v2/logging", json.dumps({"log_file": None, "log_info": None}).encode())
    assert status == 200 and json.loads(got) == before
    g = grpcclient.InferenceServerClient(server.grpc_url)
    for settings in ({"log_file": "", "log_info": True}, {"log_file": None}):
        with pytest.raises(InferenceServerException) as e:
            g.update_log_settings(settings)
        assert (e.value.status(), e.value.message()) == ("StatusCode.UNIMPLEMENTED", text), settings
    g.close()


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_shared_memory_errors_as_current_triton(shm_server, regions, proto):
    """Key checks before the name, missing objects INTERNAL, names taken ALREADY_EXISTS
    (HTTP 400), unknown regions NOT_FOUND, output regions too small INTERNAL."""
    if proto == "http":
        c = httpclient.InferenceServerClient(shm_server.url)
        mod, status = httpclient, {"invalid": "400", "internal": "500", "exists": "400", "not_found": "404"}
    else:
        c = grpcclient.InferenceServerClient(shm_server.grpc_url)
        mod = grpcclient
        status = {"invalid": "StatusCode.INVALID_ARGUMENT", "internal": "StatusCode.INTERNAL", "exists": "StatusCode.ALREADY_EXISTS", "not_found": "StatusCode.NOT_FOUND"}

    def error(call):
        with pytest.raises(InferenceServerException) as e:
            call()
        return e.value.status(), e.value.message()

    name, key, h = regions(2 * 64)
    missing = "/tern_missing_object_for_errors"
    assert error(lambda: c.register_system_shared_memory("m", missing, 8)) == (status["internal"], f"Unable to open shared memory region: '{missing}'")
    for bad in ["/", "///"]:
        assert error(lambda: c.register_system_shared_memory("m", bad, 8)) == (status["invalid"], f"cannot register shared memory region 'm' - invalid shm key '{bad}'")
    reserved = "/triton_python_backend_shm_region_1"
    assert error(lambda: c.register_system_shared_memory("m", reserved, 8)) == (
        status["invalid"],
        f"cannot register shared memory region 'm' with key '{reserved}' as the key contains the reserved prefix 'triton_python_backend_shm_region_'",
    )
    c.register_system_shared_memory(name, key, 2 * 64)
    try:
        assert error(lambda: c.register_system_shared_memory(name, key, 64)) == (status["exists"], f"shared memory region '{name}' already in manager")
        # The key is checked first: a taken name with a bad key gets the key's error.
        assert error(lambda: c.register_system_shared_memory(name, "/", 64))[0] == status["invalid"]

        def inputs(region, offset, size=64):
            ins = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
            ins[0].set_shared_memory(name, 64)
            ins[1].set_shared_memory(region, size, offset=offset)
            return ins

        assert error(lambda: c.infer("simple", inputs("nope", 0))) == (status["not_found"], "Unable to find shared memory region: 'nope'")
        assert error(lambda: c.infer("simple", inputs(name, 128))) == (status["invalid"], f"Invalid offset for shared memory region: '{name}'")
        assert error(lambda: c.infer("simple", inputs(name, 100))) == (status["invalid"], f"Invalid offset + byte size for shared memory region: '{name}'")
        assert error(lambda: c.infer("simple", inputs(name, 0, 32))) == (
            status["invalid"],
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 32",
        )
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(name, 8)
        assert error(lambda: c.infer("simple", inputs(name, 0), outputs=[out])) == (
            status["internal"],
            "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be at least 64 bytes to hold the results",
        )
    finally:
        c.unregister_system_shared_memory(name)


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
