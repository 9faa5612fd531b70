"""System shared memory end to end with tritonclient.utils.shared_memory
(HTTP and gRPC), --allow-client-shm gating, and CUDA shared memory refusing
cleanly where CUDA is absent."""

import base64
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

ROW = 16 * 4  # one INT32 row of the `simple` model




def _inputs(mod, a_region, a_off, b_region, b_off):
    ins = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    ins[0].set_shared_memory(a_region, ROW, offset=a_off)
    ins[1].set_shared_memory(b_region, ROW, offset=b_off)
    return ins


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_inputs_and_outputs_through_regions(shm_server, regions, proto):
    mod = httpclient if proto == "http" else grpcclient
    c = (
        httpclient.InferenceServerClient(shm_server.url)
        if proto == "http"
        else grpcclient.InferenceServerClient(shm_server.grpc_url)
    )
    in_name, in_key, in_h = regions(3 * ROW)
    out_name, out_key, out_h = regions(2 * ROW + 32)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 5, dtype=np.int32)
    # INPUT0 at offset 0, INPUT1 at offset 2*ROW of the same object.
    shm.set_shared_memory_region(in_h, [a])
    shm.set_shared_memory_region(in_h, [b], offset=2 * ROW)
    c.register_system_shared_memory(in_name, in_key, 3 * ROW)
    # The output region starts 32 bytes into its object.
    c.register_system_shared_memory(out_name, out_key, 2 * ROW, offset=32)
    try:
        status = c.get_system_shared_memory_status(in_name)
        if proto == "http":
            assert status == [{"name": in_name, "key": in_key, "offset": 0, "byte_size": 3 * ROW}]
        else:
            assert status.regions[in_name].byte_size == 3 * ROW
        outs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
        outs[0].set_shared_memory(out_name, ROW)
        outs[1].set_shared_memory(out_name, ROW, offset=ROW)
        r = c.infer("simple", _inputs(mod, in_name, 0, in_name, 2 * ROW), outputs=outs)
        o0 = r.get_output("OUTPUT0")
        # As in Triton: an output in shared memory has no data and no parameters in the
        # response (Triton's C++ HTTP client rejects `parameters` without `binary_data_size`).
        if proto == "http":
            assert set(o0) == {"name", "datatype", "shape"}, o0
        else:
            assert not o0.parameters and r.get_response().raw_output_contents[0] == b""
        assert list(o0["shape"] if proto == "http" else o0.shape) == [1, 16]
        got0 = shm.get_contents_as_numpy(out_h, np.int32, [1, 16], offset=32)
        got1 = shm.get_contents_as_numpy(out_h, np.int32, [1, 16], offset=32 + ROW)
        np.testing.assert_array_equal(got0, a + b)
        np.testing.assert_array_equal(got1, a - b)
    finally:
        c.unregister_system_shared_memory(in_name)
        c.unregister_system_shared_memory(out_name)
    assert (c.get_system_shared_memory_status() == []) if proto == "http" else not c.get_system_shared_memory_status().regions


def test_grpc_mixes_shared_memory_and_raw_inputs(shm_server, regions):
    c = grpcclient.InferenceServerClient(shm_server.grpc_url)
    name, key, h = regions(ROW)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    shm.set_shared_memory_region(h, [a])
    c.register_system_shared_memory(name, key, ROW)
    try:
        ins = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        ins[0].set_shared_memory(name, ROW)
        ins[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        r = c.infer("simple", ins)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + 1)
    finally:
        c.unregister_system_shared_memory(name)


def test_bad_regions_offsets_and_sizes(shm_server, regions):
    c = httpclient.InferenceServerClient(shm_server.url)
    g = grpcclient.InferenceServerClient(shm_server.grpc_url)
    name, key, h = regions(2 * ROW)
    # Region larger than the object, missing object, duplicate name.
    with pytest.raises(InferenceServerException, match="outside shm object"):
        c.register_system_shared_memory("too_big", key, 4 * ROW)
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
        c.register_system_shared_memory("missing", "/tern_no_such_object", 8)
    c.register_system_shared_memory(name, key, 2 * ROW)
    try:
        with pytest.raises(InferenceServerException, match="already in manager") as e:
            c.register_system_shared_memory(name, key, ROW)
        assert e.value.status() == "400"  # Triton's HttpCodeFromError: ALREADY_EXISTS -> 400
        with pytest.raises(InferenceServerException, match="already in manager") as e:
            g.register_system_shared_memory(name, key, ROW)
        assert e.value.status() == "StatusCode.ALREADY_EXISTS"
        # Tensor outside the region: offset + size past the end.
        for client, mod in ((c, httpclient), (g, grpcclient)):
            with pytest.raises(InferenceServerException, match="Invalid offset \\+ byte size for shared memory region") as e:
                client.infer("simple", _inputs(mod, name, 0, name, 2 * ROW - 8))
            with pytest.raises(InferenceServerException, match="Unable to find shared memory region"):
                client.infer("simple", _inputs(mod, name, 0, "nope", 0))
        # Output region too small for the result.
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(name, 8)
        with pytest.raises(InferenceServerException, match="should be at least 64 bytes"):
            c.infer("simple", _inputs(httpclient, name, 0, name, ROW), outputs=[out])
        with pytest.raises(InferenceServerException, match="Unable to find system shared memory region"):
            c.get_system_shared_memory_status("nope")
        # Still serving after all that.
        assert c.is_model_ready("simple")
    finally:
        c.unregister_system_shared_memory(name)


def test_unregister_during_traffic(shm_server, regions):
    c = httpclient.InferenceServerClient(shm_server.url, concurrency=8)
    name, key, h = regions(2 * ROW)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    shm.set_shared_memory_region(h, [a, a])
    c.register_system_shared_memory(name, key, 2 * ROW)
    outcomes = {"ok": 0, "gone": 0, "other": []}
    lock = threading.Lock()
    stop = threading.Event()

    def traffic():
        cc = httpclient.InferenceServerClient(shm_server.url)
        while not stop.is_set():
            try:
                r = cc.infer("simple", _inputs(httpclient, name, 0, name, ROW))
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + a)
                with lock:
                    outcomes["ok"] += 1
            except InferenceServerException as e:
                with lock:
                    if "Unable to find shared memory region" in str(e):
                        outcomes["gone"] += 1
                    else:
                        outcomes["other"].append(str(e))

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for t in threads:
        t.start()
    import time

    time.sleep(0.5)
    c.unregister_system_shared_memory(name)
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join()
    assert outcomes["ok"] > 0 and outcomes["gone"] > 0, outcomes
    assert not outcomes["other"], outcomes["other"][:3]
    assert c.is_server_live()


def test_off_by_default_and_cuda_unsupported(server, shm_server):
    c = httpclient.InferenceServerClient(server.url)
    # Off: the status calls report no regions; registering is refused.
    assert c.get_system_shared_memory_status() == []
    with pytest.raises(InferenceServerException, match="--allow-client-shm") as e:
        c.register_system_shared_memory("r", "/x", 8)
    assert e.value.status() == "501"
    g = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="--allow-client-shm") as e:
        g.register_system_shared_memory("r", "/x", 8)
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    # Shared-memory parameters in an inference request are refused the same way.
    with pytest.raises(InferenceServerException, match="--allow-client-shm"):
        c.infer("simple", _inputs(httpclient, "r", 0, "r", 0))
    # CUDA shared memory without a GPU: a clear UNSUPPORTED, even when shm is allowed.
    import ctypes.util

    if ctypes.util.find_library("cuda"):
        return  # a CUDA driver is present: tests/gpu/ covers CUDA shared memory
    s = httpclient.InferenceServerClient(shm_server.url)
    handle = base64.b64encode(bytes(64)).decode()
    with pytest.raises(InferenceServerException, match="needs CUDA") as e:
        s.register_cuda_shared_memory("gpu_region", handle, 0, 64)
    assert e.value.status() == "501"
    assert s.get_cuda_shared_memory_status() == []
