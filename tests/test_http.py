"""End-to-end tests of the HTTP/REST frontend with the real `tritonclient.http`
and raw HTTP against the built binary."""

import concurrent.futures
import gzip
import http.client
import json
import zlib

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

NUMPY_TYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
    "BYTES": np.object_,
}


def sample(dt, shape=(2, 5)):
    n = int(np.prod(shape))
    if dt == "BOOL":
        return (np.arange(n) % 2 == 0).reshape(shape)
    if dt == "BYTES":
        return np.array([f"s{i}-é".encode() for i in range(n)], dtype=np.object_).reshape(shape)
    if dt == "BF16":
        # Values exactly representable in bfloat16.
        return ((np.arange(n, dtype=np.float32) - 3.0) * 0.5).astype(ml_dtypes.bfloat16).reshape(shape)
    t = NUMPY_TYPES[dt]
    if np.issubdtype(t, np.integer):
        info = np.iinfo(t)
        vals = ([int(info.min), int(info.max), 0, 1, 7] * (n // 5 + 1))[:n]
        return np.array(vals, dtype=t).reshape(shape)
    return (np.arange(n) * 1.25 - 2).astype(t).reshape(shape)


def infer_simple(client, a, b, binary=True, **kw):
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "INT32"), httpclient.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    return client.infer("simple", inputs, outputs=outputs, **kw)


def raw(server, method, path, body=b"", headers=None):
    conn = http.client.HTTPConnection(server.url, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), data


def error_of(status_body):
    status, _, body = status_body
    return status, json.loads(body)["error"]


# --- health and metadata -------------------------------------------------------------


def test_health_and_server_metadata(client, server):
    assert client.is_server_live()
    # Broken models are in this repository and strict readiness is on.
    assert not client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "triton" and "tern" in meta["extensions"]
    assert "binary_tensor_data" in meta["extensions"] and "classification" in meta["extensions"]
    assert raw(server, "GET", "/v2/health/live")[0] == 200
    assert raw(server, "GET", "/v2/health/ready")[0] == 400


def test_ready_when_all_models_load(start_tern, good_repo):
    t = start_tern([f"--model-repository={good_repo}"])
    c = httpclient.InferenceServerClient(t.url)
    assert c.is_server_ready()


def test_non_strict_readiness(start_tern, test_repo):
    t = start_tern([f"--model-repository={test_repo}", "--exit-on-error=false", "--strict-readiness=false"])
    assert httpclient.InferenceServerClient(t.url).is_server_ready()


def test_model_metadata_and_config(client):
    meta = client.get_model_metadata("simple")
    assert meta["name"] == "simple"
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
    ]
    cfg = client.get_model_config("simple")
    assert cfg["name"] == "simple" and cfg["max_batch_size"] == 8
    assert cfg["input"][0]["data_type"] == "TYPE_INT32"
    assert cfg["input"][0]["dims"] == [16]
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert cfg["version_policy"] == {"latest": {"num_versions": 1}}
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("gpu_only")
    assert not client.is_model_ready("no_such_model")


# --- inference -------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False])
def test_simple_add_sub(client, binary):
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    r = infer_simple(client, a, b, binary=binary, request_id="req-7")
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    resp = r.get_response()
    assert resp["id"] == "req-7" and resp["model_name"] == "simple" and resp["model_version"] == "1"


def test_requested_output_subset_and_order(client):
    a = np.ones((1, 16), dtype=np.int32)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    r = client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in r.get_response()["outputs"]] == ["OUTPUT1"]
    assert r.as_numpy("OUTPUT0") is None


@pytest.mark.parametrize("dt", list(NUMPY_TYPES))
@pytest.mark.parametrize("backend", ["identity", "onnx_identity"])
@pytest.mark.parametrize("binary", [True, False])
def test_every_dtype(client, dt, backend, binary):
    data = sample(dt)
    inp = httpclient.InferInput("INPUT0", list(data.shape), dt)
    if dt in ("FP16", "BF16") and not binary:
        # As in Triton, FP16/BF16 travel only as binary data.
        inp._datatype = dt
        inp._data = [float(v) for v in data.flatten()]
        inp._raw_data = None
        with pytest.raises(InferenceServerException) as e:
            client.infer(f"{backend}_{dt.lower()}", [inp])
        assert "binary" in e.value.message()
        return
    inp.set_data_from_numpy(data, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    r = client.infer(f"{backend}_{dt.lower()}", [inp], outputs=[out])
    got = r.as_numpy("OUTPUT0")
    assert list(got.shape) == list(data.shape)
    if dt == "BYTES":
        assert [bytes(x) if not isinstance(x, str) else x.encode() for x in got.flatten()] == list(data.flatten())
    else:
        np.testing.assert_array_equal(got.astype(data.dtype), data)


def test_bytes_binary_non_utf8(client):
    data = np.array([[b"\xff\x00raw", b"", b"plain"]], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    # JSON output was asked for, but the bytes are not UTF-8: Tern sends them binary instead.
    r = client.infer("identity_bytes", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    assert list(r.as_numpy("OUTPUT0").flatten()) == list(data.flatten())


def test_string_model(client):
    a = np.array([[str(i) for i in range(16)]], dtype=np.object_)
    b = np.array([["2"] * 16], dtype=np.object_)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "BYTES"), httpclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    r = client.infer("simple_string", inputs)
    assert [int(x) for x in r.as_numpy("OUTPUT0").flatten()] == [i + 2 for i in range(16)]
    assert [int(x) for x in r.as_numpy("OUTPUT1").flatten()] == [i - 2 for i in range(16)]


def test_classification(client):
    data = np.array([[0.1, 0.7, 0.2, 0.05], [0.9, 0.0, 0.3, 0.4]], dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [2, 4], "FP32")
    inp.set_data_from_numpy(data)
    r = client.infer("classifier", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    got = r.as_numpy("OUTPUT0")
    assert got.shape == (2, 2)
    assert [x.decode() for x in got[0]] == ["0.700000:1:dog", "0.200000:2:fox"]
    assert [x.decode() for x in got[1]] == ["0.900000:0:cat", "0.400000:3:owl"]
    # JSON output too.
    r = client.infer("classifier", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False, class_count=1)])
    assert r.get_response()["outputs"][0]["data"] == ["0.700000:1:dog", "0.900000:0:cat"]


@pytest.mark.parametrize("req_alg", [None, "gzip", "deflate"])
@pytest.mark.parametrize("resp_alg", [None, "gzip", "deflate"])
def test_compression(client, req_alg, resp_alg):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = infer_simple(client, a, a, request_compression_algorithm=req_alg, response_compression_algorithm=resp_alg)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a * 2)


def test_compressed_response_headers(server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    status, headers, data = raw(server, "POST", "/v2/models/identity_fp32/infer", gzip.compress(body), {"Content-Encoding": "gzip", "Accept-Encoding": "deflate"})
    assert status == 200 and headers["content-encoding"] == "deflate"
    assert json.loads(zlib.decompress(data))["outputs"][0]["data"] == [1.0, 2.0]


def test_versions(client):
    assert client.is_model_ready("versioned", "2") and client.is_model_ready("versioned", "3")
    assert not client.is_model_ready("versioned", "1")
    assert client.get_model_metadata("versioned")["versions"] == ["2", "3"]
    inp = httpclient.InferInput("INPUT0", [3], "INT32")
    inp.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
    assert client.infer("versioned", [inp]).get_response()["model_version"] == "3"
    assert client.infer("versioned", [inp], model_version="2").get_response()["model_version"] == "2"
    with pytest.raises(InferenceServerException) as e:
        client.infer("versioned", [inp], model_version="1")
    assert e.value.status() == "404"
    assert "version 1" in e.value.message()


def test_auto_completed_model(client):
    cfg = client.get_model_config("simple_autocomplete")
    assert cfg["max_batch_size"] == 4
    assert cfg["platform"] == "onnxruntime_onnx" and cfg["backend"] == "onnxruntime"
    assert cfg["default_model_filename"] == "model.onnx", "as Triton fills it"
    assert "model_transaction_policy" not in cfg
    assert [i["name"] for i in cfg["input"]] == ["INPUT0", "INPUT1"]
    assert cfg["input"][0]["data_type"] == "TYPE_FP32" and cfg["input"][0]["dims"] == [16]
    a = np.random.rand(3, 16).astype(np.float32)
    inputs = [httpclient.InferInput(n, [3, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    r = client.infer("simple_autocomplete", inputs)
    np.testing.assert_allclose(r.as_numpy("OUTPUT0"), a * 2)


def test_non_batching_model_and_optional_input(client):
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    inp = httpclient.InferInput("INPUT0", [2, 3], "INT32")
    inp.set_data_from_numpy(x)
    r = client.infer("nobatch", [inp])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
    assert r.as_numpy("OUTPUT1") is None  # optional input absent, its identity output too


def test_raw_binary_request(server):
    data = np.arange(6, dtype=np.float32).tobytes()
    status, headers, body = raw(server, "POST", "/v2/models/identity_fp32/infer", data, {"Inference-Header-Content-Length": "0"})
    assert status == 200, body
    n = int(headers["inference-header-content-length"])
    meta = json.loads(body[:n])
    assert meta["outputs"][0]["shape"] == [1, 6]
    assert body[n:] == data


def test_concurrent_clients_get_their_own_answers(server):
    def one(i):
        c = httpclient.InferenceServerClient(server.url)
        try:
            a = np.full((1, 16), i, dtype=np.int32)
            b = np.arange(16, dtype=np.int32).reshape(1, 16)
            r = infer_simple(c, a, b, binary=i % 2 == 0, request_id=str(i))
            assert r.get_response()["id"] == str(i)
            return np.array_equal(r.as_numpy("OUTPUT0"), a + b) and np.array_equal(r.as_numpy("OUTPUT1"), a - b)
        finally:
            c.close()

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(200)))
    assert all(results)


def test_async_infer_many_in_flight(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    pending = [client.async_infer("simple", inputs, request_id=str(i)) for i in range(16)]
    for i, p in enumerate(pending):
        r = p.get_result()
        assert r.get_response()["id"] == str(i)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a * 2)


@pytest.mark.parametrize("pool", [32 << 20, 0])
def test_large_tensors_through_the_host_pool(start_tern, test_repo, pool):
    """Bodies that arrive in many frames (joined into the host pool), ONNX inputs handed over in
    place or gathered (gRPC messages have arbitrary alignment), batched rows and outputs shared
    with the response: same answers with the pool on and off, and the pool is empty afterwards."""
    import tritonclient.grpc as grpcclient
    from test_metrics import scrape, value

    t = start_tern([
        f"--model-repository={test_repo}", "--exit-on-error=false",
        "--http-max-input-size=67108864", f"--host-memory-pool-byte-size={pool}",
    ])
    h = httpclient.InferenceServerClient(t.url)
    g = grpcclient.InferenceServerClient(t.grpc_url)
    rng = np.random.default_rng(7)
    try:
        for rows, n in [(1, 1 << 20), (3, 100_003), (2, 5)]:
            x = rng.standard_normal((rows, n)).astype(np.float32)
            for binary in [True, False] if n < 1000 else [True]:
                i = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
                i.set_data_from_numpy(x, binary_data=binary)
                out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
                r = h.infer("onnx_identity_fp32", [i], outputs=[out])
                assert np.array_equal(r.as_numpy("OUTPUT0"), x), (rows, n, binary)
            i = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            assert np.array_equal(g.infer("onnx_identity_fp32", [i]).as_numpy("OUTPUT0"), x), (rows, n)
    finally:
        h.close()
        g.close()
    m = scrape(t)
    assert value(m, "tern_host_memory_pool_total_bytes") == pool
    assert value(m, "tern_host_memory_pool_used_bytes") == 0


def test_stalled_clients_are_disconnected(start_tern, test_repo):
    """--http-read-timeout-secs: unfinished headers close the connection, a
    stalled body gets a 400, idle pooled connections are closed and clients
    reconnect, and the server keeps serving throughout."""
    import socket
    import time

    t = start_tern([f"--model-repository={test_repo}", "--exit-on-error=false", "--http-read-timeout-secs=1"])
    host, port = t.url.split(":")
    c = httpclient.InferenceServerClient(t.url)
    a = np.ones((1, 16), dtype=np.int32)
    np.testing.assert_array_equal(infer_simple(c, a, a).as_numpy("OUTPUT0"), a * 2)

    headers = socket.create_connection((host, int(port)))
    headers.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n")
    body = socket.create_connection((host, int(port)))
    body.sendall(b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"in")
    # Declared over --http-max-input-size: answered at once, without reading the body.
    huge = socket.create_connection((host, int(port)))
    huge.sendall(b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\nxx")
    began = time.time()
    headers.settimeout(10)
    assert headers.recv(100) == b"", "unfinished headers: closed without an answer"

    def answer(sock):
        sock.settimeout(10)
        out = b""
        while chunk := sock.recv(1000):
            out += chunk
        return out

    stalled = answer(body)
    assert stalled.startswith(b"HTTP/1.1 400") and b"the request body stalled: no data for 1 s" in stalled, stalled
    too_big = answer(huge)
    assert too_big.startswith(b"HTTP/1.1 400") and b"request JSON size of 1000000000 bytes exceeds the maximum allowed input size" in too_big, too_big
    assert time.time() - began < 8

    time.sleep(1.5)  # longer than the timeout: the pooled connection was closed while idle
    np.testing.assert_array_equal(infer_simple(c, a, a).as_numpy("OUTPUT0"), a * 2)
