"""End-to-end tests of the gRPC frontend with `tritonclient.grpc` (sync,
streaming and asyncio) against the built binary, and HTTP/gRPC consistency."""

import asyncio
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from test_http import NUMPY_TYPES, sample


@pytest.fixture
def gclient(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def simple_inputs(a, b, mod=grpcclient):
    inputs = [mod.InferInput("INPUT0", list(a.shape), "INT32"), mod.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_health_metadata_config(gclient):
    assert gclient.is_server_live()
    assert not gclient.is_server_ready()  # the broken models are in this repository
    meta = gclient.get_server_metadata(as_json=True)
    assert meta["name"] == "triton" and "tern" in meta["extensions"] and "binary_tensor_data" in meta["extensions"]
    m = gclient.get_model_metadata("simple", as_json=True)
    assert m["versions"] == ["1"] and m["platform"] == "onnxruntime_onnx"
    assert m["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": ["-1", "16"]}
    cfg = gclient.get_model_config("simple", as_json=True)["config"]
    assert cfg["name"] == "simple" and cfg["max_batch_size"] == 8 and cfg["input"][0]["data_type"] == "TYPE_INT32"
    assert gclient.is_model_ready("simple") and not gclient.is_model_ready("gpu_only")
    assert gclient.is_model_ready("versioned", "2") and not gclient.is_model_ready("versioned", "1")
    index = {(r["name"], r.get("version", "")): r for r in gclient.get_model_repository_index(as_json=True)["models"]}
    assert index[("simple", "1")]["state"] == "READY"
    assert index[("broken_config", "")]["state"] == "UNAVAILABLE"


def test_simple_infer(gclient):
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 5, dtype=np.int32)
    r = gclient.infer("simple", simple_inputs(a, b), request_id="g1")
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    resp = r.get_response(as_json=True)
    assert resp["id"] == "g1" and resp["model_version"] == "1"


@pytest.mark.parametrize("dt", list(NUMPY_TYPES))
@pytest.mark.parametrize("backend", ["identity", "onnx_identity"])
def test_every_dtype_raw(gclient, dt, backend):
    data = sample(dt)
    inp = grpcclient.InferInput("INPUT0", list(data.shape), dt)
    inp.set_data_from_numpy(data)  # tritonclient.grpc sends raw_input_contents
    got = gclient.infer(f"{backend}_{dt.lower()}", [inp]).as_numpy("OUTPUT0")
    if dt == "BYTES":
        assert list(got.flatten()) == list(data.flatten())
    else:
        np.testing.assert_array_equal(got.astype(data.dtype), data)


TYPED = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@pytest.mark.parametrize("dt", list(TYPED))
def test_every_dtype_typed_contents(server, dt):
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    import grpc

    data = sample(dt)
    req = service_pb2.ModelInferRequest(model_name=f"identity_{dt.lower()}")
    t = req.inputs.add(name="INPUT0", datatype=dt, shape=list(data.shape))
    values = [bytes(x) for x in data.flatten()] if dt == "BYTES" else data.flatten().tolist()
    getattr(t.contents, TYPED[dt]).extend(values)
    with grpc.insecure_channel(server.grpc_url) as ch:
        resp = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req)
    assert len(resp.raw_output_contents) == 1 and list(resp.outputs[0].shape) == list(data.shape)
    if dt != "BYTES":
        got = np.frombuffer(resp.raw_output_contents[0], dtype=data.dtype).reshape(data.shape)
        np.testing.assert_array_equal(got, data)


def test_errors_and_codes(server, gclient):
    import grpc

    a = np.ones((1, 15), dtype=np.int32)
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("simple", simple_inputs(a, a))
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,15]" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("nope", simple_inputs(a, a))
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("gpu_only", [])
    assert e.value.status() == "StatusCode.NOT_FOUND", "no ready version: Triton's NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        gclient.load_model("simple")
    assert e.value.status() == "StatusCode.UNAVAILABLE", "model control mode none, as Triton answers"
    assert "explicit model load / unload is not allowed" in e.value.message()
    # Client shared memory is off: no regions to report, and registering is refused.
    assert not gclient.get_system_shared_memory_status().regions
    with pytest.raises(InferenceServerException) as e:
        gclient.register_system_shared_memory("r", "/r", 8)
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    # The server keeps serving.
    b = np.ones((1, 16), dtype=np.int32)
    np.testing.assert_array_equal(gclient.infer("simple", simple_inputs(b, b)).as_numpy("OUTPUT0"), b * 2)


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed"])
def test_shape_whose_size_overflows_is_refused(server, raw):
    """8 * 2^61 elements would wrap to 0 and match an empty tensor."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    import grpc

    req = service_pb2.ModelInferRequest(model_name="identity_fp32")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[8, 2**61])
    if raw:
        req.raw_input_contents.append(b"")
    with grpc.insecure_channel(server.grpc_url) as ch:
        with pytest.raises(grpc.RpcError) as e:
            service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == "byte size for tensor 'INPUT0' exceeds maximum size of 9223372036854775807"


def test_same_answers_and_errors_as_http(server, gclient):
    h = httpclient.InferenceServerClient(server.url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    rg = gclient.infer("simple", simple_inputs(a, a))
    rh = h.infer("simple", simple_inputs(a, a, httpclient))
    np.testing.assert_array_equal(rg.as_numpy("OUTPUT0"), rh.as_numpy("OUTPUT0"))
    bad = np.ones((9, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as eg:
        gclient.infer("simple", simple_inputs(bad, bad))
    with pytest.raises(InferenceServerException) as eh:
        h.infer("simple", simple_inputs(bad, bad, httpclient))
    assert eg.value.message() == eh.value.message()
    c = gclient.infer("classifier", [_classifier_input()], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)])
    assert [x.decode() for x in c.as_numpy("OUTPUT0").flatten()] == ["0.700000:1:dog"]


def _classifier_input():
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.array([[0.1, 0.7, 0.2, 0.0]], dtype=np.float32))
    return inp


@pytest.mark.parametrize("alg", ["gzip", "deflate"])
def test_request_compression(gclient, alg):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = gclient.infer("simple", simple_inputs(a, a), compression_algorithm=alg)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a * 2)


def test_stream_interleaves_good_and_bad_requests(server):
    results = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    good = np.arange(16, dtype=np.int32).reshape(1, 16)
    bad = np.ones((1, 15), dtype=np.int32)
    for i in range(20):
        a = good + i if i % 3 else bad
        c.async_stream_infer("simple", simple_inputs(a, a if i % 3 else bad), request_id=str(i))
    c.stop_stream()  # half-close: waits for every outstanding response
    got = {}
    while not results.empty():
        result, error = results.get()
        if error is None:
            got[result.get_response().id] = result.as_numpy("OUTPUT0")
        else:
            got[f"error{len(got)}"] = error
    assert len(got) == 20
    for i in range(20):
        if i % 3:
            np.testing.assert_array_equal(got[str(i)], (good + i) * 2)
    errors = [v for k, v in got.items() if k.startswith("error")]
    assert len(errors) == 7 and all("unexpected shape" in e.message() for e in errors)
    c.close()


def test_many_concurrent_streams(server):
    def run(n):
        results = queue.Queue()
        c = grpcclient.InferenceServerClient(server.grpc_url)
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        for i in range(10):
            a = np.full((1, 16), n * 100 + i, dtype=np.int32)
            c.async_stream_infer("simple", simple_inputs(a, a), request_id=f"{n}-{i}")
        c.stop_stream()
        ok = 0
        while not results.empty():
            r, e = results.get()
            assert e is None, e
            n_, i = map(int, r.get_response().id.split("-"))
            ok += np.array_equal(r.as_numpy("OUTPUT0"), np.full((1, 16), (n_ * 100 + i) * 2, dtype=np.int32))
        c.close()
        return ok

    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(run, range(8))) == 80


def test_asyncio_client(server):
    async def main():
        c = aioclient.InferenceServerClient(server.grpc_url)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        rs = await asyncio.gather(*[c.infer("simple", simple_inputs(a + i, a, aioclient), request_id=str(i)) for i in range(16)])
        for i, r in enumerate(rs):
            np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), np.full((1, 16), i, dtype=np.int32))
        assert await c.is_server_live()
        await c.close()

    asyncio.run(main())


def test_statistics_and_log_settings(gclient):
    a = np.ones((1, 16), dtype=np.int32)
    gclient.infer("simple", simple_inputs(a, a))
    st = gclient.get_inference_statistics("simple", as_json=True)["model_stats"][0]
    assert st["name"] == "simple" and int(st["inference_count"]) >= 1
    settings = gclient.get_log_settings(as_json=True)["settings"]
    assert settings["log_verbose_level"]["uint32_param"] == 0
    updated = gclient.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
    assert updated["log_verbose_level"]["uint32_param"] == 1
    gclient.update_log_settings({"log_verbose_level": 0})


def test_grpc_health_service(server):
    import grpc

    # grpc.health.v1.Health/Check with an empty HealthCheckRequest; the response is
    # field 1 (status) as a varint: 2 = NOT_SERVING here (broken models, strict readiness).
    with grpc.insecure_channel(server.grpc_url) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda x: x, response_deserializer=lambda x: x)
        assert check(b"") == bytes([0x08, 0x02])


def test_connection_age_and_keepalive_flags(start_tern, good_repo):
    import time

    t = start_tern(
        [
            f"--model-repository={good_repo}",
            "--grpc-max-connection-age=300",
            "--grpc-max-connection-age-grace=100",
            "--grpc-keepalive-time=1000",
            "--grpc-keepalive-timeout=500",
            "--grpc-infer-response-compression-level=high",
        ]
    )
    c = grpcclient.InferenceServerClient(t.grpc_url)
    a = np.ones((1, 16), dtype=np.int32)
    for _ in range(3):
        # The server retires each connection after 300 ms (GOAWAY); the client reconnects.
        np.testing.assert_array_equal(c.infer("simple", simple_inputs(a, a)).as_numpy("OUTPUT0"), a * 2)
        time.sleep(0.5)
    c.close()


def _h2_frames(sock):
    """Reads HTTP/2 frames (type, flags, payload) from `sock` until it closes."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    frames = []
    while len(data) >= 9:
        n = int.from_bytes(data[:3], "big")
        frames.append((data[3], data[4], data[9 : 9 + n]))
        data = data[9 + n :]
    return frames


def _ping_flood(url, pings, timeout=10):
    """Sends the HTTP/2 preface, SETTINGS and `pings` PINGs; returns the frames
    the server sent before closing, or None if it kept the connection open
    for `timeout` seconds."""
    import socket

    host, port = url.split(":")
    s = socket.create_connection((host, int(port)), timeout=timeout)
    settings = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
    ping = bytes([0, 0, 8, 6, 0, 0, 0, 0, 0]) + b"12345678"
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings + ping * pings)
    try:
        return _h2_frames(s)
    except TimeoutError:
        return None
    finally:
        s.close()


def test_client_pinging_too_often_gets_goaway(start_tern, good_repo):
    """gRPC core's strike rules: with no call open (and pings without calls not
    permitted) every ping after the first is a strike; more than
    --grpc-http2-max-ping-strikes (2) closes the connection with
    GOAWAY ENHANCE_YOUR_CALM "too_many_pings"."""
    t = start_tern([f"--model-repository={good_repo}"])
    frames = _ping_flood(t.grpc_url, 4)
    assert frames is not None, "connection was not closed"
    goaway = [f for f in frames if f[0] == 7]
    assert len(goaway) == 1, frames
    assert int.from_bytes(goaway[0][2][4:8], "big") == 0xB  # ENHANCE_YOUR_CALM
    assert goaway[0][2][8:] == b"too_many_pings"
    assert frames[-1][0] == 7, "nothing follows the GOAWAY"
    assert t.wait_log("pinged too often")
    # Three pings (two strikes) are tolerated: the connection stays open.
    assert _ping_flood(t.grpc_url, 3, timeout=1) is None
    # The server keeps serving everyone else.
    c = grpcclient.InferenceServerClient(t.grpc_url)
    a = np.ones((1, 16), dtype=np.int32)
    np.testing.assert_array_equal(c.infer("simple", simple_inputs(a, a)).as_numpy("OUTPUT0"), a * 2)


def test_ping_flags_relax_the_rules(start_tern, good_repo):
    t = start_tern(
        [
            f"--model-repository={good_repo}",
            "--grpc-keepalive-permit-without-calls=true",
            "--grpc-http2-min-recv-ping-interval-without-data=0",
            "--grpc-http2-max-ping-strikes=0",
            "--grpc-http2-max-pings-without-data=0",
        ]
    )
    assert _ping_flood(t.grpc_url, 50, timeout=1) is None
    assert "pinged too often" not in t.log()


def test_tritonclient_keepalive_too_aggressive(start_tern, good_repo):
    """A real gRPC client with a 50 ms keepalive: the server sends GOAWAY
    too_many_pings (the client backs off and reconnects, as with Triton), and
    calls keep working."""
    t = start_tern([f"--model-repository={good_repo}"])
    opts = grpcclient.KeepAliveOptions(keepalive_time_ms=50, keepalive_timeout_ms=1000, keepalive_permit_without_calls=True, http2_max_pings_without_data=0)
    c = grpcclient.InferenceServerClient(t.grpc_url, keepalive_options=opts)
    a = np.ones((1, 16), dtype=np.int32)
    np.testing.assert_array_equal(c.infer("simple", simple_inputs(a, a)).as_numpy("OUTPUT0"), a * 2)
    assert t.wait_log("pinged too often")
    np.testing.assert_array_equal(c.infer("simple", simple_inputs(a, a)).as_numpy("OUTPUT0"), a * 2)
    c.close()


def make_certs(d):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, via openssl."""
    import subprocess

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=tern-test-ca", "-keyout", "ca.key", "-out", "ca.pem")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-extfile", "san.cnf", "-out", f"{name}.pem")
    return {n: str(d / n) for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


def test_tls_and_mutual_tls(start_tern, good_repo, tmp_path):
    certs = make_certs(tmp_path)
    a = np.ones((1, 16), dtype=np.int32)
    tls = [f"--grpc-server-cert={certs['server.pem']}", f"--grpc-server-key={certs['server.key']}"]
    t = start_tern([f"--model-repository={good_repo}", "--grpc-use-ssl=true", *tls])
    c = grpcclient.InferenceServerClient(t.grpc_url, ssl=True, root_certificates=certs["ca.pem"])
    np.testing.assert_array_equal(c.infer("simple", simple_inputs(a, a)).as_numpy("OUTPUT0"), a * 2)
    c.close()
    plain = grpcclient.InferenceServerClient(t.grpc_url)
    with pytest.raises(InferenceServerException):
        plain.is_server_live()
    plain.close()

    m = start_tern([f"--model-repository={good_repo}", "--grpc-use-ssl-mutual=true", *tls, f"--grpc-root-cert={certs['ca.pem']}"])
    c = grpcclient.InferenceServerClient(
        m.grpc_url, ssl=True, root_certificates=certs["ca.pem"], private_key=certs["client.key"], certificate_chain=certs["client.pem"]
    )
    assert c.is_server_live()
    c.close()
    anonymous = grpcclient.InferenceServerClient(m.grpc_url, ssl=True, root_certificates=certs["ca.pem"])
    with pytest.raises(InferenceServerException):
        anonymous.is_server_live()
    anonymous.close()


def test_bad_tls_material_fails_startup(good_repo, tmp_path):
    from conftest import Tern

    (tmp_path / "bad.pem").write_text("not a certificate")
    t = Tern(
        [f"--model-repository={good_repo}", "--grpc-use-ssl", f"--grpc-server-cert={tmp_path / 'bad.pem'}", f"--grpc-server-key={tmp_path / 'bad.pem'}"],
        wait_ready=False,
    )
    assert t.wait(60) != 0
    assert "gRPC TLS configuration" in t.log()
    t = Tern([f"--model-repository={good_repo}", "--grpc-use-ssl"], wait_ready=False)
    assert t.wait(60) != 0
    assert "TLS for gRPC needs --grpc-server-cert" in t.log()


def test_silent_connections_are_closed(server, gclient):
    """A plaintext connection that never sends the HTTP/2 preface (or only part
    of it) is closed after the handshake timeout (10 s) instead of holding a
    socket forever; everyone else is served meanwhile."""
    import socket
    import time

    host, port = server.grpc_url.split(":")
    silent = socket.create_connection((host, int(port)))
    partial = socket.create_connection((host, int(port)))
    partial.sendall(b"PRI * HTTP/2.0\r\n")
    began = time.time()
    b = np.ones((1, 16), dtype=np.int32)
    np.testing.assert_array_equal(gclient.infer("simple", simple_inputs(b, b)).as_numpy("OUTPUT0"), b * 2)
    for s in (silent, partial):
        s.settimeout(20)
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass  # closed with the partial preface unread: a reset
    assert 9 <= time.time() - began < 15


def test_grpc_message_size_limit_is_configurable(start_tern, good_repo):
    """--grpc-max-message-size (Tern's; Triton fixes it at 2 GiB) refuses a
    larger request with OUT_OF_RANGE (tonic's code for it) before decoding
    it; the server serves smaller ones as before."""
    t = start_tern([f"--model-repository={good_repo}", "--grpc-max-message-size=4096"])
    c = grpcclient.InferenceServerClient(t.grpc_url)
    a = np.ones((1, 16), dtype=np.int32)
    assert c.infer("simple", simple_inputs(a, a)).as_numpy("OUTPUT0").tolist() == (a + a).tolist()
    big = np.ones((1, 4096), dtype=np.int32)
    i = grpcclient.InferInput("INPUT0", [1, 4096], "INT32")
    i.set_data_from_numpy(big)
    j = grpcclient.InferInput("INPUT1", [1, 4096], "INT32")
    j.set_data_from_numpy(big)
    with pytest.raises(InferenceServerException) as e:
        c.infer("simple", [i, j])
    assert "OUT_OF_RANGE" in str(e.value.status()) and "too large" in e.value.message(), e.value
    assert c.is_server_live()
