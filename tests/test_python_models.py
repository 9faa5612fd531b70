"""Triton Python-backend models (`backend: "python"`, `<version>/model.py`)
served as they are by the Python runner, through tritonclient (HTTP and
gRPC): numpy tensors in and out, BYTES as object arrays, sibling modules,
the standard library and `async def execute` on an event loop, BLS calls
(sync and async) and decoupled senders; models that cannot run fail their
own load with a message saying why, runaway models are stopped, and the
rest of the repository keeps serving. The model folders are in
tests/python_models (written in the style of Triton's own Python-backend
tests); the misbehaving ones are written here."""

import importlib.util
import json
import os
import queue
import shutil
import sys
import textwrap
import time
import types

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern, tern_bin

MODELS = os.path.join(ROOT, "tests", "python_models")


def runner():
    path = os.path.join(os.path.dirname(tern_bin()), "python-runner.wasm")
    if not os.path.isfile(path):
        pytest.fail(f"the Python runner is not at {path}: run `make python-runner` (make e2e does)")
    return path


def add_model(root, name, config, model_py, version=1):
    os.makedirs(os.path.join(root, name, str(version)), exist_ok=True)
    with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
        f.write(textwrap.dedent(config))
    with open(os.path.join(root, name, str(version), "model.py"), "w") as f:
        f.write(textwrap.dedent(model_py))


IO = """
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("python") / "models")
    shutil.copytree(MODELS, root)
    add_model(root, "loops", f'name: "loops" backend: "python" {IO} parameters {{ key: "execution_timeout_ms" value {{ string_value: "300" }} }}', """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                while True:
                    pass
    """)
    add_model(root, "hog", f'name: "hog" backend: "python" {IO}', """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                first = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0]
                if first > 1:
                    self.block = bytearray(4 << 30)  # more than a 32-bit sandbox can address
                elif first > 0:
                    self.block = bytearray(1 << 30)  # beyond the 256 MiB max_memory_bytes
                return [pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
    """)
    # Decoupled: IN[0] == 0 keeps its sender (answered later, or never),
    # > 0 hits the memory cap, < 0 answers at once.
    add_model(root, "hog_stream", f'name: "hog_stream" backend: "python" {IO} '
              'model_transaction_policy { decoupled: true }', """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                self.held = []

            def execute(self, requests):
                for r in requests:
                    x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                    sender = r.get_response_sender()
                    if x[0] == 0:
                        self.held.append(sender)
                    elif x[0] > 0:
                        self.block = bytearray(1 << 30)  # beyond the 256 MiB max_memory_bytes
                    else:
                        sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", x)]),
                                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """)
    # Ends its stream, then asks to run again: its stream is over, so it does not.
    add_model(root, "final_then_again", f'name: "final_then_again" backend: "python" {IO} '
              'model_transaction_policy { decoupled: true } sequence_batching { iterative_sequence: true }', """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for r in requests:
                    x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                    r.get_response_sender().send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", x)]),
                                                 flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                return None
    """)
    add_model(root, "bls", f'name: "bls" backend: "python" {IO}', """
        import asyncio

        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            async def execute(self, requests):
                responses = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                    # Triton's keywords for a BLS request, with the caller's trace.
                    call = pb_utils.InferenceRequest(
                        model_name="add_sub",
                        inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", np.ones(4, dtype=np.float32))],
                        requested_output_names=["OUTPUT0"], trace=request.trace(), timeout=10_000_000,
                        preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
                        parameters='{"origin": "bls"}')
                    assert request.trace().get_context() is None
                    sync = call.exec()
                    both = await asyncio.gather(call.async_exec(), call.async_exec())
                    if sync.has_error():
                        raise pb_utils.TritonModelException(sync.error().message())
                    total = pb_utils.get_output_tensor_by_name(sync, "OUTPUT0").as_numpy()
                    for r in both:
                        total = total + pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()
                    responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", total)]))
                return responses
    """)
    # Triton's qa/python_models/multi_file, and a package beside model.py.
    add_model(root, "multi_file", f'name: "multi_file" backend: "python" {IO}', """
        import file1
        from . import file2
        from .helpers import offset

        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def initialize(self, args):
                if file1.FILE_NAME != "FILE1" or file2.FILE_NAME != "FILE2":
                    raise pb_utils.TritonModelException("Imports do not work")

            def execute(self, requests):
                return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                    "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + offset())]) for r in requests]
    """)
    version = os.path.join(root, "multi_file", "1")
    for name, text in {"file1.py": 'FILE_NAME = "FILE1"\n', "file2.py": 'FILE_NAME = "FILE2"\n',
                       "helpers/__init__.py": "from .values import offset\n",
                       "helpers/values.py": "from .. import file1\n\ndef offset():\n    return len(file1.FILE_NAME)\n"}.items():
        os.makedirs(os.path.dirname(os.path.join(version, name)), exist_ok=True)
        with open(os.path.join(version, name), "w") as f:
            f.write(text)
    # A BLS request of a sequence: what the called model sees.
    add_model(root, "sequence_info", """
        name: "sequence_info" backend: "python"
        sequence_batching { }
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 2 ] } ]
    """, """
        import numpy as np
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                    "OUT", np.array([r.correlation_id(), r.flags()], dtype=np.int64))]) for r in requests]
    """)
    add_model(root, "bls_sequence", """
        name: "bls_sequence" backend: "python"
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 2 ] } ]
    """, """
        import triton_python_backend_utils as pb_utils
        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    call = pb_utils.InferenceRequest(
                        model_name="sequence_info", inputs=[pb_utils.get_input_tensor_by_name(r, "IN")],
                        requested_output_names=["OUT"], correlation_id=77,
                        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START | pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
                    resp = call.exec()
                    if resp.has_error():
                        raise pb_utils.TritonModelException(resp.error().message())
                    out.append(pb_utils.InferenceResponse(output_tensors=resp.output_tensors()))
                return out
    """)
    add_model(root, "counter", """
        name: "counter" backend: "python"
        model_transaction_policy { decoupled: true }
        input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """, """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    sender = request.get_response_sender()
                    n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                    for i in range(n):
                        sender.send(pb_utils.InferenceResponse(output_tensors=[
                            pb_utils.Tensor("I", np.array([i], dtype=np.int32))]))
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """)
    add_model(root, "completes_forever", """
        name: "completes_forever" backend: "python"
        parameters { key: "execution_timeout_ms" value { string_value: "300" } }
    """, """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                while True:
                    pass
    """)
    add_model(root, "completes_nothing", 'name: "completes_nothing" backend: "python"', """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.set_max_batch_size(4)
    """)
    add_model(root, "starts_thread", 'name: "starts_thread" backend: "python" model_transaction_policy { decoupled: true } ' + IO, """
        import threading

        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    sender = request.get_response_sender()
                    thread = threading.Thread(target=self.respond, args=(sender,))
                    thread.daemon = True
                    thread.start()
                return None

            def respond(self, sender):
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """)
    add_model(root, "runs_subprocess", f'name: "runs_subprocess" backend: "python" {IO}', """
        import subprocess

        class TritonPythonModel:
            def execute(self, requests):
                subprocess.run(["/bin/true"], check=True)
                return []
    """)
    # retry_once without iterative_sequence: its rescheduling is refused.
    shutil.copytree(os.path.join(root, "retry_once"), os.path.join(root, "retry_plain"))
    config = os.path.join(root, "retry_plain", "config.pbtxt")
    with open(config) as f:
        text = f.read().replace('name: "retry_once"', 'name: "retry_plain"')
    with open(config, "w") as f:
        f.write(text.replace("sequence_batching { iterative_sequence: true }", ""))
    return root


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    cache = tmp_path_factory.mktemp("python-cache") / "wasm"
    t = Tern([f"--model-repository={repo}", f"--wasm-cache-dir={cache}", "--exit-on-error=false",
              f"--python-runner={runner()}"])
    yield t
    assert t.stop() == 0, t.log()


CLIENTS = [(httpclient, "url"), (grpcclient, "grpc_url")]


def client(server, mod, attr):
    return mod.InferenceServerClient(getattr(server, attr))


def tensor(mod, name, value, datatype):
    t = mod.InferInput(name, list(value.shape), datatype)
    t.set_data_from_numpy(value)
    return t


@pytest.mark.parametrize("mod,attr", CLIENTS, ids=["http", "grpc"])
def test_triton_python_models_answer_as_they_are(server, mod, attr):
    c = client(server, mod, attr)
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([0.5, 0.25, -1, 8], dtype=np.float32)
    r = c.infer("add_sub", [tensor(mod, "INPUT0", a, "FP32"), tensor(mod, "INPUT1", b, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    assert r.as_numpy("OUTPUT0").dtype == np.float32

    text = np.array([[b"hello", b"Tern"], [b"", "\u00e9t\u00e9".encode()]], dtype=np.object_)
    r = c.infer("strings", [tensor(mod, "TEXT", text, "BYTES")])
    assert r.as_numpy("UPPER").tolist() == [[b"HELLO", b"TERN"], [b"", "\u00e9T\u00e9".encode()]]
    np.testing.assert_array_equal(r.as_numpy("LENGTHS"), np.array([[5, 4], [0, 5]], dtype=np.int32))

    r = c.infer("uses_stdlib", [tensor(mod, "IN", np.array([3, 1, 3, 2, 3], dtype=np.int64), "INT64")])
    assert json.loads(r.as_numpy("OUT")[0]) == {"count": 5, "mean": "2.40", "mode": 3, "digest": "683db22fa41e6b6d"}


def numpy_ops_inputs():
    rng = np.random.default_rng(7)
    x = rng.normal(0, 3, (2, 3, 16, 16)).astype(np.float32)
    x.reshape(-1)[::97] = 0  # 0/0 and x/0
    u = rng.integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
    i = rng.integers(0, 4, (4, 300), dtype=np.int32)  # ties for argmax
    i[:, ::7] = rng.integers(-2**31, 2**31 - 1, (4, 43), dtype=np.int32)  # beyond float32's exact integers
    d = rng.normal(0, 1e6, 1536)
    return {"X": x, "U": u, "I": i, "D": d}


def numpy_ops_reference(inputs):
    """The numpy_ops model's `results` run by real numpy in this process."""
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("numpy_ops_model", os.path.join(MODELS, "numpy_ops", "1", "model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.results({k: v.copy() for k, v in inputs.items()})


def decode_numpy_ops(answer):
    got, held = {}, None
    for item in answer:
        name, rest = item.split(b"\0", 1)
        if name == b"held":
            held = json.loads(rest)
            continue
        dtype, shape, raw = rest.split(b"\0", 2)
        got[name.decode()] = np.frombuffer(raw, dtype=dtype.decode()).reshape(json.loads(shape))
    return got, held


def assert_same_bits(name, got, want):
    assert (got.dtype, got.shape) == (want.dtype, want.shape), name
    if got.dtype.kind == "f":
        assert np.array_equal(np.isnan(got), np.isnan(want)), name
        got, want = np.where(np.isnan(got), 0, got), np.where(np.isnan(want), 0, want)
    assert got.tobytes() == want.tobytes(), f"{name}: {got.reshape(-1)[:8]} != {want.reshape(-1)[:8]}"


def test_numpy_work_on_request_tensors_runs_in_host_kernels_bit_for_bit_as_numpy(server):
    """Request-sized numeric tensors stay in the host while the host's kernels
    compute as numpy does; every result, held there or not, equals real numpy's."""
    inputs = numpy_ops_inputs()
    want = numpy_ops_reference(inputs)
    ins = [tensor(httpclient, n, v, {"X": "FP32", "U": "UINT8", "I": "INT32", "D": "FP64"}[n]) for n, v in inputs.items()]
    got, held = decode_numpy_ops(client(server, httpclient, "url").infer("numpy_ops", ins).as_numpy("RESULTS"))
    assert sorted(got) == sorted(want)
    for name in want:
        assert_same_bits(name, got[name], want[name])
    # The host's kernels did the work where they can (the test would pass
    # without them otherwise): float arithmetic, casts, transposes, argmax.
    for name in ("add", "mul", "div_zero", "rdiv", "scalar_f32", "radd_rmul", "f64", "small_first",
                 "small_changed", "broadcast_channel", "broadcast_wide", "mixed_f64",
                 "u8_f32", "i32_f32", "f64_f32", "transpose", "transpose_T", "preprocess", "argmax_u8", "argmax_i32_0",
                 "expand_squeeze"):
        assert name in held, (name, held)
    for name in ("argmax_f32", "view_write", "to_int", "sum"):
        assert name not in held, (name, held)


def test_a_bls_request_can_be_part_of_a_sequence(server):
    x = np.zeros(4, dtype=np.float32)
    r = client(server, httpclient, "url").infer("bls_sequence", [tensor(httpclient, "IN", x, "FP32")])
    assert r.as_numpy("OUT").tolist() == [77, 3]


def test_relative_imports_find_the_version_folder_as_triton_s_stub_does(server):
    # model.py is imported as `1.model`: `from . import file2` and a package's `from .. import` work.
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    r = client(server, httpclient, "url").infer("multi_file", [tensor(httpclient, "IN", x, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("OUT"), x + 5)


@pytest.mark.parametrize("mod,attr", CLIENTS, ids=["http", "grpc"])
def test_bls_calls_sync_and_async(server, mod, attr):
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    r = client(server, mod, attr).infer("bls", [tensor(mod, "IN", x, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("OUT"), 3 * (x + 1))


def stream_one(server, model, name, value):
    """Sends one INT32 [1] request to a decoupled model over a gRPC stream;
    returns the client and the queue its (result, error) messages arrive on."""
    got = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    c.async_stream_infer(model, [tensor(grpcclient, name, np.array([value], dtype=np.int32), "INT32")])
    return c, got


def test_a_decoupled_model_at_its_memory_cap_restarts_and_ends_the_streams_it_held(server):
    """A stream whose sender the model kept across calls ends with the
    failure that restarted the instance, not a bare final flag (nor never)."""
    got = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    for v in (0, 1):
        c.async_stream_infer("hog_stream", [tensor(grpcclient, "IN", np.full(4, v, dtype=np.float32), "FP32")])
    errors = [got.get(timeout=30)[1].message() for _ in range(2)]
    cap = "model 'hog_stream' instance 'hog_stream_0' hit its memory cap of 268435456 bytes " \
        "(max_memory_bytes); the instance was restarted"
    assert any("MemoryError" in e for e in errors), errors  # the request that hit it
    assert cap in errors, errors  # the stream held across calls
    # The restarted instance answers.
    c.async_stream_infer("hog_stream", [tensor(grpcclient, "IN", -np.ones(4, dtype=np.float32), "FP32")])
    result, error = got.get(timeout=30)
    c.stop_stream()
    assert error is None, error
    np.testing.assert_array_equal(result.as_numpy("OUT"), -np.ones(4, dtype=np.float32))


def test_a_request_whose_stream_ended_does_not_run_again(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    got = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    c.async_stream_infer("final_then_again", [tensor(grpcclient, "IN", np.ones(4, dtype=np.float32), "FP32")])
    result, error = got.get(timeout=30)
    assert error is None, error
    time.sleep(0.5)  # room for a run that must not happen
    c.stop_stream()
    assert got.empty(), got.get()
    stats = c.get_inference_statistics("final_then_again", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) == 1, stats


def test_decoupled_senders_stream_over_grpc(server):
    c, got = stream_one(server, "counter", "N", 3)
    values = []
    for _ in range(3):
        result, error = got.get(timeout=30)
        assert error is None, error
        values.append(int(result.as_numpy("I")[0]))
    c.stop_stream()
    assert values == [0, 1, 2]


def test_rescheduling_without_iterative_sequence_is_refused_not_left_hanging(server):
    # Triton 2.51 logs this error and never answers the client.
    ones = np.ones(4, dtype=np.float32)
    for mod, attr in CLIENTS:
        inputs = [tensor(mod, "INPUT0", ones, "FP32"), tensor(mod, "INPUT1", ones, "FP32")]
        with pytest.raises(InferenceServerException) as e:
            client(server, mod, attr).infer("retry_plain", inputs)
        assert "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not " \
            "configured to handle such a flag." in e.value.message()
        assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        # The instance serves on (the model counted that first run: this is its second).
        r = client(server, mod, attr).infer("retry_plain", inputs)
        assert r.as_numpy("RUNS").tolist() == [2]
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), ones + ones)


def test_a_cancelled_iterative_request_stops_rescheduling_and_frees_the_instance(server):
    c, got = stream_one(server, "countdown", "COUNT", 2_000_000_000)
    for _ in range(3):
        result, error = got.get(timeout=30)
        assert error is None, error
    c.stop_stream(cancel_requests=True)
    # The model's one instance runs the next request: the endless one was let go.
    c, got = stream_one(server, "countdown", "COUNT", 2)
    left = []
    for _ in range(2):
        result, error = got.get(timeout=30)
        assert error is None, error
        left.append(int(result.as_numpy("LEFT")[0]))
    c.stop_stream()
    assert left == [1, 0]


def test_threads_and_processes_fail_clearly_at_the_call(server):
    # A decoupled model sending from a thread, as Triton's examples do: the
    # stream ends with the error (the call, the model's line, what to do).
    got = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    c.async_stream_infer("starts_thread", [tensor(grpcclient, "IN", np.ones(4, dtype=np.float32), "FP32")])
    result, error = got.get(timeout=30)
    c.stop_stream()
    assert error is not None, result
    assert "model.py line 12 calls threading.Thread.start(): the sandbox has no threads: send a decoupled " \
        "model's responses from execute itself, or make execute `async def`" in error.message(), error.message()
    with pytest.raises(InferenceServerException) as e:
        client(server, httpclient, "url").infer("runs_subprocess", [tensor(httpclient, "IN", np.ones(4, dtype=np.float32), "FP32")])
    assert "model.py line 6 calls subprocess.Popen(): the sandbox cannot start processes: call other models " \
        "with BLS" in e.value.message(), e.value.message()
    assert e.value.status() == "501"
    # The instances serve on.
    assert reasons(server)["starts_thread"][0] == "READY"


def reasons(server):
    index = httpclient.InferenceServerClient(server.url).get_model_repository_index()
    return {m["name"]: (m.get("state"), m.get("reason", "")) for m in index}


def test_models_that_cannot_run_fail_their_own_load_clearly(server):
    r = reasons(server)
    state, why = r["imports_torch"]
    assert state == "UNAVAILABLE" and "model.py (line 2) imports 'torch'" in why and "native extension" in why, why
    state, why = r["syntax_error"]
    assert state == "UNAVAILABLE" and "model.py line 5: expected ':'" in why, why
    state, why = r["fails_init"]
    assert state == "UNAVAILABLE" and "the weights file is missing" in why, why
    for ok in ("add_sub", "strings", "uses_stdlib", "bls", "counter", "loops", "hog", "auto_complete"):
        assert r[ok][0] == "READY", (ok, r[ok])


def test_auto_complete_config_failures_fail_that_model_alone(server):
    r = reasons(server)
    state, why = r["auto_complete_conflict"]
    assert state == "UNAVAILABLE" and "auto_complete_config failed: ValueError: model 'auto_complete_conflict', " \
        "tensor 'INPUT0': the model expects dims [8] but the model configuration specifies dims [4] " \
        "(at model.py:9 in auto_complete_config)" in why, why
    state, why = r["completes_forever"]
    assert state == "UNAVAILABLE" and "exceeded its execution deadline of 300 ms" in why, why
    state, why = r["completes_nothing"]
    assert state == "UNAVAILABLE" and \
        "auto_complete_config function in model 'completes_nothing' must return a valid pb.ModelConfig object" in why, why
    # The failure is the version's, as in Triton.
    index = httpclient.InferenceServerClient(server.url).get_model_repository_index()
    assert {m["name"]: m.get("version") for m in index}["auto_complete_conflict"] == "1"


def test_auto_complete_config_fills_the_config(server):
    c = httpclient.InferenceServerClient(server.url)
    config = c.get_model_config("auto_complete")
    assert config["max_batch_size"] == 8 and "dynamic_batching" in config, config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [4]), ("INPUT1", "TYPE_FP32", [4])]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    r = c.infer("auto_complete", [tensor(httpclient, "INPUT0", x, "FP32"), tensor(httpclient, "INPUT1", x, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x * x + 1)


def test_a_failed_auto_complete_config_fails_every_load_attempt(tmp_path):
    """Retries of the load (--model-load-retry-count) fail the same way; they
    never load the version with the config auto_complete_config left unfinished."""
    root = str(tmp_path / "models")
    shutil.copytree(os.path.join(MODELS, "auto_complete_conflict"), os.path.join(root, "auto_complete_conflict"))
    t = Tern([f"--model-repository={root}", "--exit-on-error=false", f"--python-runner={runner()}",
              "--model-load-retry-count=2", f"--wasm-cache-dir={tmp_path / 'cache'}"])
    try:
        state, why = reasons(t)["auto_complete_conflict"]
        assert state == "UNAVAILABLE" and "the model expects dims [8]" in why, why
    finally:
        assert t.stop() == 0, t.log()


def test_strict_config_runs_no_auto_complete(tmp_path):
    root = str(tmp_path / "models")
    shutil.copytree(os.path.join(MODELS, "auto_complete"), os.path.join(root, "auto_complete"))
    t = Tern([f"--model-repository={root}", "--exit-on-error=false", f"--python-runner={runner()}",
              "--strict-model-config=true", f"--wasm-cache-dir={tmp_path / 'cache'}"])
    try:
        # As Triton 2.51: the model loads as config.pbtxt has it, with no tensors.
        assert reasons(t)["auto_complete"][0] == "READY"
        meta = httpclient.InferenceServerClient(t.url).get_model_metadata("auto_complete")
        assert (meta["inputs"], meta["outputs"]) == ([], []), meta
    finally:
        assert t.stop() == 0, t.log()


def test_runaway_models_are_stopped_and_the_rest_keeps_serving(server):
    c = httpclient.InferenceServerClient(server.url)
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(InferenceServerException) as e:
        c.infer("loops", [tensor(httpclient, "IN", x, "FP32")])
    assert "deadline" in str(e.value) or "execution_timeout_ms" in str(e.value), e.value
    with pytest.raises(InferenceServerException) as e:
        c.infer("hog", [tensor(httpclient, "IN", x, "FP32")])
    assert "hit its memory cap of 268435456 bytes (max_memory_bytes)" in str(e.value), e.value
    with pytest.raises(InferenceServerException) as e:
        c.infer("hog", [tensor(httpclient, "IN", 2 * x, "FP32")])
    assert "OverflowError" in str(e.value) and "model.py:" in str(e.value), e.value
    # The restarted instance serves again, and so do the others.
    r = c.infer("hog", [tensor(httpclient, "IN", -x, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("OUT"), -x)
    r = c.infer("add_sub", [tensor(httpclient, "INPUT0", x, "FP32"), tensor(httpclient, "INPUT1", x, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), 2 * x)


def test_the_runner_compiles_once_for_every_python_model(server):
    log = server.log()
    assert log.count("(Compiled) model=") + log.count("(Cache) model=") == 1, log
    assert log.count("(Shared) model=") >= 8, log


def test_a_missing_runner_fails_python_models_only(tmp_path):
    root = str(tmp_path / "models")
    shutil.copytree(os.path.join(MODELS, "add_sub"), os.path.join(root, "add_sub"))
    t = Tern([f"--model-repository={root}", "--exit-on-error=false", f"--python-runner={tmp_path / 'absent.wasm'}",
              "--wasm-cache-dir=none"])
    try:
        state, why = reasons(t)["add_sub"]
        assert state == "UNAVAILABLE" and "--python-runner" in why and "does not exist" in why, why
    finally:
        assert t.stop() == 0, t.log()


def test_forwarded_headers_reach_the_model_as_parameters(tmp_path, start_tern):
    """--http-header-forward-pattern / --grpc-header-forward-pattern: the
    headers (metadata) whose names match, case-insensitively and anywhere in
    the name, become string request parameters; a parameter the request sets
    keeps its value; others stay out."""
    root = str(tmp_path / "models")
    add_model(root, "params", """
        name: "params"
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "P" data_type: TYPE_STRING dims: [ 1 ] } ]
    """, """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("P", np.array([r.parameters().encode()], dtype=np.object_))]) for r in requests]
    """)
    t = start_tern([f"--model-repository={root}", f"--python-runner={runner()}",
                    "--http-header-forward-pattern=^x-fwd", "--grpc-header-forward-pattern=trace-tag"])
    x = lambda mod: [mod.InferInput("X", [1], "INT32")]
    ins = x(httpclient)
    ins[0].set_data_from_numpy(np.array([1], dtype=np.int32))
    r = httpclient.InferenceServerClient(t.url).infer(
        "params", ins, headers={"X-Fwd-One": "a", "X-Other": "b", "x-fwd-two": "c"}, parameters={"x-fwd-two": "body"})
    got = json.loads(r.as_numpy("P")[0])
    assert got == {"x-fwd-one": "a", "x-fwd-two": "body"}, got
    ins = x(grpcclient)
    ins[0].set_data_from_numpy(np.array([1], dtype=np.int32))
    g = grpcclient.InferenceServerClient(t.grpc_url)
    r = g.infer("params", ins, headers={"my-trace-tag": "t1", "x-fwd-one": "no"})
    assert json.loads(r.as_numpy("P")[0]) == {"my-trace-tag": "t1"}


def test_a_bad_header_forward_pattern_stops_the_server(tmp_path, start_tern):
    t = start_tern([f"--model-repository={tmp_path}", "--http-header-forward-pattern=(unclosed"], wait_ready=False)
    assert t.wait(60) != 0
    assert "--http-header-forward-pattern '(unclosed' is not a valid regular expression" in t.log()
