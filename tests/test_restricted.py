"""Restricted APIs on both frontends (`--http-restricted-api`,
`--grpc-restricted-protocol`): every endpoint of a restricted category,
streams included, needs the header; the others stay open."""

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from test_grpc import simple_inputs
from test_http import raw


@pytest.fixture
def restricted(start_tern, good_repo):
    return start_tern(
        [
            f"--model-repository={good_repo}",
            "--http-restricted-api=inference,model-config:infer-key=s3cret",
            "--http-restricted-api=model-repository,statistics,logging:admin-key=adm",
            "--grpc-restricted-protocol=inference,model-config:infer-key=s3cret",
            "--grpc-restricted-protocol=health:hk=1",
        ]
    )


def test_http_restricted_categories(restricted):
    s = restricted
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    status, _, data = raw(s, "POST", "/v2/models/identity_fp32/infer", body)
    assert status == 403 and json.loads(data)["error"] == "This API is restricted, expecting header 'infer-key'"
    assert raw(s, "POST", "/v2/models/identity_fp32/infer", body, {"infer-key": "wrong"})[0] == 403
    assert raw(s, "POST", "/v2/models/identity_fp32/versions/1/infer", body, {"Infer-Key": "s3cret"})[0] == 200
    assert raw(s, "GET", "/v2/models/simple/config")[0] == 403
    assert raw(s, "GET", "/v2/models/simple/config", headers={"infer-key": "s3cret"})[0] == 200
    for path, method in [("/v2/repository/index", "POST"), ("/v2/models/stats", "GET"), ("/v2/models/simple/stats", "GET"), ("/v2/logging", "GET")]:
        assert raw(s, method, path)[0] == 403, path
        assert raw(s, method, path, headers={"admin-key": "adm"})[0] == 200, path
    # Unrestricted categories stay open.
    for path in ["/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/simple", "/v2/models/simple/ready"]:
        assert raw(s, "GET", path)[0] == 200, path
    c = httpclient.InferenceServerClient(s.url)
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        c.infer("identity_fp32", [inp])
    assert "expecting header 'infer-key'" in e.value.message()
    assert c.infer("identity_fp32", [inp], headers={"infer-key": "s3cret"}).as_numpy("OUTPUT0").shape == (1, 2)


def test_grpc_restricted_categories(restricted):
    c = grpcclient.InferenceServerClient(restricted.grpc_url)
    a = np.ones((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as e:
        c.infer("simple", simple_inputs(a, a))
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert e.value.message() == "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
    # As in Triton, gRPC metadata carries the key with the `triton-grpc-protocol-` prefix.
    with pytest.raises(InferenceServerException):
        c.infer("simple", simple_inputs(a, a), headers={"infer-key": "s3cret"})
    r = c.infer("simple", simple_inputs(a, a), headers={"triton-grpc-protocol-infer-key": "s3cret"})
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a * 2)
    with pytest.raises(InferenceServerException):
        c.get_model_config("simple")
    assert c.get_model_config("simple", headers={"triton-grpc-protocol-infer-key": "s3cret"}).config.name == "simple"
    with pytest.raises(InferenceServerException):
        c.is_server_live()
    assert c.is_server_live(headers={"triton-grpc-protocol-hk": "1"})
    # Not restricted on gRPC (only on HTTP): statistics and the repository index.
    assert c.get_inference_statistics("simple") is not None
    # Streams are checked too.
    results = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    # The server refuses the stream as soon as it opens, so either call may already see it.
    try:
        c.async_stream_infer("simple", simple_inputs(a, a))
        c.stop_stream()
    except InferenceServerException:
        pass
    result, error = results.get(timeout=10)
    assert result is None and "restricted" in str(error)
    c.close()
    c = grpcclient.InferenceServerClient(restricted.grpc_url)
    results = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)), headers={"triton-grpc-protocol-infer-key": "s3cret"})
    c.async_stream_infer("simple", simple_inputs(a, a))
    c.stop_stream()
    result, error = results.get(timeout=10)
    assert error is None
    c.close()


def test_bad_restriction_flags(tmp_path, good_repo):
    from conftest import Tern

    t = Tern([f"--model-repository={good_repo}", "--http-restricted-api=bogus:a=b"], wait_ready=False)
    assert t.wait(60) != 0 and "unknown restricted api 'bogus'" in t.log()
    t = Tern([f"--model-repository={good_repo}", "--grpc-restricted-protocol=health:a=b", "--grpc-restricted-protocol=health:c=d"], wait_ready=False)
    assert t.wait(60) != 0 and "restricted protocol 'health' can not be specified in multiple config groups" in t.log()
