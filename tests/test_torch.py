"""TorchScript models through the pytorch backend (`make test-torch`): models
generated with torch at test time (scripts/gen_torch_models.py), served by
the build with the `torch` feature (TERN_TORCH_BIN) and compared with
`torch.jit.load(...)(...)` in this process on the same inputs, over HTTP and
gRPC, batched and unbatched; Triton's naming rules, strings, tuples, lists
and dicts, every mapped type, parameters, errors, an ensemble with a WASM
plugin, KIND_GPU without a GPU."""

import concurrent.futures
import os
import shutil
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern

TORCH_BIN = os.environ.get("TERN_TORCH_BIN")
if not TORCH_BIN or not os.path.exists(TORCH_BIN):
    pytest.fail(
        "TERN_TORCH_BIN does not name a tern built with the 'torch' feature: run these tests with `make test-torch`",
        pytrace=False,
    )
try:
    import torch
except ImportError:
    pytest.fail("PyTorch is not installed: `make test-torch` installs it", pytrace=False)

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gen_torch_models  # noqa: E402

# The references run as Triton runs them: no autograd.
torch.set_grad_enabled(False)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

WASM_DIR = os.environ.get("TERN_PLUGINS_DIR", os.path.join(ROOT, "target", "wasm32-wasip2", "release"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("torch") / "models")
    gen_torch_models.write(root, WASM_DIR if os.path.exists(os.path.join(WASM_DIR, "prep_rust.wasm")) else None)
    return root


@pytest.fixture(scope="module")
def server(repo):
    t = Tern([f"--model-repository={repo}", "--log-verbose=0", "--allow-client-shm"], binary=TORCH_BIN)
    yield t
    t.stop()


def both(server):
    return [
        ("http", httpclient, httpclient.InferenceServerClient(server.url)),
        ("grpc", grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    ]


def tensor(mod, name, array, dtype):
    i = mod.InferInput(name, list(array.shape), dtype)
    i.set_data_from_numpy(array)
    return i


def test_cnn_matches_torch_batched_and_unbatched(server, repo):
    ref = gen_torch_models.reference(repo, "torch_cnn")
    rng = np.random.default_rng(1)
    for proto, mod, c in both(server):
        for batch in (1, 3, 8):
            x = rng.standard_normal((batch, 3, 32, 32), dtype=np.float32)
            got = c.infer("torch_cnn", [tensor(mod, "INPUT__0", x, "FP32")]).as_numpy("OUTPUT__0")
            want = ref(torch.from_numpy(x)).numpy()
            assert got.shape == (batch, 10), proto
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{proto} batch {batch}")


def test_dynamic_batching_gathers_and_scatters(server, repo):
    ref = gen_torch_models.reference(repo, "torch_cnn")
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((1 + i % 3, 3, 32, 32), dtype=np.float32) for i in range(24)]
    stats = httpclient.InferenceServerClient(server.url)
    before = stats.get_inference_statistics("torch_cnn")["model_stats"][0]

    def one(x):
        c = httpclient.InferenceServerClient(server.url)
        return c.infer("torch_cnn", [tensor(httpclient, "INPUT__0", x, "FP32")]).as_numpy("OUTPUT__0")

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        outs = list(pool.map(one, xs))
    for x, got in zip(xs, outs):
        np.testing.assert_allclose(got, ref(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)
    after = stats.get_inference_statistics("torch_cnn")["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == sum(x.shape[0] for x in xs)
    assert executions < len(xs), "the dynamic batcher should have run several requests together"


def test_tuple_outputs_bind_by_index_and_inputs_by_argument_name(server, repo):
    ref = gen_torch_models.reference(repo, "torch_tuple")
    a = np.arange(10, dtype=np.float32).reshape(2, 5)
    b = np.full((2, 5), 3.0, dtype=np.float32)
    want = [t.numpy() for t in ref(torch.from_numpy(a), torch.from_numpy(b))]
    for proto, mod, c in both(server):
        # Config order is (b, a): they reach forward(a, b) by name.
        r = c.infer("torch_tuple", [tensor(mod, "b", b, "FP32"), tensor(mod, "a", a, "FP32")])
        np.testing.assert_allclose(r.as_numpy("OUTPUT__0"), want[0], err_msg=proto)
        np.testing.assert_allclose(r.as_numpy("OUTPUT__1"), want[1], err_msg=proto)
        assert r.as_numpy("OUTPUT__2").tolist() == want[2].reshape(2, 1).tolist(), proto


def test_dynamic_sequence_length(server, repo):
    ref = gen_torch_models.reference(repo, "torch_seq")
    for proto, mod, c in both(server):
        for length in (1, 7, 33):
            ids = np.arange(length * 2, dtype=np.int64).reshape(2, length) * 7
            got = c.infer("torch_seq", [tensor(mod, "INPUT__0", ids, "INT64")]).as_numpy("OUTPUT__0")
            np.testing.assert_allclose(got, ref(torch.from_numpy(ids)).numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{proto} length {length}")


def test_strings_in_and_out(server, repo):
    ref = gen_torch_models.reference(repo, "torch_strings")
    words = ["héllo", "tern", "", "TorchScript"]
    want_text, want_len = ref(words)
    for proto, mod, c in both(server):
        r = c.infer("torch_strings", [tensor(mod, "text", np.array([w.encode() for w in words], dtype=object),
                                             "BYTES")])
        assert [s.decode() for s in r.as_numpy("OUTPUT__0")] == want_text, proto
        assert r.as_numpy("OUTPUT__1").tolist() == want_len.tolist(), proto
        with pytest.raises(InferenceServerException, match="not valid UTF-8"):
            c.infer("torch_strings", [tensor(mod, "text", np.array([b"\xff\xfe"], dtype=object), "BYTES")])


def test_dict_input_dict_output_and_list_output(server, repo):
    alpha = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    beta = np.ones((2, 3), dtype=np.float32)
    x = np.array([1.0, 4.0, 9.0, 16.0], dtype=np.float32)
    for proto, mod, c in both(server):
        got = c.infer("torch_dict_in", [tensor(mod, "alpha", alpha, "FP32"), tensor(mod, "beta", beta, "FP32")])
        want = gen_torch_models.reference(repo, "torch_dict_in")({"alpha": torch.from_numpy(alpha),
                                                                   "beta": torch.from_numpy(beta)})
        np.testing.assert_allclose(got.as_numpy("OUTPUT__0"), want.numpy(), err_msg=proto)
        got = c.infer("torch_dict_out", [tensor(mod, "INPUT__0", alpha, "FP32")])
        want = gen_torch_models.reference(repo, "torch_dict_out")(torch.from_numpy(alpha))
        np.testing.assert_allclose(got.as_numpy("doubled"), want["doubled"].numpy(), err_msg=proto)
        np.testing.assert_allclose(got.as_numpy("total"), want["total"].numpy(), err_msg=proto)
        got = c.infer("torch_list_out", [tensor(mod, "INPUT__0", x, "FP32")])
        want = gen_torch_models.reference(repo, "torch_list_out")(torch.from_numpy(x))
        np.testing.assert_allclose(got.as_numpy("OUTPUT__0"), want[0].numpy(), err_msg=proto)
        np.testing.assert_allclose(got.as_numpy("OUTPUT__1"), want[1].numpy(), err_msg=proto)


def test_every_mapped_type(server, repo):
    ref = gen_torch_models.reference(repo, "torch_types")
    values = {
        "b": (np.array([[True, False, True]]), "BOOL"),
        "u8": (np.array([[0, 7, 254]], dtype=np.uint8), "UINT8"),
        "i8": (np.array([[-5, 0, 100]], dtype=np.int8), "INT8"),
        "i16": (np.array([[-300, 0, 300]], dtype=np.int16), "INT16"),
        "i32": (np.array([[-70000, 0, 70000]], dtype=np.int32), "INT32"),
        "i64": (np.array([[-(2**40), 0, 2**40]], dtype=np.int64), "INT64"),
        "f16": (np.array([[0.5, -1.25, 3.0]], dtype=np.float16), "FP16"),
        "f32": (np.array([[0.5, -1.25, 3.0]], dtype=np.float32), "FP32"),
        "f64": (np.array([[0.5, -1.25, 3.0]], dtype=np.float64), "FP64"),
    }
    import ml_dtypes

    bf16 = np.array([[0.5, -1.25, 3.0]], dtype=ml_dtypes.bfloat16)
    args = [torch.from_numpy(v) for v, _ in values.values()] + [torch.from_numpy(bf16.astype(np.float32)).bfloat16()]
    want = ref(*args)
    for proto, mod, c in both(server):
        inputs = [tensor(mod, n, v, t) for n, (v, t) in values.items()] + [tensor(mod, "bf16", bf16, "BF16")]
        r = c.infer("torch_types", inputs)
        for i, name in enumerate(values):
            np.testing.assert_array_equal(r.as_numpy(f"OUT__{i}"), want[i].numpy(), err_msg=f"{proto} {name}")
        got = r.as_numpy("OUT__9").astype(np.float32)
        np.testing.assert_array_equal(got, want[9].float().numpy(), err_msg=f"{proto} bf16")


def test_a_model_writing_to_its_input_never_touches_the_clients_memory(server):
    """`x.mul_(2)` writes to the input tensor: Tern's copy of it, never the request's buffer or
    the client's shared-memory region, so the same region gives the same answer every time."""
    import tritonclient.utils.shared_memory as shm

    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    key = f"/tern_torch_inplace_{os.getpid()}"
    h = shm.create_shared_memory_region("torch_inplace_in", key, x.nbytes)
    try:
        shm.set_shared_memory_region(h, [x])
        for proto, mod, c in both(server):
            c.register_system_shared_memory("torch_inplace_in", key, x.nbytes)
            try:
                for _ in range(3):
                    i = mod.InferInput("INPUT__0", [1, 4], "FP32")
                    i.set_shared_memory("torch_inplace_in", x.nbytes)
                    got = c.infer("torch_inplace", [i]).as_numpy("OUTPUT__0")
                    np.testing.assert_array_equal(got, x * 2, err_msg=proto)
                    np.testing.assert_array_equal(shm.get_contents_as_numpy(h, np.float32, [1, 4]), x, err_msg=proto)
            finally:
                c.unregister_system_shared_memory("torch_inplace_in")
    finally:
        shm.destroy_shared_memory_region(h)


def test_forward_exception_fails_only_its_batch(server):
    good = np.array([[1.0, 2.0]], dtype=np.float32)
    bad = np.array([[-1.0, 2.0]], dtype=np.float32)

    def one(x):
        c = httpclient.InferenceServerClient(server.url)
        try:
            return c.infer("torch_raises", [tensor(httpclient, "INPUT__0", x, "FP32")]).as_numpy("OUTPUT__0")
        except InferenceServerException as e:
            return e

    results = [one(bad)]
    assert isinstance(results[0], InferenceServerException)
    msg = results[0].message()
    assert "PyTorch execute failure" in msg and "negative input" in msg and "torch_raises" in msg, msg
    assert "Exception raised from" not in msg, msg
    # Alone, good requests still run; the server keeps serving.
    np.testing.assert_allclose(one(good), good + 1.0)
    for proto, mod, c in both(server):
        with pytest.raises(InferenceServerException, match="PyTorch execute failure"):
            c.infer("torch_raises", [tensor(mod, "INPUT__0", bad, "FP32")])
        np.testing.assert_allclose(c.infer("torch_raises", [tensor(mod, "INPUT__0", good, "FP32")])
                                   .as_numpy("OUTPUT__0"), good + 1.0)


def test_ensemble_with_a_wasm_preprocessing_step(server, repo):
    if not os.path.exists(os.path.join(repo, "torch_pipeline")):
        pytest.fail(f"prep_rust.wasm is not in {WASM_DIR} (`make plugins` builds it)")
    head = gen_torch_models.reference(repo, "torch_token_head")
    in0 = np.arange(8, dtype=np.float32).reshape(2, 4)
    in1 = np.ones((2, 4), dtype=np.float32)
    text = np.array([[b"Hello, Tern!"], [b"torch script step"]], dtype=object)
    for proto, mod, c in both(server):
        inputs = [tensor(mod, "INPUT0", in0, "FP32"), tensor(mod, "INPUT1", in1, "FP32"),
                  tensor(mod, "TEXT", text, "BYTES")]
        prep = c.infer("prep_rust", inputs)
        want = head(torch.from_numpy(prep.as_numpy("TOKEN_IDS").copy()), torch.from_numpy(prep.as_numpy("OUTPUT0").copy()))
        got = c.infer("torch_pipeline", inputs).as_numpy("SCORES")
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=proto)


def _write(root, name, config, model_bytes=None, module=None):
    d = os.path.join(root, name)
    os.makedirs(os.path.join(d, "1"), exist_ok=True)
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(f'name: "{name}"\n{config}')
    if module is not None:
        torch.jit.script(module).save(os.path.join(d, "1", "model.pt"))
    elif model_bytes is not None:
        with open(os.path.join(d, "1", "model.pt"), "wb") as f:
            f.write(model_bytes)


def test_bad_models_fail_to_load_with_clear_errors(tmp_path, repo):
    root = str(tmp_path / "models")
    os.makedirs(root)
    io = ('input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
          'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')
    _write(root, "not_torchscript", 'platform: "pytorch_libtorch"\nmax_batch_size: 2\n' + io, b"\x00garbage" * 50)
    tuple_model = gen_torch_models.TupleOut()
    _write(root, "wrong_count", 'backend: "pytorch"\nmax_batch_size: 2\n' + io, module=tuple_model)
    _write(root, "bad_param", 'platform: "pytorch_libtorch"\nmax_batch_size: 2\n' + io +
           'parameters { key: "ENABLE_WEIGHT_SHARING" value { string_value: "maybe" } }\n',
           module=gen_torch_models.Raises())
    _write(root, "uint32", 'platform: "pytorch_libtorch"\nmax_batch_size: 2\n'
           'input [ { name: "INPUT__0" data_type: TYPE_UINT32 dims: [ 2 ] } ]\n'
           'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n', module=gen_torch_models.Raises())
    _write(root, "strings_2d", 'platform: "pytorch_libtorch"\nmax_batch_size: 2\n'
           'input [ { name: "text" data_type: TYPE_STRING dims: [ 2 ] } ]\n'
           'output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ 2 ] } ]\n',
           module=gen_torch_models.Strings())
    _write(root, "gpu", 'platform: "pytorch_libtorch"\nmax_batch_size: 2\n' + io +
           'instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]\n', module=gen_torch_models.Raises())
    _write(root, "wrong_type", 'platform: "pytorch_libtorch"\nmax_batch_size: 2\n'
           'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
           'output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 2 ] } ]\n', module=gen_torch_models.Raises())
    _write(root, "fine", 'platform: "pytorch_libtorch"\nmax_batch_size: 2\n' + io +
           'parameters [ { key: "INFERENCE_MODE" value { string_value: "false" } },\n'
           '  { key: "DISABLE_OPTIMIZED_EXECUTION" value { string_value: "true" } },\n'
           '  { key: "ENABLE_JIT_PROFILING" value { string_value: "false" } },\n'
           '  { key: "ENABLE_JIT_EXECUTOR" value { string_value: "false" } },\n'
           '  { key: "ENABLE_TENSOR_FUSER" value { string_value: "off" } },\n'
           '  { key: "ENABLE_NVFUSER" value { string_value: "false" } },\n'
           '  { key: "ENABLE_WEIGHT_SHARING" value { string_value: "true" } },\n'
           '  { key: "ENABLE_CACHE_CLEANING" value { string_value: "true" } },\n'
           '  { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } },\n'
           '  { key: "INTER_OP_THREAD_COUNT" value { string_value: "1" } } ]\n'
           'instance_group [ { kind: KIND_CPU count: 2 } ]\n'
           'model_warmup [ { name: "w" batch_size: 2 inputs { key: "INPUT__0" value: '
           '{ data_type: TYPE_FP32 dims: [ 2 ] random_data: true } } } ]\n',
           module=gen_torch_models.Raises())
    t = Tern([f"--model-repository={root}", "--exit-on-error=false", "--strict-readiness=false"], binary=TORCH_BIN)
    try:
        c = httpclient.InferenceServerClient(t.url)
        index = {m["name"]: m for m in c.get_model_repository_index()}
        reasons = {n: m.get("reason", "") for n, m in index.items()}
        assert index["fine"]["state"] == "READY", reasons
        assert "failed to load model 'not_torchscript'" in reasons["not_torchscript"], reasons
        assert "Exception raised from" not in reasons["not_torchscript"], reasons
        assert "configuration expects 1 inputs, model provides 2" in reasons["wrong_count"], reasons
        assert "failed to convert 'maybe' to boolean" in reasons["bad_param"], reasons
        assert "unsupported datatype TYPE_UINT32 for input 'INPUT__0'" in reasons["uint32"], reasons
        assert "1 dimensional List of String" in reasons["strings_2d"], reasons
        assert "KIND_GPU" in reasons["gpu"], reasons
        x = np.array([[1.0, 2.0]], dtype=np.float32)
        np.testing.assert_allclose(c.infer("fine", [tensor(httpclient, "INPUT__0", x, "FP32")])
                                   .as_numpy("OUTPUT__0"), x + 1.0)
        with pytest.raises(InferenceServerException,
                           match="configuration expects datatype TYPE_INT32 for output 'OUTPUT__0', "
                                 "model provides TYPE_FP32"):
            c.infer("wrong_type", [tensor(httpclient, "INPUT__0", x, "FP32")])
        # Still serving after all of that.
        np.testing.assert_allclose(c.infer("fine", [tensor(httpclient, "INPUT__0", x, "FP32")])
                                   .as_numpy("OUTPUT__0"), x + 1.0)
    finally:
        t.stop()


def test_build_without_torch_says_what_to_do(tmp_path, repo):
    root = str(tmp_path / "models")
    shutil.copytree(os.path.join(repo, "torch_cnn"), os.path.join(root, "torch_cnn"))
    t = Tern([f"--model-repository={root}", "--exit-on-error=false", "--strict-readiness=false"])
    try:
        index = httpclient.InferenceServerClient(t.url).get_model_repository_index()
        reason = index[0].get("reason", "")
        if "make torch" not in reason:
            pytest.skip("skipped: TERN_BIN has the torch feature too")
        assert "no LibTorch" in reason, reason
    finally:
        t.stop()


def test_gpu_instances(tmp_path, repo):
    """KIND_GPU: on a GPU with the torch-cuda build, results equal torch's on the same GPU;
    otherwise the load fails with a message that says why."""
    root = str(tmp_path / "models")
    shutil.copytree(os.path.join(repo, "torch_cnn"), os.path.join(root, "torch_cnn"))
    with open(os.path.join(root, "torch_cnn", "config.pbtxt")) as f:
        config = f.read().replace("kind: KIND_CPU count: 1", "kind: KIND_GPU count: 1 gpus: [ 0 ]")
    with open(os.path.join(root, "torch_cnn", "config.pbtxt"), "w") as f:
        f.write(config + 'parameters { key: "ENABLE_CACHE_CLEANING" value { string_value: "true" } }\n')
    t = Tern([f"--model-repository={root}", "--exit-on-error=false", "--strict-readiness=false"], binary=TORCH_BIN)
    try:
        c = httpclient.InferenceServerClient(t.url)
        state = c.get_model_repository_index()[0]
        if not torch.cuda.is_available():
            assert state["state"] == "UNAVAILABLE", state
            assert "KIND_GPU" in state["reason"] or "GPU" in state["reason"], state
            pytest.skip(f"skipped: no CUDA GPU here; KIND_GPU fails to load with: {state['reason']}")
        assert state["state"] == "READY", state
        ref = gen_torch_models.reference(repo, "torch_cnn").cuda()
        x = np.random.default_rng(5).standard_normal((4, 3, 32, 32), dtype=np.float32)
        for proto, mod, client in both(t):
            got = client.infer("torch_cnn", [tensor(mod, "INPUT__0", x, "FP32")]).as_numpy("OUTPUT__0")
            want = ref(torch.from_numpy(x).cuda()).cpu().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=proto)
    finally:
        t.stop()
