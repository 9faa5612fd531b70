"""Seeded request fuzzing: thousands of malformed and edge-case inference
requests over HTTP and gRPC. Every one must get an answer with a clear
status and message, nothing may panic, and the server must keep serving.

Found before it existed: shapes whose size overflowed (wrapped to 0 and
matched an empty tensor), NUL bytes in ONNX strings (500 and a failed
batch), KIND_GPU loads answered 500."""

import json
import os
import random
import socket
import http.client

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc as pbg

# Model -> inputs (name, datatype, shape) of a valid request.
MODELS = {
    "simple": [("INPUT0", "INT32", [1, 16]), ("INPUT1", "INT32", [1, 16])],
    "simple_string": [("INPUT0", "BYTES", [1, 16]), ("INPUT1", "BYTES", [1, 16])],
    "identity_fp32": [("INPUT0", "FP32", [1, 5])],
    "identity_bool": [("INPUT0", "BOOL", [2, 3])],
    "onnx_identity_bytes": [("INPUT0", "BYTES", [1, 3])],
    "onnx_identity_fp16": [("INPUT0", "FP16", [1, 4])],
    "tiny_lm": [("input_ids", "INT64", [1, 5])],
    "classifier": [("INPUT0", "FP32", [1, 4])],
}
SIZES = {"BOOL": 1, "FP16": 2, "INT32": 4, "FP32": 4, "INT64": 8}
DTYPES = ["BOOL", "UINT8", "INT32", "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES", "FLOAT", ""]
# Errors ONNX Runtime raises for values it cannot compute with (tiny_lm's
# token ids out of its vocabulary, simple_string's non-numeric strings): a
# 500 with ORT's reason, as Triton answers.
# 500s Triton answers too: the model's own failures, a JSON shape that is not
# unsigned integers, an output shared-memory region too small for the output.
MODEL_ERRORS = ("onnx runtime error", "Unable to parse 'shape'", "shared memory size specified with the request")


def odd(rng):
    return rng.choice([None, True, -1, 0, 2**63, 1.5, "x", "", [], {}, [1, [2]], {"a": 1}, "\u00e9"])


def elements(rng, dt, n):
    if dt == "BYTES":
        return [rng.choice(["hello", "", "\u00fc", "7", "a" * rng.randint(0, 40)]) for _ in range(n)]
    if dt == "BOOL":
        return [rng.random() < 0.5 for _ in range(n)]
    if dt.startswith("FP"):
        return [rng.uniform(-5, 5) for _ in range(n)]
    return [rng.randint(0, 30) for _ in range(n)]


def http_request(rng, models=MODELS):
    """(model, body, headers): a valid request with one to three mutations."""
    model = rng.choice(list(models))
    body, binary = {"inputs": []}, b""
    for name, dt, shape in models[model]:
        t = {"name": name, "datatype": dt, "shape": list(shape)}
        n = int(np.prod(shape))
        if dt != "BYTES" and rng.random() < 0.3:
            raw = bytes(rng.randrange(256) for _ in range(n * SIZES[dt]))
            t["parameters"], binary = {"binary_data_size": len(raw)}, binary + raw
        else:
            t["data"] = elements(rng, dt, n)
        body["inputs"].append(t)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(16)
        if not body["inputs"] or rng.random() < 0.02:
            body["inputs"] = odd(rng)
            break
        t = rng.choice(body["inputs"])
        if op == 0:
            t["shape"] = rng.choice([[], [0], [1, 16, 1], [-1, 4], [8, 2**61], [1, 2**62], [2**31] * 3, "16", [None]])
        elif op == 1:
            t["datatype"] = rng.choice(DTYPES)
        elif op == 2 and "data" in t:
            t["data"] = odd(rng)
        elif op == 3 and isinstance(t.get("data"), list) and t["data"]:
            t["data"][rng.randrange(len(t["data"]))] = odd(rng)
        elif op == 4:
            t["name"] = rng.choice(["", "NOPE", "\u00e9"])
        elif op == 5:
            body["inputs"].append(dict(t))
        elif op == 6:
            body["inputs"].pop()
        elif op == 7:
            t.pop(rng.choice(["name", "datatype", "shape", "data"]), None)
        elif op == 8:
            t["parameters"] = {"binary_data_size": odd(rng)}
        elif op == 9:
            body["outputs"] = [{"name": rng.choice(["OUTPUT0", "NOPE", "logits"]), "parameters": {rng.choice(["binary_data", "classification"]): odd(rng)}}]
            if rng.random() < 0.5:
                body["outputs"][0]["parameters"] = {"shared_memory_region": "r", "shared_memory_byte_size": rng.choice([1, 64, 4096, 5000]), "shared_memory_offset": rng.choice([0, 4000, 4096])}
        elif op == 10:
            body["parameters"] = {rng.choice(["binary_data_output", "priority", "timeout", "sequence_id"]): odd(rng)}
        elif op == 11 and isinstance(t.get("data"), list) and t["data"] and t.get("datatype") == "BYTES":
            t["data"][0] = rng.choice(["a\u0000b", "\u0000"])
        elif op == 12 and "data" in t:
            t["data"] = [t["data"]]
        elif op == 13:
            binary = binary[: rng.randrange(len(binary) + 1)]
        elif op == 14:
            binary += b"\0" * rng.randint(1, 9)
        else:
            t["parameters"] = {
                "shared_memory_region": rng.choice(["r", "r", "nope"]),
                "shared_memory_byte_size": rng.choice([odd(rng), 0, 16, 24, 4096, 5000]),
                "shared_memory_offset": rng.choice([odd(rng), 0, 8, 4090, 2**63 - 1]),
            }
    header = json.dumps(body).encode()
    headers = {"Content-Type": "application/octet-stream"}
    if binary or rng.random() < 0.1:
        headers["Inference-Header-Content-Length"] = str(rng.choice([len(header)] * 5 + [0, len(header) + 10, "abc"]))
    payload = header + binary
    if rng.random() < 0.05:
        payload = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    return model, payload, headers


def check_error_body(status, data, where):
    err = json.loads(data).get("error")
    assert isinstance(err, str) and err, f"{where}: {status} without an error message: {data[:200]!r}"
    return err


def check_success(data, headers, where):
    """A 200's outputs hold exactly as many elements as their shapes say."""
    if headers.get("Inference-Header-Content-Length") is not None or not data.startswith(b"{"):
        return
    try:
        body = json.loads(data)
    except ValueError:
        return  # binary outputs follow the JSON header
    for out in body["outputs"]:
        if "data" in out:
            assert len(out["data"]) == int(np.prod(out["shape"], dtype=object)), f"{where}: {out}"


@pytest.fixture(scope="module")
def fuzz_server(test_repo):
    """A server of its own (the fuzz would skew other tests' statistics) with
    a 4 KiB system shared-memory region "r" that requests may name."""
    import tritonclient.utils.shared_memory as shm
    from conftest import Tern

    t = Tern([f"--model-repository={test_repo}", "--exit-on-error=false", "--http-max-input-size=1048576", "--allow-client-shm=true"])
    region = register_region(t, "a")
    yield t
    t.stop()
    shm.destroy_shared_memory_region(region)


def register_region(t, suffix):
    """Registers a 4 KiB system shared-memory region "r" that requests may name."""
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    key = f"/tern_fuzz_{os.getpid()}_{suffix}"
    region = shm.create_shared_memory_region("r", key, 4096)
    httpclient.InferenceServerClient(t.url).register_system_shared_memory("r", key, 4096)
    return region


def still_serving(t):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(t.url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = httpclient.InferInput(name, [1, 16], "INT32")
        i.set_data_from_numpy(a)
        inputs.append(i)
    np.testing.assert_array_equal(c.infer("simple", inputs).as_numpy("OUTPUT0"), a * 2)
    assert "panicked" not in t.log()


def http_fuzz(t, seed, count, models=MODELS):
    """Sends `count` fuzzed requests; returns how many got each status."""
    rng = random.Random(seed)
    host, port = t.url.rsplit(":", 1)
    seen = {}
    for i in range(count):
        model, payload, headers = http_request(rng, models)
        where = f"seed {seed} request {i} ({model}): {payload[:300]!r} {headers}"
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            c.request("POST", f"/v2/models/{model}/infer", body=payload, headers=headers)
            r = c.getresponse()
            status, data = r.status, r.read()
        except (socket.timeout, ConnectionError) as e:
            pytest.fail(f"{where}: no answer ({e!r})")
        finally:
            c.close()
        seen[status] = seen.get(status, 0) + 1
        if status == 200:
            check_success(data, headers, where)
            continue
        err = check_error_body(status, data, where)
        assert status in (400, 404, 500), f"{where}: {status} {err}"
        if status == 500:
            assert any(m in err for m in MODEL_ERRORS), f"{where}: 500 {err}"
    return seen


@pytest.mark.parametrize("seed", [1, 2])
def test_http_fuzz(fuzz_server, seed):
    seen = http_fuzz(fuzz_server, seed, 1500)
    assert seen.get(200, 0) > 20 and seen.get(400, 0) > 500, seen
    still_serving(fuzz_server)


def grpc_request(rng, models=MODELS):
    model = rng.choice(list(models))
    r = pb.ModelInferRequest(model_name=model)
    raw = rng.random() < 0.6
    for name, dt, shape in models[model]:
        t = r.inputs.add(name=name, datatype=dt, shape=shape)
        n = int(np.prod(shape))
        if dt == "BYTES":
            vals = [rng.choice([b"hi", b"", b"\xff\xfe", b"a\x00", b"3"]) for _ in range(n)]
            if raw:
                r.raw_input_contents.append(b"".join(len(v).to_bytes(4, "little") + v for v in vals))
            else:
                t.contents.bytes_contents.extend(vals)
        elif raw or dt == "FP16":
            r.raw_input_contents.append(bytes(rng.randrange(256) for _ in range(n * SIZES[dt])))
        elif dt == "BOOL":
            t.contents.bool_contents.extend([True] * n)
        elif dt == "INT32":
            t.contents.int_contents.extend(elements(rng, dt, n))
        elif dt == "INT64":
            t.contents.int64_contents.extend(elements(rng, dt, n))
        else:
            t.contents.fp32_contents.extend(elements(rng, dt, n))
    for _ in range(rng.randint(1, 3)):
        t = rng.choice(r.inputs) if len(r.inputs) else None
        op = rng.randrange(12)
        if op == 0 and t:
            del t.shape[:]
            t.shape.extend(rng.choice([[], [0], [1, 16, 1], [8, 2**61], [9, 16], [1, 2**40]]))
        elif op == 1 and t:
            t.datatype = rng.choice(DTYPES)
        elif op == 2:
            r.raw_input_contents.append(b"\0" * rng.randint(0, 9))
        elif op == 3 and len(r.raw_input_contents):
            del r.raw_input_contents[-1]
        elif op == 4 and t:
            t.name = rng.choice(["", "NOPE"])
        elif op == 5 and t:
            t.contents.int_contents.extend([1, 2, 3])
        elif op == 6 and t:
            t.parameters["shared_memory_region"].string_param = rng.choice(["r", "nope"])
            t.parameters[rng.choice(["shared_memory_byte_size", "shared_memory_offset"])].int64_param = rng.choice([-1, 0, 8, 20, 4096, 2**62])
        elif op == 7:
            r.parameters[rng.choice(["priority", "timeout", "sequence_id", "x"])].string_param = "x"
        elif op == 8:
            o = r.outputs.add(name=rng.choice(["OUTPUT0", "NOPE", ""]))
            if rng.random() < 0.5:
                o.parameters["classification"].int64_param = rng.choice([-2, 0, 3, 2**62])
            else:
                o.parameters["shared_memory_region"].string_param = "r"
                o.parameters["shared_memory_byte_size"].int64_param = rng.choice([1, 64, 4096, 4097])
        elif op == 9 and t:
            r.inputs.add().CopyFrom(t)
        elif op == 10 and len(r.inputs):
            del r.inputs[-1]
        elif op == 11 and len(r.raw_input_contents):
            r.raw_input_contents[0] = r.raw_input_contents[0][:-1]
    return r


def grpc_fuzz(t, seed, count, models=MODELS):
    """Sends `count` fuzzed unary requests and a stream of 300; returns how many got each code."""
    rng = random.Random(seed)
    seen = {}
    with grpc.insecure_channel(t.grpc_url) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        for i in range(count):
            req = grpc_request(rng, models)
            where = f"seed {seed} request {i}: {str(req)[:400]}"
            try:
                stub.ModelInfer(req, timeout=30)
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
                assert e.details(), f"{where}: {code} without a message"
                assert code in ("INVALID_ARGUMENT", "NOT_FOUND", "INTERNAL"), f"{where}: {code} {e.details()}"
                if code == "INTERNAL":
                    assert any(m in e.details() for m in MODEL_ERRORS), f"{where}: {e.details()}"
            seen[code] = seen.get(code, 0) + 1
        # A stream of the same mix: every request gets exactly one answer.
        reqs = [grpc_request(rng, models) for _ in range(300)]
        answers = list(stub.ModelStreamInfer(iter(reqs), timeout=60))
        assert len(answers) == len(reqs)
    return seen


@pytest.mark.parametrize("seed", [1, 2])
def test_grpc_fuzz(fuzz_server, seed):
    seen = grpc_fuzz(fuzz_server, seed, 1500)
    assert seen.get("OK", 0) > 20 and seen.get("INVALID_ARGUMENT", 0) > 500, seen
    still_serving(fuzz_server)


# WebAssembly plugins of the example repository (Rust, C, a BLS caller): a
# malformed request must come back as an error from the host or the plugin,
# never a trap or a hang.
PLUGIN_MODELS = {
    "add_sub": [("INPUT0", "FP32", [1, 4]), ("INPUT1", "FP32", [1, 4])],
    "prep_rust": [("INPUT0", "FP32", [1, 4]), ("INPUT1", "FP32", [1, 4]), ("TEXT", "BYTES", [1, 1])],
    "prep_c": [("INPUT0", "FP32", [1, 4]), ("INPUT1", "FP32", [1, 4]), ("TEXT", "BYTES", [1, 1])],
    "bert_tokenizer": [("TEXT", "BYTES", [2, 1])],
    "greedy_decoder": [("input_ids", "INT64", [1, 3])],
}


def test_plugin_fuzz(start_tern, tmp_path):
    from conftest import ROOT

    repo = os.path.join(ROOT, "model_repository")
    if not os.path.exists(os.path.join(repo, "prep_c", "1", "model.wasm")):
        pytest.fail("model_repository plugins are missing; run `make setup`")
    loads = [f"--load-model={m}" for m in (*PLUGIN_MODELS, "tiny_lm", "simple")]
    t = start_tern([f"--model-repository={repo}", "--model-control-mode=explicit", *loads, f"--wasm-cache-dir={tmp_path}", "--allow-client-shm=true"])
    region = register_region(t, "plugins")
    try:
        http_seen = http_fuzz(t, 3, 600, PLUGIN_MODELS)
        grpc_seen = grpc_fuzz(t, 3, 600, PLUGIN_MODELS)
    finally:
        import tritonclient.utils.shared_memory as shm

        shm.destroy_shared_memory_region(region)
    assert http_seen.get(200, 0) > 10 and grpc_seen.get("OK", 0) > 10, (http_seen, grpc_seen)
    still_serving(t)
    assert "trap" not in t.log().lower(), "a plugin trapped on a malformed request"
