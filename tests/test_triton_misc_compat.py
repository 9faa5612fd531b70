"""Triton compatibility details that scripts and clients match on: the order
of Prometheus labels, the `triton-grpc-protocol-` prefix of restricted gRPC
metadata and the restriction flags' errors, client shared memory switched
off (status calls report nothing, the rest is refused), and the texts of
Triton's shared_memory_manager.cc errors."""

import json
import re
import shutil
import urllib.request
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import Tern, gen_models
from test_http import raw

ROW = 16 * 4  # one INT32 row of the `simple` model
DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


def simple_inputs(mod, a, b):
    ins = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    return ins


def shm_inputs(mod, a_region, a_off, b_region, b_off):
    ins = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    ins[0].set_shared_memory(a_region, ROW, offset=a_off)
    ins[1].set_shared_memory(b_region, ROW, offset=b_off)
    return ins


# --- 1. Prometheus labels in prometheus-cpp's order -----------------------------------


@pytest.fixture(scope="module")
def labels_repo(tmp_path_factory):
    """simple, plus an identity model with metric_tags (labelled `_<key>`, sorted before `model`)."""
    root = str(tmp_path_factory.mktemp("labels") / "models")
    gen_models.example(root)
    for name in ("tiny_lm", "simple_string", "simple_autocomplete"):
        shutil.rmtree(f"{root}/{name}")
    gen_models.write(
        f"{root}/tagged/config.pbtxt",
        gen_models.io_config(
            "tagged",
            "TYPE_FP32",
            [-1],
            8,
            "identity",
            'metric_tags { key: "zone" value: "z1" }\nmetric_tags { key: "area" value: "a1" }',
        ),
    )
    gen_models.write(f"{root}/tagged/1/.gitkeep", "")
    return root


LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def sample_label_names(text):
    """(line, [label names in printed order]) of every sample line with labels."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        inner = line[line.index("{") + 1 : line.rindex("}")]
        out.append((line, [m.group(1) for m in LABEL.finditer(inner)]))
    return out


def test_metric_labels_are_sorted_like_triton(start_tern, labels_repo):
    t = start_tern(
        [
            f"--model-repository={labels_repo}",
            "--metrics-config=summary_latencies=true",
            "--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01",
        ]
    )
    c = httpclient.InferenceServerClient(t.url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    c.infer("simple", simple_inputs(httpclient, a, a))
    x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    c.infer("tagged", [x])
    with urllib.request.urlopen(f"http://{t.metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    lines = set(text.splitlines())
    # The exact lines Triton prints (prometheus-cpp keeps labels in a sorted map).
    assert 'nv_inference_request_success{model="simple",version="1"} 1' in lines, text
    assert 'nv_inference_count{model="simple",version="1"} 1' in lines
    assert 'nv_inference_request_failure{model="simple",reason="REJECTED",version="1"} 0' in lines
    # metric_tags become `_<key>` labels (Triton's GetMetricLabels), sorted before `model`.
    assert 'nv_inference_request_success{_area="a1",_zone="z1",model="tagged",version="1"} 1' in lines, text
    assert any(
        line.startswith('nv_inference_request_summary_us{model="simple",version="1",quantile="0.5"} ')
        for line in lines
    ), text
    # Every labelled sample of every family: names sorted, a summary's quantile
    # (or a histogram's le) last, as prometheus-cpp appends it.
    checked = 0
    for line, names in sample_label_names(text):
        trailing = [n for n in names if n in ("le", "quantile")]
        own = [n for n in names if n not in ("le", "quantile")]
        assert own == sorted(own) and names == own + trailing, line
        checked += 1
    assert checked > 20


# --- 2. Restricted gRPC protocols: Triton's metadata prefix and flag errors ------------


def test_grpc_restricted_protocol_needs_prefixed_metadata(start_tern, good_repo):
    t = start_tern(
        [
            f"--model-repository={good_repo}",
            "--grpc-restricted-protocol=inference:infer-key=secret",
            "--http-restricted-api=inference:infer-key=secret",
        ]
    )
    g = grpcclient.InferenceServerClient(t.grpc_url)
    a = np.ones((1, 16), dtype=np.int32)
    expected = "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
    for headers in (None, {"infer-key": "secret"}, {"triton-grpc-protocol-infer-key": "wrong"}):
        with pytest.raises(InferenceServerException) as e:
            g.infer("simple", simple_inputs(grpcclient, a, a), headers=headers)
        assert e.value.status() == "StatusCode.UNAVAILABLE", headers
        assert e.value.message() == expected, headers
    r = g.infer("simple", simple_inputs(grpcclient, a, a), headers={"triton-grpc-protocol-infer-key": "secret"})
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a * 2)
    # Other categories stay open.
    assert g.is_server_live()
    # HTTP uses the key as given.
    body = json.dumps(
        {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16} for n in ("INPUT0", "INPUT1")]}
    )
    path = "/v2/models/simple/infer"
    status, _, data = raw(t, "POST", path, body)
    assert status == 403
    assert json.loads(data) == {"error": "This API is restricted, expecting header 'infer-key'"}
    assert raw(t, "POST", path, body, {"triton-grpc-protocol-infer-key": "secret"})[0] == 403
    assert raw(t, "POST", path, body, {"infer-key": "secret"})[0] == 200


@pytest.mark.parametrize(
    "flag,feature",
    [("--http-restricted-api", "api"), ("--grpc-restricted-protocol", "protocol")],
)
def test_restriction_flag_errors_use_tritons_words(good_repo, flag, feature):
    t = Tern(
        [f"--model-repository={good_repo}", f"{flag}=model-repository,health:k1=v1", f"{flag}=metadata,health:k2=v2"],
        wait_ready=False,
    )
    assert t.wait(60) != 0
    assert f"restricted {feature} 'health' can not be specified in multiple config groups" in t.log()
    t = Tern([f"--model-repository={good_repo}", f"{flag}=model-reposit,health:k1=v1"], wait_ready=False)
    assert t.wait(60) != 0
    assert f"unknown restricted {feature} 'model-reposit' " in t.log()


# --- 3. Client shared memory off (the default) ----------------------------------------


def test_shm_disabled_status_is_empty_and_the_rest_refused(server):
    def call(method, path, body=None):
        status, _, data = raw(server, method, path, json.dumps(body).encode() if body else b"")
        return status, json.loads(data)

    for kind in ("systemsharedmemory", "cudasharedmemory"):
        assert call("GET", f"/v2/{kind}/status") == (200, []), kind
        assert call("POST", f"/v2/{kind}/unregister") == (501, {"error": DISABLED}), kind
    assert call("GET", "/v2/systemsharedmemory/region/r/status")[1] == {
        "error": "Unable to find system shared memory region: 'r'"
    }
    assert call("GET", "/v2/cudasharedmemory/region/r/status")[1] == {
        "error": "Unable to find cuda shared memory region: 'r'"
    }
    reg = {"key": "/r", "offset": 0, "byte_size": 8}
    assert call("POST", "/v2/systemsharedmemory/region/r/register", reg) == (501, {"error": DISABLED})
    reg = {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8}
    assert call("POST", "/v2/cudasharedmemory/region/r/register", reg) == (501, {"error": DISABLED})

    c = httpclient.InferenceServerClient(server.url)
    assert c.get_system_shared_memory_status() == []
    assert c.get_cuda_shared_memory_status() == []
    with pytest.raises(InferenceServerException) as e:
        c.register_system_shared_memory("r", "/r", 8)
    assert e.value.message() == DISABLED
    with pytest.raises(InferenceServerException) as e:
        c.unregister_system_shared_memory("r")
    assert e.value.message() == DISABLED

    g = grpcclient.InferenceServerClient(server.grpc_url)
    assert len(g.get_system_shared_memory_status().regions) == 0
    assert len(g.get_cuda_shared_memory_status().regions) == 0
    for call in (
        lambda: g.register_system_shared_memory("r", "/r", 8),
        lambda: g.register_cuda_shared_memory("r", b"\0" * 64, 0, 8),
        lambda: g.unregister_system_shared_memory(),
        lambda: g.unregister_cuda_shared_memory("r"),
    ):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.message() == DISABLED
    # Using a region in a request fails clearly too.
    for client, mod in ((c, httpclient), (g, grpcclient)):
        with pytest.raises(InferenceServerException) as e:
            client.infer("simple", shm_inputs(mod, "r", 0, "r", 0))
        assert DISABLED in e.value.message()


# --- 4. Shared-memory errors in Triton's words -----------------------------------------




@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_shm_errors_use_tritons_words(shm_server, regions, proto):
    mod = httpclient if proto == "http" else grpcclient
    c = httpclient.InferenceServerClient(shm_server.url) if proto == "http" else grpcclient.InferenceServerClient(shm_server.grpc_url)

    def error(call):
        with pytest.raises(InferenceServerException) as e:
            call()
        return e.value.message()

    missing = f"/tern_missing_{uuid.uuid4().hex[:8]}"
    assert error(lambda: c.register_system_shared_memory("m", missing, 8)).startswith(
        f"Unable to open shared memory region: '{missing}'"
    )
    name, key, h = regions(2 * ROW)
    assert error(lambda: c.register_system_shared_memory("too_big", key, 4 * ROW)).startswith(
        "failed to register shared memory region 'too_big': invalid args"
    )
    c.register_system_shared_memory(name, key, 2 * ROW)
    try:
        assert error(lambda: c.register_system_shared_memory(name, key, ROW)) == f"shared memory region '{name}' already in manager"
        assert error(lambda: c.get_system_shared_memory_status("nope")) == "Unable to find system shared memory region: 'nope'"
        assert error(lambda: c.get_cuda_shared_memory_status("nope")) == "Unable to find cuda shared memory region: 'nope'"
        # Unregistering an unknown name succeeds silently, as in Triton.
        c.unregister_system_shared_memory("nope")
        c.unregister_cuda_shared_memory("nope")
        # Tensors outside the region.
        msg = error(lambda: c.infer("simple", shm_inputs(mod, name, 0, name, 2 * ROW)))
        assert msg.startswith(f"Invalid offset for shared memory region: '{name}'"), msg
        msg = error(lambda: c.infer("simple", shm_inputs(mod, name, 0, name, 2 * ROW - 8)))
        assert msg.startswith(f"Invalid offset + byte size for shared memory region: '{name}'"), msg
        msg = error(lambda: c.infer("simple", shm_inputs(mod, name, 0, "nope", 0)))
        assert msg.startswith("Unable to find shared memory region: 'nope'"), msg
        # An output region too small for the result.
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        shm.set_shared_memory_region(h, [a, a])
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(name, 8)
        msg = error(lambda: c.infer("simple", shm_inputs(mod, name, 0, name, ROW), outputs=[out]))
        assert msg.startswith(
            "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) "
            "should be at least 64 bytes to hold the results"
        ), msg
        # Still serving, and the region still works.
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(name, ROW, offset=ROW)
        c.infer("simple", shm_inputs(mod, name, 0, name, 0), outputs=[out])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(h, np.int32, [1, 16], offset=ROW), a + a)
    finally:
        c.unregister_system_shared_memory(name)
