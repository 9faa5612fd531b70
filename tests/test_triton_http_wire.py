"""Triton's HTTP wire behaviour in the request/response codec, against the
built binary: NaN and infinities in JSON, the nesting limit of `data`, the
chunk limit of chunked bodies, the raw binary request form, and Triton's
error texts."""

import http.client
import json
import os
import socket

import numpy as np
import pytest
import tritonclient.http as httpclient

from test_http import raw


def post(server, path, body, headers=None):
    status, resp_headers, data = raw(server, "POST", path, body, headers)
    return status, resp_headers, data


def error(server, path, body, headers=None):
    status, _, data = post(server, path, body, headers)
    return status, json.loads(data)["error"]


def request(inputs, outputs=None, **extra):
    body = {"inputs": inputs, **extra}
    if outputs is not None:
        body["outputs"] = outputs
    return json.dumps(body).encode()


def assert_alive(server):
    status, _, data = post(server, "/v2/models/identity_int32/infer", request([{"name": "INPUT0", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}]))
    assert status == 200, data
    assert json.loads(data)["outputs"][0]["data"] == [1, 2]


# --- NaN and infinities ----------------------------------------------------------------


@pytest.mark.parametrize("dt,np_type", [("FP32", np.float32), ("FP64", np.float64)])
def test_tritonclient_json_nan_and_infinities_round_trip(client, dt, np_type):
    # tritonclient writes JSON with python-rapidjson: bare NaN, Infinity, -Infinity.
    x = np.array([[np.nan, np.inf, -np.inf, 1.5, -0.0]], dtype=np_type)
    inp = httpclient.InferInput("INPUT0", list(x.shape), dt)
    inp.set_data_from_numpy(x, binary_data=False)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    r = client.infer(f"identity_{dt.lower()}", [inp], outputs=[out])
    assert "data" in r.get_output("OUTPUT0"), "the output came back as JSON"
    got = r.as_numpy("OUTPUT0")
    assert got.dtype == np_type
    np.testing.assert_array_equal(got, x)  # NaN == NaN for assert_array_equal


def test_bare_tokens_in_request_and_response(server):
    body = b'{"parameters":{"p":NaN,"q":-Infinity},"inputs":[{"name":"INPUT0","shape":[1,6],"datatype":"FP32",' \
        b'"parameters":{"r":Inf},"data":[NaN,Inf,-Inf,Infinity,-Infinity,2.5]}],' \
        b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":false}}]}'
    status, headers, data = post(server, "/v2/models/identity_fp32/infer", body)
    assert status == 200, data
    assert headers["content-type"] == "application/json"
    # Written as Triton writes them (rapidjson's kWriteNanAndInfFlag), not as null.
    assert b'"data":[NaN,Infinity,-Infinity,Infinity,-Infinity,2.5]' in data, data
    out = json.loads(data)["outputs"][0]["data"]
    assert np.isnan(out[0]) and out[1:] == [np.inf, -np.inf, np.inf, -np.inf, 2.5]
    # Finite data keeps the plain form.
    status, _, data = post(server, "/v2/models/identity_fp32/infer", request([{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 1]}]))
    assert status == 200 and b'"data":[0.5,1.0]' in data, data


@pytest.mark.parametrize("dt,token,shown", [("INT32", "NaN", "NaN"), ("BOOL", "Infinity", "Infinity"), ("BYTES", "-Inf", "-Infinity")])
def test_bare_tokens_refused_for_other_types(server, dt, token, shown):
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"%s","data":[%s]}]}' % (dt.encode(), token.encode())
    status, message = error(server, f"/v2/models/identity_{dt.lower()}/infer", body)
    assert status == 400
    assert f"{shown} is not a valid {dt} value" in message, message


def test_misspelt_token_is_still_a_parse_error(server):
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[Nan]}]}'
    status, message = error(server, "/v2/models/identity_fp32/infer", body)
    assert status == 400 and message.startswith("failed to parse the request JSON"), message


# --- nesting depth -----------------------------------------------------------------------


def nested(depth):
    return (
        b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":'
        + b"[" * depth + b"7" + b"]" * depth + b"}]}"
    )


def test_data_nesting_depth_limit(server):
    status, _, data = post(server, "/v2/models/identity_fp32/infer", nested(100))
    assert status == 200, data
    assert json.loads(data)["outputs"][0]["data"] == [7.0]
    for depth in (101, 125, 1000):
        status, message = error(server, "/v2/models/identity_fp32/infer", nested(depth))
        assert status == 400
        assert "JSON nesting depth exceeds maximum allowed limit (100)" in message, (depth, message)
    assert_alive(server)


def test_very_deep_bodies_are_refused_not_a_crash(server):
    deep = b"[" * 200_000
    status, message = error(server, "/v2/models/identity_fp32/infer", deep)
    assert status == 400 and "JSON nesting depth exceeds maximum allowed limit (100)" in message, message
    status, message = error(server, "/v2/models/identity_fp32/infer", b'{"unknown":' + b"[" * 200_000)
    assert status == 400, message
    for path in ("/v2/repository/index", "/v2/logging"):
        status, _, _ = post(server, path, deep)
        assert status == 400, path
    assert_alive(server)


# --- chunked bodies ----------------------------------------------------------------------


def post_chunked(server, path, chunks):
    """POSTs `chunks` as one HTTP/1.1 chunk each, written in one go."""
    wire = bytearray(f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode())
    for c in chunks:
        wire += b"%x\r\n%s\r\n" % (len(c), c)
    wire += b"0\r\n\r\n"
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        # No half-close: hyper drops a connection whose read side ends early.
        sock.sendall(wire)
        out = b""
        while part := sock.recv(65536):
            out += part
    head, _, body = out.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    if b"transfer-encoding: chunked" in head.lower():
        decoded, rest = b"", body
        while True:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            decoded, rest = decoded + rest[:n], rest[n + 2:]
        body = decoded
    return status, body


def padded_chunks(payload, count):
    """`payload` padded with spaces to `count` bytes, one byte a chunk."""
    assert len(payload) <= count
    data = payload + b" " * (count - len(payload))
    return [data[i:i + 1] for i in range(count)]


def test_chunked_request_works(server):
    body = request([{"name": "INPUT0", "shape": [1, 3], "datatype": "INT32", "data": [4, 5, 6]}])
    status, data = post_chunked(server, "/v2/models/identity_int32/infer", [body[i:i + 7] for i in range(0, len(body), 7)])
    assert status == 200, data
    assert json.loads(data)["outputs"][0]["data"] == [4, 5, 6]
    # http.client's own chunked encoding, too.
    conn = http.client.HTTPConnection(server.url, timeout=30)
    conn.request("POST", "/v2/models/identity_int32/infer", body=iter([body[:10], body[10:]]), encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["outputs"][0]["data"] == [4, 5, 6]
    conn.close()


def test_chunk_limit(server):
    body = request([{"name": "INPUT0", "shape": [1, 1], "datatype": "INT32", "data": [9]}])
    # At the limit: served.
    status, data = post_chunked(server, "/v2/models/identity_int32/infer", padded_chunks(body, 65536))
    assert status == 200, data
    # Past it: Triton's error, and the server keeps serving.
    status, data = post_chunked(server, "/v2/models/identity_int32/infer", padded_chunks(body, 65536 + 10))
    assert status == 400, data
    message = json.loads(data)["error"]
    assert message.startswith("Chunks in the infer request buffer exceed the limit 65536, got "), message
    assert message.endswith(" chunks") and int(message.split()[-2]) > 65536, message
    assert_alive(server)


# --- raw binary requests ------------------------------------------------------------------

RAW_MODELS = {
    "bytes_one": ("TYPE_STRING", "1", 0),
    "bytes_one_batch": ("TYPE_STRING", "1", 8),
    "bytes_two": ("TYPE_STRING", "2", 0),
    "two_variable": ("TYPE_INT32", "-1, -1", 0),
    "fixed_int32": ("TYPE_INT32", "2, 2", 4),
}


@pytest.fixture(scope="module")
def raw_server(tmp_path_factory):
    from conftest import Tern

    root = tmp_path_factory.mktemp("raw_repo")
    for name, (dtype, dims, max_batch) in RAW_MODELS.items():
        os.makedirs(root / name / "1")
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "identity"\nmax_batch_size: {max_batch}\n'
            f'input [ {{ name: "INPUT0" data_type: {dtype} dims: [ {dims} ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ {dims} ] }} ]\n'
        )
    t = Tern([f"--model-repository={root}"])
    yield t
    t.stop()


RAW = {"Inference-Header-Content-Length": "0"}


def raw_output(server, model, body):
    status, headers, data = post(server, f"/v2/models/{model}/infer", body, RAW)
    assert status == 200, data
    n = int(headers["inference-header-content-length"])
    out = json.loads(data[:n])["outputs"][0]
    assert out["parameters"]["binary_data_size"] == len(data) - n
    return out, data[n:]


@pytest.mark.parametrize("model,shape", [("bytes_one", [1]), ("bytes_one_batch", [1, 1])])
def test_raw_bytes_input_is_the_whole_body(raw_server, model, shape):
    body = b"\x00\xffnot length-prefixed \x01"
    out, data = raw_output(raw_server, model, body)
    assert out["datatype"] == "BYTES" and out["shape"] == shape
    # The one element, as BYTES go on the wire: 4-byte length, then the bytes.
    assert data == len(body).to_bytes(4, "little") + body
    out, data = raw_output(raw_server, model, b"")
    assert data == b"\0\0\0\0"


def test_raw_bytes_needs_shape_one(raw_server, server):
    status, message = error(raw_server, "/v2/models/bytes_two/infer", b"abc", RAW)
    assert status == 400 and message.startswith("For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"), message
    status, message = error(server, "/v2/models/identity_bytes/infer", b"abc", RAW)
    assert status == 400 and message.startswith("For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"), message


def test_raw_shape_deduction(raw_server, server):
    status, message = error(raw_server, "/v2/models/two_variable/infer", b"\0" * 8, RAW)
    assert status == 400
    assert message.startswith("The shape of the raw input 'INPUT0' can not be deduced because there are more than one variable-sized dimension"), message
    status, message = error(server, "/v2/models/simple/infer", b"\0" * 64, RAW)
    assert status == 400
    assert message.startswith("Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'simple' model configuration"), message
    data = np.arange(4, dtype=np.int32).tobytes()
    out, got = raw_output(raw_server, "fixed_int32", data)
    assert out["shape"] == [1, 2, 2] and got == data
    status, message = error(raw_server, "/v2/models/fixed_int32/infer", data[:12], RAW)
    assert status == 400, message
    data = np.arange(5, dtype=np.float64).tobytes()
    out, got = raw_output(server, "identity_fp64", data)
    assert out["shape"] == [1, 5] and got == data


# --- Triton's error texts -----------------------------------------------------------------


def test_data_count_mismatch_text(server):
    status, message = error(server, "/v2/models/identity_int32/infer", request([{"name": "INPUT0", "shape": [1, 3], "datatype": "INT32", "data": [1, 2]}]))
    assert status == 400
    assert message.startswith("Unable to parse 'data': Shape does not match true shape of 'data' field"), message
    assert "shape [1,3] has 3 element(s) but 'data' has 2" in message


def binary_request(inputs):
    header = request(inputs)
    return header, {"Inference-Header-Content-Length": str(len(header))}


def test_binary_size_texts(server):
    header, headers = binary_request([{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}])
    status, message = error(server, "/v2/models/identity_fp32/infer", header + b"\0" * 10, headers)
    assert status == 400
    assert message.startswith("unexpected size for input 'INPUT0', expecting 16 additional bytes for model 'identity_fp32'"), message
    status, message = error(server, "/v2/models/identity_fp32/infer", header + b"\0" * 17, headers)
    assert status == 400
    assert message.startswith("unexpected additional input data for model 'identity_fp32'"), message


@pytest.mark.parametrize("dt", ["FP16", "BF16"])
def test_half_floats_via_json_text(server, dt):
    status, message = error(server, f"/v2/models/identity_{dt.lower()}/infer", request([{"name": "INPUT0", "shape": [1, 1], "datatype": dt, "data": [1.0]}]))
    assert status == 400
    assert message == f"receiving {dt} data via JSON is not supported. Please use the binary data format for input INPUT0", message


def test_no_data_text(server):
    status, message = error(server, "/v2/models/identity_fp32/infer", request([{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32"}]))
    assert status == 400
    assert message.startswith(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But no field is set"
    ), message
