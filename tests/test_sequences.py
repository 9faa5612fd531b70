"""Stateful models through the sequence batcher, driven by tritonclient's
sequence API (HTTP and gRPC): correlation ids as numbers and strings, the
START/END/READY/CORRID control inputs in their int32/fp32/bool/data-type
forms, implicit state (zero and file initial state), both strategies, idle
release, Triton's errors, and Silero VAD streaming against silero-vad's own
iterator."""

import concurrent.futures
import os
import sys
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gen_models  # noqa: E402

WASM_DIR = os.environ.get("TERN_PLUGINS_DIR", os.path.join(ROOT, "target", "wasm32-wasip2", "release"))


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("seq") / "models")
    wasm = WASM_DIR if os.path.exists(os.path.join(WASM_DIR, "sequence_sum.wasm")) else None
    gen_models.sequence_repo(root, wasm)
    t = Tern([f"--model-repository={root}", "--log-verbose=0"])
    yield t
    t.stop()


def clients(server):
    return [
        ("http", httpclient, httpclient.InferenceServerClient(server.url, concurrency=8)),
        ("grpc", grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    ]


def int_input(mod, name, value, shape=(1, 1)):
    i = mod.InferInput(name, list(shape), "INT32")
    i.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
    return i


def step(client, mod, model, seq, value, start=False, end=False, shape=(1, 1)):
    return client.infer(
        model,
        [int_input(mod, "INPUT", value, shape)],
        sequence_id=seq,
        sequence_start=start,
        sequence_end=end,
    )


def out(result, name):
    return result.as_numpy(name).reshape(-1)[0]


@pytest.mark.parametrize("model", ["seq_direct", "seq_oldest"])
def test_sequences_accumulate_with_every_control_input(seq_server, model):
    for proto, mod, c in clients(seq_server):
        seq = 1000 + (1 if proto == "grpc" else 0)
        r = step(c, mod, model, seq, 5, start=True)
        assert out(r, "OUTPUT") == 5
        assert (out(r, "START_OUT"), out(r, "END_OUT"), out(r, "READY_OUT")) == (1, 0.0, 1)
        assert out(r, "CORRID_OUT") == seq
        # The state output is the batcher's, not the client's.
        assert r.as_numpy("ACC_OUT") is None
        r = step(c, mod, model, seq, 7)
        assert out(r, "OUTPUT") == 12
        assert (out(r, "START_OUT"), out(r, "END_OUT")) == (0, 0.0)
        r = step(c, mod, model, seq, 1, end=True)
        assert out(r, "OUTPUT") == 13
        assert (out(r, "START_OUT"), out(r, "END_OUT"), out(r, "READY_OUT")) == (0, 1.0, 1)
        # START and END on one request: a whole sequence.
        r = step(c, mod, model, seq, 9, start=True, end=True)
        assert (out(r, "OUTPUT"), out(r, "START_OUT"), out(r, "END_OUT")) == (9, 1, 1.0)


def test_an_ensemble_step_carries_the_sequence(seq_server):
    for proto, mod, c in clients(seq_server):
        seq = 3100 + (proto == "grpc")
        r = step(c, mod, "seq_ensemble", seq, 4, start=True)
        assert out(r, "SUM") == 4
        r = step(c, mod, "seq_ensemble", seq, 6, end=True)
        assert out(r, "SUM") == 10
        # The ensemble's response carries the request's sequence, as Triton's do.
        if proto == "http":
            assert r.get_response()["parameters"] == {"sequence_id": seq, "sequence_start": False, "sequence_end": True}
        else:
            p = r.get_response().parameters
            assert (p["sequence_id"].int64_param, p["sequence_start"].bool_param, p["sequence_end"].bool_param) == (seq, False, True)


def test_string_ids_and_initial_state_from_a_file(seq_server):
    for proto, mod, c in clients(seq_server):
        seq = f"stream-{proto}"
        r = step(c, mod, "seq_string", seq, 1, start=True)
        assert out(r, "OUTPUT") == 101, "starts from initial_state/hundred.bin"
        assert out(r, "CORRID_OUT") == seq.encode()
        assert out(step(c, mod, "seq_string", seq, 2, end=True), "OUTPUT") == 103


@pytest.mark.parametrize("model", ["seq_direct", "seq_oldest"])
def test_many_concurrent_sequences_each_keep_their_own_state(seq_server, model):
    """More sequences than slots (2 instances x 4): the rest wait in the
    backlog; every sequence sums exactly its own values."""
    _, mod, c = clients(seq_server)[1]

    def run(s):
        seq = 5000 + s
        total = 0
        for k in range(12):
            v = s * 100 + k
            total += v
            r = step(c, mod, model, seq, v, start=k == 0, end=k == 11)
            assert out(r, "OUTPUT") == total, (s, k)
            assert out(r, "CORRID_OUT") == seq
        return s

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        assert sorted(pool.map(run, range(20))) == list(range(20))
    stats = c.get_inference_statistics(model, as_json=True)["model_stats"][0]
    # Filler rows of direct batches run on the model but are nobody's requests.
    assert int(stats["inference_count"]) >= 240
    assert int(stats["execution_count"]) <= int(stats["inference_count"])


@pytest.mark.parametrize("model", ["seq_direct", "seq_oldest"])
def test_a_streams_requests_reach_the_batcher_in_the_order_sent(seq_server, model):
    """Each sequence's START, middle and END sent back to back on one gRPC
    stream, without waiting for answers, 30 sequences one after another: the
    requests behind a START are queued behind it (as Triton queues them), never
    refused for a missing START, and every sequence sums its own values."""
    import queue

    results = queue.Queue()
    c = grpcclient.InferenceServerClient(seq_server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        n = 30
        for s in range(n):
            for k in range(3):
                c.async_stream_infer(model, [int_input(grpcclient, "INPUT", s + k * 1000)], request_id=f"{s}-{k}",
                                     sequence_id=7000 + s, sequence_start=k == 0, sequence_end=k == 2)
        got = {}
        for _ in range(3 * n):
            result, error = results.get(timeout=60)
            assert error is None, str(error)
            got[result.get_response().id] = out(result, "OUTPUT")
    finally:
        c.stop_stream()
    for s in range(n):
        assert [got[f"{s}-{k}"] for k in range(3)] == [s, 2 * s + 1000, 3 * s + 3000], s


def test_requests_outside_a_live_sequence_get_tritons_errors(seq_server):
    for proto, mod, c in clients(seq_server):
        with pytest.raises(InferenceServerException) as e:
            step(c, mod, "seq_direct", 424242, 1)
        assert (
            "inference request for sequence 424242 to model 'seq_direct' must specify the START flag "
            "on the first request of the sequence" in str(e.value)
        )
        with pytest.raises(InferenceServerException) as e:
            c.infer("seq_direct", [int_input(mod, "INPUT", 1)])
        assert "inference request to model 'seq_direct' must specify a non-zero or non-empty correlation ID" in str(e.value)
        with pytest.raises(InferenceServerException) as e:
            step(c, mod, "seq_direct", "text-id", 1, start=True)
        assert "sequence batching control 'CORRID' data-type is 'BYTES', but model 'seq_direct' expects 'UINT64'" in str(e.value)
        with pytest.raises(InferenceServerException) as e:
            step(c, mod, "seq_direct", 77, 1, start=True, shape=(2, 1))
        assert "must specify batch-size 1 due to requirements of sequence batcher" in str(e.value)
        # A client cannot feed the batcher's own inputs.
        with pytest.raises(InferenceServerException) as e:
            c.infer("seq_direct", [int_input(mod, "INPUT", 1), int_input(mod, "START", 1)], sequence_id=78, sequence_start=True)
        assert "unexpected inference input 'START'" in str(e.value)
        # After END the id is free again: without START it is unknown.
        step(c, mod, "seq_direct", 79, 1, start=True, end=True)
        with pytest.raises(InferenceServerException) as e:
            step(c, mod, "seq_direct", 79, 1)
        assert "must specify the START flag" in str(e.value)


def test_bad_sequence_parameters_are_refused(seq_server):
    import json
    import urllib.error
    import urllib.request

    def post(params):
        body = json.dumps(
            {"parameters": params, "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}
        ).encode()
        req = urllib.request.Request(f"http://{seq_server.url}/v2/models/seq_direct/infer", data=body)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        return e.value.code, json.loads(e.value.read())["error"]

    assert post({"sequence_id": 1.5, "sequence_start": True}) == (
        400,
        "sequence_id parameter must be an integer or a string",
    )
    assert post({"sequence_id": 3, "sequence_start": 1}) == (400, "sequence_start parameter must be a boolean")


def test_an_idle_sequence_is_released_and_others_are_unharmed(seq_server):
    """seq_string releases a sequence after 300 ms without a request."""
    import time

    _, mod, c = clients(seq_server)[0]
    step(c, mod, "seq_string", "idle", 1, start=True)
    step(c, mod, "seq_string", "busy", 1, start=True)
    for _ in range(6):
        time.sleep(0.1)
        step(c, mod, "seq_string", "busy", 1)
    with pytest.raises(InferenceServerException) as e:
        step(c, mod, "seq_string", "idle", 1)
    assert "inference request for sequence idle to model 'seq_string' must specify the START flag" in str(e.value)
    assert out(step(c, mod, "seq_string", "busy", 1, end=True), "OUTPUT") == 108
    assert seq_server.wait_log("sequence idle released after 300000 µs idle")


@pytest.mark.parametrize("model", ["seq_plugin", "seq_plugin_batched"])
def test_plugins_keep_per_sequence_state_by_correlation_id(seq_server, model):
    if "seq_plugin" not in seq_server.log():
        pytest.fail("the sequence_sum plugin is not built (make plugins)")
    shape = (1,) if model == "seq_plugin" else (1, 1)
    for proto, mod, _ in clients(seq_server):

        def run(s):
            # One client per thread: tritonclient's HTTP client is not thread-safe.
            c = mod.InferenceServerClient(seq_server.url if proto == "http" else seq_server.grpc_url)
            seq = f"{proto}-{s}" if s % 2 else 9000 + s
            total = 0
            for k in range(6):
                total += k + s
                r = step(c, mod, model, seq, k + s, start=k == 0, end=k == 5, shape=shape)
                assert out(r, "OUTPUT") == total
                assert out(r, "CORRID_OUT") == str(seq).encode()
                assert out(r, "READY_OUT") == 1

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(run, range(6)))


# --- Silero VAD -------------------------------------------------------------

SR = 16000
CHUNK = 512
CONTEXT = 64


def speech(text, seed):
    """16 kHz mono float32 speech from espeak-ng, with silence around it."""
    import io
    import shutil
    import subprocess
    import wave

    if not shutil.which("espeak-ng"):
        pytest.fail("espeak-ng is not installed (make test-audio installs it)")
    wav = subprocess.run(["espeak-ng", "-s", "150", "--stdout", text], check=True, capture_output=True).stdout
    with wave.open(io.BytesIO(wav)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768
    t = np.arange(0, len(pcm) / rate, 1 / SR)
    audio = np.interp(t, np.arange(len(pcm)) / rate, pcm).astype(np.float32)
    rng = np.random.default_rng(seed)
    quiet = lambda n: (rng.standard_normal(n) * 0.001).astype(np.float32)  # noqa: E731
    audio = np.concatenate([quiet(SR // 2), audio, quiet(SR), audio[: SR // 2], quiet(SR // 2)])
    return audio[: len(audio) // CHUNK * CHUNK]


def vad_iterator_class():
    """silero-vad's own VADIterator, loaded from the installed package with a
    stand-in for the few torch calls it makes (torch itself is a multi-GB
    download the tests do without)."""
    import importlib.util
    import types

    class Tensor:
        def __init__(self, data):
            self.a = np.asarray(data, dtype=np.float32)

        def dim(self):
            return self.a.ndim

        def __len__(self):
            return len(self.a)

        def __getitem__(self, i):
            return self.a[i]

    torch = types.ModuleType("torch")
    torch.Tensor = Tensor
    torch.is_tensor = lambda x: isinstance(x, Tensor)
    torch.no_grad = lambda: (lambda f: f)
    torch.device = lambda *a, **k: None  # a default argument value
    spec = importlib.util.find_spec("silero_vad")
    path = os.path.join(spec.submodule_search_locations[0], "utils_vad.py")
    saved = sys.modules.get("torch")
    sys.modules["torch"] = torch
    try:
        loader = importlib.util.spec_from_file_location("silero_utils_vad", path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved
    return module.VADIterator


class ReferenceModel:
    """silero-vad's OnnxWrapper streaming loop (state and 64-sample context)
    on the package's ONNX model, in onnxruntime."""

    def __init__(self, path):
        import onnxruntime as ort

        self.session = ort.InferenceSession(path)
        self.reset_states()

    def reset_states(self):
        self.state = np.zeros((2, 1, 128), dtype=np.float32)
        self.context = np.zeros((1, CONTEXT), dtype=np.float32)
        self.probs = []

    def __call__(self, x, sr):
        x = np.concatenate([self.context, np.asarray(x.a, dtype=np.float32).reshape(1, -1)], axis=1)
        out, self.state = self.session.run(None, {"input": x, "state": self.state, "sr": np.array(sr, dtype=np.int64)})
        self.context = x[:, -CONTEXT:]
        self.probs.append(float(out.item()))
        return out


class TernModel:
    """The same stream through Tern: one request per chunk, the state kept by
    the sequence batcher, the context framed by the client."""

    def __init__(self, client, mod, seq):
        self.client, self.mod, self.seq = client, mod, seq
        self.reset_states()

    def reset_states(self):
        self.context = np.zeros((1, CONTEXT), dtype=np.float32)
        self.probs = []
        self.first = True

    def finish(self):
        """Ends the sequence (the iterator never says it is the last chunk)."""
        self.__call__(type("T", (), {"a": np.zeros(CHUNK, dtype=np.float32)})(), SR, end=True)

    def __call__(self, x, sr, end=False):
        mod = self.mod
        x = np.concatenate([self.context, np.asarray(x.a, dtype=np.float32).reshape(1, -1)], axis=1)
        audio = mod.InferInput("input", [1, CHUNK + CONTEXT], "FP32")
        audio.set_data_from_numpy(x)
        rate = mod.InferInput("sr", [1], "INT64")
        rate.set_data_from_numpy(np.array([sr], dtype=np.int64))
        r = self.client.infer(
            "silero_vad", [audio, rate], sequence_id=self.seq, sequence_start=self.first, sequence_end=end
        )
        self.first = False
        self.context = x[:, -CONTEXT:]
        out = r.as_numpy("output")
        if not end:
            self.probs.append(float(out.item()))
        return out


def stream(model, audio, iterator_class):
    it = iterator_class(model, sampling_rate=SR)
    # The iterator resets the model's state at creation: mark a fresh start.
    events = []
    for i in range(0, len(audio), CHUNK):
        e = it(audio[i : i + CHUNK])
        if e:
            events.append(e)
    return events


def test_silero_vad_streams_match_silero_vads_own_iterator(seq_server):
    """Eight concurrent audio streams (four instance slots: half wait in the
    backlog) over HTTP and gRPC; each stream's speech probabilities and
    speech start/end events equal silero-vad's iterator on the package's
    model run directly."""
    if "silero_vad" not in seq_server.log():
        pytest.fail("model_repository/silero_vad/1/model.onnx is missing (make models)")
    model_path = os.path.join(ROOT, "model_repository", "silero_vad", "1", "model.onnx")
    iterator_class = vad_iterator_class()
    texts = [
        "Tern serves stateful models.",
        "Voice activity detection runs on every chunk of audio.",
        "The state travels from one request to the next.",
        "Edge devices stream speech to the server.",
    ]
    streams = [(i, speech(texts[i % len(texts)], i)) for i in range(8)]
    def run(args):
        i, audio = args
        # One client per thread: tritonclient's HTTP client is not thread-safe.
        mod = (httpclient, grpcclient)[i % 2]
        c = mod.InferenceServerClient(seq_server.url if mod is httpclient else seq_server.grpc_url)
        tern = TernModel(c, mod, f"vad-{i}" if i % 2 else 7000 + i)
        got = stream(tern, audio, iterator_class)
        tern.finish()
        ref = ReferenceModel(model_path)
        want = stream(ref, audio, iterator_class)
        np.testing.assert_allclose(tern.probs, ref.probs, atol=1e-5)
        assert got == want
        return got, max(ref.probs)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, streams))
    for events, peak in results:
        assert peak > 0.5, "the synthetic speech is detected as speech"
        assert events and "start" in events[0] and any("end" in e for e in events), events


def test_warmup_samples_with_the_sequence_controls_run(tmp_path, start_tern):
    """A model_warmup sample that gives the control and state inputs
    (START, END, READY, CORRID, the ACC state) runs on every instance, as
    Triton hands samples to the backend, and the model then serves."""
    from onnx import TensorProto

    root = tmp_path / "models"
    gen_models.sequence_onnx(f"{root}/seq_warm/1/model.onnx", TensorProto.UINT64)
    one = lambda name, dtype: f'inputs {{ key: "{name}" value: {{ data_type: {dtype} dims: [ 1 ] zero_data: true }} }}'
    warmup = "model_warmup [ { name: \"controls\" batch_size: 1 count: 2 " + " ".join(
        one(n, d) for n, d in (("INPUT", "TYPE_INT32"), ("START", "TYPE_INT32"), ("END", "TYPE_FP32"), ("READY", "TYPE_BOOL"),
                               ("CORRID", "TYPE_UINT64"), ("ACC", "TYPE_INT32"))) + " } ]\n"
    (root / "seq_warm" / "config.pbtxt").write_text(gen_models.SEQUENCE_CONFIG.format(
        name="seq_warm", corrid="TYPE_UINT64", idle=1000000, strategy="direct { }", initial="zero_data: true") + warmup)
    t = start_tern([f"--model-repository={root}"])
    assert t.wait_log("warmup sample 'controls' ran 2 time(s)")
    c = grpcclient.InferenceServerClient(t.grpc_url)
    assert out(step(c, grpcclient, "seq_warm", 9, 4, start=True), "OUTPUT") == 4
    assert out(step(c, grpcclient, "seq_warm", 9, 5, end=True), "OUTPUT") == 9


def test_a_state_output_that_is_also_a_model_output_reaches_the_client(tmp_path, start_tern):
    """Triton allows a state's output_name to be a declared output as well:
    the batcher keeps it for the next request and the client gets it."""
    from onnx import TensorProto

    root = tmp_path / "models"
    gen_models.sequence_onnx(f"{root}/seq_acc/1/model.onnx", TensorProto.UINT64)
    cfg = gen_models.SEQUENCE_CONFIG.format(name="seq_acc", corrid="TYPE_UINT64", idle=1000000, strategy="direct { }",
                                            initial="zero_data: true")
    cfg = cfg.replace('output [\n', 'output [\n  { name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] },\n', 1)
    (root / "seq_acc" / "config.pbtxt").write_text(cfg)
    t = start_tern([f"--model-repository={root}"])
    for proto, mod, c in clients(t):
        seq = 11 if proto == "http" else 12
        r = step(c, mod, "seq_acc", seq, 4, start=True)
        assert (out(r, "OUTPUT"), out(r, "ACC_OUT")) == (4, 4)
        r = step(c, mod, "seq_acc", seq, 5, end=True)
        assert (out(r, "OUTPUT"), out(r, "ACC_OUT")) == (9, 9)


SLOW_SEQ = '''name: "slow_seq"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "execute_delay_ms" value: { string_value: "1500" } }
sequence_batching { max_sequence_idle_microseconds: 60000000 direct { } }
'''


@pytest.fixture
def slow_seq(tmp_path, start_tern):
    """One instance with one slot, each execution 1.5 s: a second sequence waits in the backlog."""
    (tmp_path / "models" / "slow_seq" / "1").mkdir(parents=True)
    (tmp_path / "models" / "slow_seq" / "config.pbtxt").write_text(SLOW_SEQ)
    return start_tern([f"--model-repository={tmp_path / 'models'}"])


def slow_step(c, seq, value, start=False, end=False, **kw):
    return c.async_infer("slow_seq", [int_input(grpcclient, "INPUT0", value, shape=(1,))], lambda result, error: kw["done"].put((value, result, error)),
                         sequence_id=seq, sequence_start=start, sequence_end=end, **{k: v for k, v in kw.items() if k != "done"})


def test_a_backlog_sequence_past_its_timeout_fails_whole(slow_seq):
    """As Triton: a request timeout counts while its sequence waits in the
    backlog; at the earliest one, every request of that sequence fails with
    UNAVAILABLE 'timeout of the corresponding sequence has been expired'."""
    import queue

    done = queue.Queue()
    c = grpcclient.InferenceServerClient(slow_seq.grpc_url)
    # Sequence 1 holds the only slot until its END is taken, after its
    # START's 1.5 s run (as in Triton's test_request_timeout: a slot frees
    # when its sequence's END request is taken into a batch).
    slow_step(c, 1, 10, start=True, done=done)
    time.sleep(0.1)
    slow_step(c, 1, 11, end=True, done=done)
    time.sleep(0.1)
    t0 = time.monotonic()
    slow_step(c, 2, 20, start=True, timeout=500_000, done=done)
    time.sleep(0.1)  # separate calls: the START must reach the server first
    slow_step(c, 2, 21, done=done)
    got = {v: (r, e) for v, r, e in (done.get(timeout=10) for _ in range(4))}
    assert got[10][1] is None and got[11][1] is None
    for v in (20, 21):
        e = got[v][1]
        assert e is not None and e.status() == "StatusCode.UNAVAILABLE", e
        assert "timeout of the corresponding sequence has been expired" in e.message()
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        c.infer("slow_seq", [int_input(grpcclient, "INPUT0", 1, shape=(1,))], sequence_id=2)
    assert time.monotonic() - t0 < 5


def test_cancelling_one_queued_request_of_a_sequence_cancels_the_others(slow_seq):
    """As Triton: a cancelled request at the front of its sequence's queue
    ends the sequence: it and the requests behind it are answered CANCELLED;
    the request already running finishes."""
    import queue

    done = queue.Queue()
    c = grpcclient.InferenceServerClient(slow_seq.grpc_url)
    slow_step(c, 5, 1, start=True, done=done)  # runs for 1.5 s
    time.sleep(0.2)
    cancelled = slow_step(c, 5, 2, done=done)
    time.sleep(0.1)
    slow_step(c, 5, 3, done=done)
    time.sleep(0.2)
    cancelled.cancel()
    got = {}
    for _ in range(3):
        v, r, e = done.get(timeout=10)
        got[v] = (r, e)
    assert got[1][1] is None, "the running request finishes"
    assert got[2][1].status() == "StatusCode.CANCELLED"
    assert got[3][1] is not None and got[3][1].status() == "StatusCode.CANCELLED", got[3][1]
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        c.infer("slow_seq", [int_input(grpcclient, "INPUT0", 1, shape=(1,))], sequence_id=5)


def test_a_string_initial_state_file_is_fed_as_it_is(tmp_path, start_tern):
    """Triton copies a TYPE_STRING initial_state data_file into the state as it
    is (serialized BYTES elements); the identity model hands the state back
    through a declared output."""
    root = tmp_path / "models"
    (root / "str_state" / "1").mkdir(parents=True)
    (root / "str_state" / "initial_state").mkdir()
    (root / "str_state" / "initial_state" / "hello.bin").write_bytes((5).to_bytes(4, "little") + b"hello")
    (root / "str_state" / "config.pbtxt").write_text('''name: "str_state"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "STATE_OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
sequence_batching { state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_STRING dims: [ 1 ]
  initial_state { data_type: TYPE_STRING dims: [ 1 ] data_file: "hello.bin" name: "greeting" } } ] }
''')
    t = start_tern([f"--model-repository={root}"])
    c = grpcclient.InferenceServerClient(t.grpc_url)
    r = c.infer("str_state", [int_input(grpcclient, "INPUT0", 1, shape=(1,))], sequence_id=3, sequence_start=True)
    assert r.as_numpy("STATE_OUT").tolist() == [b"hello"]
