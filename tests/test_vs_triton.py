"""Tern against Triton itself: the same unchanged Python-backend model folders
(tests/python_models) served by tritonserver 2.51 (the `nvidia-pytriton` PyPI
wheel, CPU only; `make test-vs-triton` unpacks it under .cache/triton-ref with
scripts/triton_ref.sh) and by Tern with its Python runner, each on its own copy
of the folders, asked the same things through tritonclient over HTTP (binary
and JSON tensors) and gRPC. Compared: every output (values bit for bit,
datatype, shape, names), the model name and version of each response, the
HTTP status or gRPC code of every request Triton refuses or fails (the texts
differ by design and are recorded in $CARGO_TARGET_DIR/test-vs-triton/
messages.json), which models each server reports READY or UNAVAILABLE, model
and server readiness, and model metadata. A difference in Tern's answers that
is known is an xfail (strict) naming the difference: KNOWN.

Run by `make test-vs-triton` only (`make e2e` ignores this file)."""

import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern, tern_bin
from test_python_models import assert_same_bits, decode_numpy_ops, numpy_ops_inputs

MODELS = os.path.join(ROOT, "tests", "python_models")
REF = os.environ.get("TERN_TRITON_REF", os.path.join(ROOT, ".cache", "triton-ref"))
TRITONSERVER = os.path.join(REF, "pytriton", "tritonserver", "bin", "tritonserver")
BACKENDS = os.path.join(REF, "pytriton", "tritonserver", "backends")
REF_VENV_BIN = os.path.join(REF, "venv", "bin")
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
MESSAGES_FILE = os.path.join(TARGET, "test-vs-triton", "messages.json")

GOOD = ("add_sub", "strings", "uses_stdlib", "preprocess", "request_info", "auto_complete", "triton_idioms", "numpy_ops",
        "countdown", "retry_once", "error_midstream")
BAD = ("fails_init", "imports_torch", "syntax_error", "auto_complete_conflict")
PROTOCOLS = ("http-binary", "http-json", "grpc")

# Differences found in Tern's answers, by test id: each is an xfail(strict=True)
# with the difference as its reason, so a fix shows up as an XPASS that fails.
KNOWN = {}

# What each server said when it refused a request, for the record (test id -> server -> text).
MESSAGES = {}


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Triton:
    """tritonserver 2.51 from the wheel on free ports, with the numpy<2 venv first
    on PATH for its Python stub (with numpy 2 the stub corrupts inputs)."""

    def __init__(self, repo, log_path):
        self.repo = repo
        self.log_path = log_path
        self.proc = None

    def start(self):
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = REF_VENV_BIN + os.pathsep + env.get("PATH", "")
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                TRITONSERVER,
                f"--model-repository={self.repo}",
                f"--backend-directory={BACKENDS}",
                "--exit-on-error=false",
                "--http-address=127.0.0.1",
                f"--http-port={self.http_port}",
                "--grpc-address=127.0.0.1",
                f"--grpc-port={self.grpc_port}",
                "--metrics-address=127.0.0.1",
                f"--metrics-port={self.metrics_port}",
            ],
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait_live(self, timeout=120):
        """True once HTTP and gRPC answer (Triton starts them after loading every
        model); False when the process ended (a port taken in between)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/live", timeout=2) as r:
                    if r.status == 200 and grpcclient.InferenceServerClient(self.grpc_url).is_server_live():
                        return True
            except (OSError, InferenceServerException):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"tritonserver did not come up in {timeout} s:\n" + self.log())

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log_file.close()


@contextlib.contextmanager
def serve_both(models, base, tern_args=()):
    """tritonserver 2.51 and Tern, each on its own copy of the folders in
    `models` (under `base`); yields {"triton": ..., "tern": ...}."""
    if not os.access(TRITONSERVER, os.X_OK) or not os.path.exists(os.path.join(REF, ".stamp")):
        pytest.fail(f"Triton 2.51 is not unpacked under {REF}: run `make test-vs-triton` (scripts/triton_ref.sh)")
    runner = os.path.join(os.path.dirname(tern_bin()), "python-runner.wasm")
    if not os.path.isfile(runner):
        pytest.fail(f"the Python runner is not at {runner}: run `make python-runner` (make test-vs-triton does)")
    triton_repo, tern_repo = str(base / "triton-models"), str(base / "tern-models")
    shutil.copytree(models, triton_repo)
    shutil.copytree(models, tern_repo)

    triton = Triton(triton_repo, str(base / "triton.log"))
    triton.start()  # loads its models while Tern starts
    # The runner's compiled code is cached beside the binary: only the first run of a build compiles it.
    cache = os.path.join(os.path.dirname(tern_bin()), "test-vs-triton-wasm-cache")
    tern = None
    try:
        tern = Tern([f"--model-repository={tern_repo}", *tern_args, f"--python-runner={runner}",
                     f"--wasm-cache-dir={cache}"])
        for _ in range(3):  # a free port can be taken before Triton binds it: start again on others
            if triton.wait_live():
                break
            log = triton.log()
            triton.stop()
            if "already in use" not in log.lower():
                raise RuntimeError("tritonserver exited:\n" + log)
            triton.start()
        else:
            raise RuntimeError("tritonserver found no free ports:\n" + triton.log())
        yield {"triton": triton, "tern": tern}
    finally:
        triton.stop()
        if tern is not None:
            tern.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    try:
        with serve_both(MODELS, tmp_path_factory.mktemp("vs-triton"), ["--exit-on-error=false"]) as both:
            yield both
    finally:
        os.makedirs(os.path.dirname(MESSAGES_FILE), exist_ok=True)
        with open(MESSAGES_FILE, "w") as f:
            json.dump(MESSAGES, f, indent=1, ensure_ascii=False, sort_keys=True)


# ---------------------------------------------------------------------------
# One request, sent the same way to each server; its answer in plain data.


class Ok:
    def __init__(self, model_name, model_version, outputs):
        self.model_name, self.model_version, self.outputs = model_name, model_version, outputs

    def __repr__(self):
        return f"Ok({self.model_name!r}, {self.model_version!r}, {self.outputs!r})"


class Err:
    def __init__(self, status, message):
        self.status, self.message = status, message

    def __repr__(self):
        return f"Err({self.status!r}, {self.message!r})"


def infer(server, proto, model, inputs, outputs, version=""):
    """inputs: [(name, array, datatype)]; outputs: names to ask for (binary or
    JSON as the protocol says). An answer: Ok(name, version, {output: (datatype,
    shape, array)}) or Err(HTTP status / gRPC code, message)."""
    http = proto.startswith("http")
    mod = httpclient if http else grpcclient
    ins = []
    for name, value, datatype in inputs:
        t = mod.InferInput(name, list(value.shape), datatype)
        if http:
            t.set_data_from_numpy(value, binary_data=proto == "http-binary")
        else:
            t.set_data_from_numpy(value)
        ins.append(t)
    if http:
        outs = [httpclient.InferRequestedOutput(n, binary_data=proto == "http-binary") for n in outputs]
        c = httpclient.InferenceServerClient(server.url)
    else:
        outs = [grpcclient.InferRequestedOutput(n) for n in outputs]
        c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        r = c.infer(model, ins, model_version=version, outputs=outs)
    except InferenceServerException as e:
        return Err(e.status(), e.message())
    finally:
        c.close()
    response = r.get_response()
    got = {}
    if http:
        for o in response["outputs"]:
            got[o["name"]] = (o["datatype"], list(o["shape"]), r.as_numpy(o["name"]))
        return Ok(response["model_name"], response["model_version"], got)
    for o in response.outputs:
        got[o.name] = (o.datatype, list(o.shape), r.as_numpy(o.name))
    return Ok(response.model_name, response.model_version, got)


def assert_same_answer(triton, tern):
    assert isinstance(tern, type(triton)), f"Triton answered {triton}, Tern answered {tern}"
    if isinstance(triton, Err):
        assert tern.status == triton.status, f"Triton: {triton}\nTern: {tern}"
        return
    assert (tern.model_name, tern.model_version) == (triton.model_name, triton.model_version), f"Triton: {triton}\nTern: {tern}"
    assert sorted(tern.outputs) == sorted(triton.outputs), f"Triton: {triton}\nTern: {tern}"
    for name, (datatype, shape, value) in triton.outputs.items():
        t_datatype, t_shape, t_value = tern.outputs[name]
        assert (t_datatype, t_shape) == (datatype, shape), f"{name}: Triton {datatype} {shape}, Tern {t_datatype} {t_shape}"
        np.testing.assert_array_equal(t_value, value, strict=True, err_msg=name)
        if value.dtype != np.object_:  # bit for bit: -0.0, NaN
            assert t_value.tobytes() == value.tobytes(), f"{name}: Triton {value!r}, Tern {t_value!r}"


def compare(servers, proto, model, inputs, outputs, version="", record=None):
    answers = {k: infer(s, proto, model, inputs, outputs, version) for k, s in servers.items()}
    if record is not None:
        MESSAGES[record] = {k: (a.__dict__ if isinstance(a, Err) else "ok") for k, a in answers.items()}
    assert_same_answer(answers["triton"], answers["tern"])
    return answers["triton"]


def case_params(cases, protocols=PROTOCOLS):
    """pytest params (case x protocol) with ids `<case>-<protocol>`, KNOWN ones as strict xfails."""
    params = []
    for case_id, case in cases.items():
        for proto in protocols:
            if proto == "http-json" and case.get("binary_only"):
                continue
            test_id = f"{case_id}-{proto}"
            marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN[test_id])] if test_id in KNOWN else []
            params.append(pytest.param(case, proto, id=test_id, marks=marks))
    return params


# ---------------------------------------------------------------------------
# Answers: add_sub (FP32 [4]), strings (BYTES [-1], max_batch_size 8), uses_stdlib (INT64 [-1]).

f32 = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731
rng = np.random.default_rng(7)

ADD_SUB = {
    "small": (f32(1, 2, 3, 4), f32(0.5, 0.25, -1, 8)),
    "zeros": (f32(0, 0, 0, 0), f32(-0.0, 0, -0.0, 0)),
    "random": tuple(rng.standard_normal((2, 4)).astype(np.float32) * 1000),
    "extremes": (f32(3.4e38, -3.4e38, 1e-45, 1.17549435e-38), f32(3.4e38, 3.4e38, 1e-45, -1e-45)),
    "inf": (f32(np.inf, -np.inf, np.inf, 1), f32(1, 2, np.inf, -np.inf)),
    "nan": (f32(np.nan, 1, 2, 3), f32(1, np.nan, 0, 0)),
}


@pytest.mark.parametrize("case,proto", case_params({k: {"a": v[0], "b": v[1]} for k, v in ADD_SUB.items()}))
def test_add_sub_answers_as_triton(servers, case, proto):
    a, b = case["a"], case["b"]
    ok = compare(servers, proto, "add_sub", [("INPUT0", a, "FP32"), ("INPUT1", b, "FP32")], ["OUTPUT0", "OUTPUT1"])
    # Triton's own answer is right (a stub on numpy 2 would corrupt it).
    with np.errstate(over="ignore", invalid="ignore"):
        a_plus_b, a_minus_b = a + b, a - b
    np.testing.assert_array_equal(ok.outputs["OUTPUT0"][2], a_plus_b, strict=True)
    np.testing.assert_array_equal(ok.outputs["OUTPUT1"][2], a_minus_b, strict=True)


def obj(rows):
    return np.array([[v.encode() if isinstance(v, str) else v for v in row] for row in rows], dtype=np.object_)


STRINGS = {
    "mixed": {"text": obj([["hello", "Tern"], ["", "\u00e9t\u00e9"]])},
    "one_empty": {"text": obj([[""]])},
    "all_empty": {"text": obj([["", "", ""], ["", "", ""]])},
    "non_ascii": {"text": obj([["stra\u00dfe", "\u01c6", "\u65e5\u672c\u8a9e", "\ufb01", "\U0001f600 ok", "\u0131i\u0130I"]])},
    "batch_of_8": {"text": obj([[f"row {i}", "x" * i, "\u00c5\u00e5"] for i in range(8)])},
    "long": {"text": obj([["abc" * 20000]])},
    "no_elements": {"text": np.zeros((2, 0), dtype=np.object_)},
    "raw_bytes": {"text": obj([[b"\xff\xfe\x00a", b"\x00", b"caf\xe9"]]), "binary_only": True},
}


@pytest.mark.parametrize("case,proto", case_params(STRINGS))
def test_strings_answer_as_triton(servers, case, proto):
    ok = compare(servers, proto, "strings", [("TEXT", case["text"], "BYTES")], ["UPPER", "LENGTHS"])
    assert isinstance(ok, Ok), f"Triton refused it: {ok}"
    as_bytes = [[t.encode() if isinstance(t, str) else t for t in row] for row in ok.outputs["UPPER"][2].tolist()]
    assert as_bytes == [[t.upper() for t in row] for row in case["text"].tolist()]  # JSON gives str, binary bytes


i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731

STDLIB = {
    "example": {"values": i64(3, 1, 3, 2, 3)},
    "one": {"values": i64(7)},
    "tie": {"values": i64(2, 1, 1, 2)},
    "negative": {"values": i64(-5, 5, -5)},
    "huge": {"values": i64(2**62, 2**62, -(2**63), 2**63 - 1)},
    "thousand": {"values": np.arange(1000, dtype=np.int64) % 37},
}


@pytest.mark.parametrize("case,proto", case_params(STDLIB))
def test_uses_stdlib_answers_as_triton(servers, case, proto):
    ok = compare(servers, proto, "uses_stdlib", [("IN", case["values"], "INT64")], ["OUT"])
    assert json.loads(ok.outputs["OUT"][2][0])["count"] == len(case["values"])


# triton_idioms: what Triton's own qa/python_models use — Logger.log and its
# levels, unittest.main("model", exit=False), ndarray.flat, np.repeat, np.ubyte.
IDIOMS = {
    "small": {"values": np.array([1, 2, 3], dtype=np.int32)},
    "one": {"values": np.array([300], dtype=np.int32)},
    "negative": {"values": np.array([-1, -200, 7, 255, 256], dtype=np.int32)},
}


@pytest.mark.parametrize("case,proto", case_params(IDIOMS))
def test_triton_idioms_answer_as_triton(servers, case, proto):
    ok = compare(servers, proto, "triton_idioms", [("IN", case["values"], "INT32")], ["REPEATED", "FLAT", "UBYTE", "REPORT"])
    assert isinstance(ok, Ok), f"Triton refused it: {ok}"
    report = json.loads(ok.outputs["REPORT"][2][0])
    assert report["tests_run"] == 1 and report["ok"], report


# auto_complete: config.pbtxt names only the backend; auto_complete_config
# declares the tensors, max_batch_size 8 and dynamic batching.
AUTO_COMPLETE = {
    "one": {"a": f32(1, 2, 3, 4).reshape(1, 4), "b": f32(1, 2, 3, 4).reshape(1, 4)},
    "batch_of_3": {"a": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal((3, 4)).astype(np.float32)},
}


@pytest.mark.parametrize("case,proto", case_params(AUTO_COMPLETE))
def test_auto_completed_model_answers_as_triton(servers, case, proto):
    ok = compare(servers, proto, "auto_complete", [("INPUT0", case["a"], "FP32"), ("INPUT1", case["b"], "FP32")],
                 ["OUTPUT0", "CONFIG"])
    seen = json.loads(ok.outputs["CONFIG"][2][0][0])  # what initialize was given
    assert seen == {"dynamic_batching": True, "inputs": ["INPUT0", "INPUT1"], "max_batch_size": 8,
                    "outputs": ["OUTPUT0", "CONFIG"]}


def test_auto_completed_config_is_triton_s(servers):
    def config(server):
        c = httpclient.InferenceServerClient(server.url).get_model_config("auto_complete")
        return {k: c.get(k) for k in ("max_batch_size", "input", "output", "dynamic_batching", "backend", "platform")}

    got = {k: config(s) for k, s in servers.items()}
    assert got["tern"] == got["triton"]
    assert got["triton"]["max_batch_size"] == 8 and len(got["triton"]["input"]) == 2


@pytest.mark.parametrize("proto", ["http", "grpc"])
@pytest.mark.parametrize("timeout", [None, 2_000_000])
def test_request_accessors_answer_as_triton(servers, proto, timeout):
    """`request.request_id()`, `request.timeout()` (the client's `timeout`
    parameter in microseconds, 0 without one) and `request.parameters()`
    (the client's own parameters, without the ones the server consumes) read
    the same on both servers."""
    answers = {}
    for name, server in servers.items():
        mod = httpclient if proto == "http" else grpcclient
        c = mod.InferenceServerClient(server.url if proto == "http" else server.grpc_url)
        x = mod.InferInput("IN", [1], "INT32")
        x.set_data_from_numpy(np.array([1], dtype=np.int32))
        kwargs = {"parameters": {"colour": "blue", "level": 3}}
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            r = c.infer("request_info", [x], request_id="r-7", **kwargs)
            answers[name] = json.loads(r.as_numpy("OUT")[0])
        except InferenceServerException as e:
            answers[name] = ("error", e.status(), e.message())
        finally:
            c.close()
    assert answers["tern"] == answers["triton"], answers
    assert answers["triton"]["timeout"] == (timeout or 0) and answers["triton"]["request_id"] == "r-7", answers


u8 = np.random.default_rng(11)
PREPROCESS = {
    "one_image": {"image": u8.integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)},
    "batch_of_4": {"image": u8.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)},
    "flat": {"image": np.full((2, 32, 32, 3), 128, dtype=np.uint8)},
}


@pytest.mark.parametrize("case,proto", case_params(PREPROCESS))
def test_numpy_preprocessing_answers_as_triton(servers, case, proto):
    ok = compare(servers, proto, "preprocess", [("IMAGE", case["image"], "UINT8")], ["TENSOR", "BRIGHTEST"])
    assert isinstance(ok, Ok), f"Triton refused it: {ok}"
    assert ok.outputs["TENSOR"][2].shape == (case["image"].shape[0], 3, 32, 32)


@pytest.mark.parametrize("proto", ["http-binary", "grpc"])
def test_numpy_array_work_answers_as_triton(servers, proto):
    """numpy_ops: float arithmetic, casts, transposes and argmax on request
    tensors (kept in the host by Tern's runner, real numpy in Triton's stub),
    every result bit for bit."""
    inputs = numpy_ops_inputs()
    datatypes = {"X": "FP32", "U": "UINT8", "I": "INT32", "D": "FP64"}
    answers = {k: infer(s, proto, "numpy_ops", [(n, v, datatypes[n]) for n, v in inputs.items()], ["RESULTS"])
               for k, s in servers.items()}
    got = {}
    for k, a in answers.items():
        assert isinstance(a, Ok), (k, a)
        got[k] = decode_numpy_ops(a.outputs["RESULTS"][2])
    (tern, tern_held), (triton, triton_held) = got["tern"], got["triton"]
    assert triton_held == [] and "preprocess" in tern_held, (triton_held, tern_held)
    assert sorted(tern) == sorted(triton)
    for name in triton:
        assert_same_bits(name, tern[name], triton[name])


# ---------------------------------------------------------------------------
# Request rescheduling (`iterative_sequence`): countdown (decoupled) answers
# once per run, retry_once (not decoupled) answers on its second run.


def stream_answers(server, model, inputs, outputs, stop, wait=30, **options):
    """What one request to a decoupled model gets over a gRPC stream, as plain
    data: each response's `outputs` (and its final flag), or its error, until
    `stop(answers)` says the stream has ended or nothing more comes within
    `wait` seconds."""
    got = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    ins = []
    for name, value, datatype in inputs:
        t = grpcclient.InferInput(name, list(value.shape), datatype)
        t.set_data_from_numpy(value)
        ins.append(t)
    c.async_stream_infer(model, ins, **options)
    answers = []
    try:
        while not stop(answers):
            try:
                result, error = got.get(timeout=wait)
            except queue.Empty:
                answers.append("(nothing more)")
                break
            if error is not None:
                answers.append(("error", error.message()))
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param \
                if "triton_final_response" in response.parameters else None
            values = {n: result.as_numpy(n).tolist() for n in outputs if result.as_numpy(n) is not None}
            answers.append((values, final))
    finally:
        c.stop_stream(cancel_requests=True)  # a stream without the final flag ends here
        c.close()
    return answers


def countdown_stream(server, count, **sequence):
    """The responses of one countdown request (the last has LEFT 0)."""
    answers = stream_answers(server, "countdown", [("COUNT", np.array([count], dtype=np.int32), "INT32")],
                             ("LEFT", "RUN", "FLAGS", "HAS_ID", "ACTIVE"),
                             lambda a: bool(a) and (not isinstance(a[-1], tuple) or a[-1][0] == "error"
                                                    or a[-1][0].get("LEFT") == [0]), **sequence)
    return [a[0] if isinstance(a, tuple) and a[0] != "error" else a for a in answers]


def generate_stream(server, model, body):
    request = urllib.request.Request(f"http://{server.url}/v2/models/{model}/generate_stream",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return [json.loads(line[len("data: "):]) for line in r.read().decode().splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("how", ["implicit", "client_id", "one"])
def test_rescheduled_decoupled_requests_answer_as_triton(servers, how):
    count, sequence = {"implicit": (3, {}), "client_id": (2, {"sequence_id": 4242, "sequence_start": True}),
                       "one": (1, {})}[how]
    answers = {k: countdown_stream(s, count, **sequence) for k, s in servers.items()}
    assert answers["tern"] == answers["triton"]
    assert [a["RUN"] for a in answers["tern"]] == [[n] for n in range(1, count + 1)]
    assert [a["FLAGS"] for a in answers["tern"]] == [[1]] + [[0]] * (count - 1)


def test_a_rescheduled_request_keeps_its_slot_as_on_triton(servers):
    """A rescheduled request stays in its sequence's slot: on countdown's one
    slot (max_batch_size 0) a second request sent while a long countdown runs
    starts only once the long one has ended, on both servers; the long one's
    stream stays open across its runs. The model's ACTIVE output (sequences
    begun and not ended, at each run) tells it exactly: the second request's
    runs see what a request alone sees, not one more."""
    for k, s in servers.items():
        alone = [a["ACTIVE"] for a in countdown_stream(s, 1)]
        got = queue.Queue()
        c = grpcclient.InferenceServerClient(s.grpc_url)
        c.start_stream(callback=lambda result, error: got.put((result, error)))
        t = grpcclient.InferInput("COUNT", [1], "INT32")
        t.set_data_from_numpy(np.array([300], dtype=np.int32))
        c.async_stream_infer("countdown", [t])
        try:
            result, error = got.get(timeout=30)
            assert error is None, (k, error)
            short = countdown_stream(s, 2)
            assert [a["RUN"] for a in short] == [[1], [2]], (k, short)
            assert [a["ACTIVE"] for a in short] == alone * 2, \
                f"{k}: the second request ran while the first one was still running: {short}"
            # The long stream answers all its 300 runs, its last with LEFT 0.
            for _ in range(299):
                result, error = got.get(timeout=30)
                assert error is None, (k, error)
            assert result.as_numpy("LEFT").tolist() == [0], k
        finally:
            c.stop_stream(cancel_requests=True)
            c.close()


def test_rescheduled_requests_stream_through_generate_as_on_triton(servers):
    answers = {k: generate_stream(s, "countdown", {"COUNT": 2}) for k, s in servers.items()}
    assert answers["tern"] == answers["triton"] and len(answers["tern"]) == 2


@pytest.mark.parametrize("empty_final", [True, False])
def test_error_responses_inside_a_stream_answer_as_triton(servers, empty_final):
    """error_midstream: responses and error responses, then the final flag
    alone; an error response ends nothing, the final flag ends the stream."""
    def ended(answers):
        return bool(answers) and (answers[-1] == "(nothing more)" or answers[-1][1] is True)
    answers = {k: stream_answers(s, "error_midstream", [("N", np.array([5], dtype=np.int32), "INT32")], ("I",),
                                 ended, wait=30 if empty_final else 3, enable_empty_final_response=empty_final)
               for k, s in servers.items()}
    assert answers["tern"] == answers["triton"]
    assert answers["tern"][:5] == [({"I": [0]}, False), ("error", "odd value 1 refused"), ({"I": [2]}, False),
                                   ("error", "odd value 3 refused"), ({"I": [4]}, False)]
    assert answers["tern"][5:] == ([({}, True)] if empty_final else ["(nothing more)"])


def test_error_responses_inside_a_generate_stream_answer_as_triton(servers):
    answers = {k: generate_stream(s, "error_midstream", {"N": 4}) for k, s in servers.items()}
    assert answers["tern"] == answers["triton"] and len(answers["tern"]) == 4


@pytest.mark.parametrize("proto", PROTOCOLS)
def test_rescheduled_requests_answer_as_triton(servers, proto):
    a, b = f32(1.5, -2, 3, 4), f32(0.25, 8, -1, 1e-3)
    ok = compare(servers, proto, "retry_once", [("INPUT0", a, "FP32"), ("INPUT1", b, "FP32")], ["OUTPUT0", "RUNS"])
    assert isinstance(ok, Ok) and ok.outputs["RUNS"][2].tolist() == [2], ok
    # A response for a request it rescheduled: Triton's refusal.
    answers = {k: infer(s, proto, "retry_once", [("INPUT0", -a, "FP32"), ("INPUT1", b, "FP32")], ["OUTPUT0"])
               for k, s in servers.items()}
    assert_same_answer(answers["triton"], answers["tern"])
    for a in answers.values():
        assert "Expected a None object in the execute function return list for reschduled request" in a.message


# ---------------------------------------------------------------------------
# Requests Triton refuses (or fails): the same HTTP status / gRPC code.

ONES = f32(1, 1, 1, 1)
ERRORS = {
    "add_sub_wrong_input_name": ("add_sub", [("INPUT0", ONES, "FP32"), ("INPUT2", ONES, "FP32")], ["OUTPUT0"], ""),
    "add_sub_wrong_dtype": ("add_sub", [("INPUT0", ONES.astype(np.int32), "INT32"), ("INPUT1", ONES, "FP32")], ["OUTPUT0"], ""),
    "add_sub_fp64": ("add_sub", [("INPUT0", ONES.astype(np.float64), "FP64"), ("INPUT1", ONES.astype(np.float64), "FP64")], ["OUTPUT0"], ""),
    "add_sub_wrong_shape": ("add_sub", [("INPUT0", f32(1, 2, 3, 4, 5), "FP32"), ("INPUT1", f32(1, 2, 3, 4, 5), "FP32")], ["OUTPUT0"], ""),
    "add_sub_2d_shape": ("add_sub", [("INPUT0", ONES.reshape(2, 2), "FP32"), ("INPUT1", ONES.reshape(2, 2), "FP32")], ["OUTPUT0"], ""),
    "add_sub_missing_input": ("add_sub", [("INPUT0", ONES, "FP32")], ["OUTPUT0"], ""),
    "add_sub_extra_input": ("add_sub", [("INPUT0", ONES, "FP32"), ("INPUT1", ONES, "FP32"), ("INPUT2", ONES, "FP32")], ["OUTPUT0"], ""),
    "add_sub_unknown_output": ("add_sub", [("INPUT0", ONES, "FP32"), ("INPUT1", ONES, "FP32")], ["OUTPUT9"], ""),
    "add_sub_missing_version": ("add_sub", [("INPUT0", ONES, "FP32"), ("INPUT1", ONES, "FP32")], ["OUTPUT0"], "2"),
    "unknown_model": ("no_such_model", [("INPUT0", ONES, "FP32")], ["OUTPUT0"], ""),
    "unavailable_model": ("imports_torch", [("IN", f32(1), "FP32")], ["OUT"], ""),
    "strings_batch_over_max": ("strings", [("TEXT", obj([["a"]] * 9), "BYTES")], ["UPPER"], ""),
    "strings_no_batch_dim": ("strings", [("TEXT", np.array([b"a", b"b"], dtype=np.object_), "BYTES")], ["UPPER"], ""),
    "strings_wrong_dtype": ("strings", [("TEXT", np.ones((1, 2), dtype=np.int32), "INT32")], ["UPPER"], ""),
    "uses_stdlib_empty": ("uses_stdlib", [("IN", np.zeros(0, dtype=np.int64), "INT64")], ["OUT"], ""),  # raises in execute
    "uses_stdlib_wrong_dtype": ("uses_stdlib", [("IN", f32(1, 2), "FP32")], ["OUT"], ""),
}


@pytest.mark.parametrize("case,proto", case_params({k: {"args": v} for k, v in ERRORS.items()}))
def test_refused_requests_fail_as_on_triton(servers, case, proto, request):
    model, inputs, outputs, version = case["args"]
    answer = compare(servers, proto, model, inputs, outputs, version, record=request.node.callspec.id)
    assert isinstance(answer, Err), f"Triton accepted it: {answer}"


# ---------------------------------------------------------------------------
# Repository, readiness and metadata.


def index(server):
    return {m["name"]: m for m in httpclient.InferenceServerClient(server.url).get_model_repository_index()}


def test_the_same_models_are_ready_and_unavailable(servers):
    got = {k: index(s) for k, s in servers.items()}
    MESSAGES["repository_index"] = {k: {n: m.get("reason", "") for n, m in i.items()} for k, i in got.items()}
    states = {k: {n: (m.get("version"), m.get("state")) for n, m in i.items()} for k, i in got.items()}
    assert states["tern"] == states["triton"]
    assert states["triton"] == {**{n: ("1", "READY") for n in GOOD}, **{n: ("1", "UNAVAILABLE") for n in BAD}}
    for k, i in got.items():  # each server says why; the words are its own
        for n in BAD:
            assert i[n].get("reason"), (k, n, i[n])


def http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def readiness(server):
    h = httpclient.InferenceServerClient(server.url)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    out = {"server": (h.is_server_ready(), g.is_server_ready(), h.is_server_live(), g.is_server_live(),
                      http_status(f"http://{server.url}/v2/health/ready"))}
    for n in GOOD + BAD + ("no_such_model",):
        out[n] = (http_status(f"http://{server.url}/v2/models/{n}/ready"), h.is_model_ready(n), g.is_model_ready(n))
    return out


def test_server_and_model_readiness_match(servers):
    got = {k: readiness(s) for k, s in servers.items()}
    assert got["tern"] == got["triton"]
    # Triton's strict readiness: a repository with a model that failed to load is not ready.
    assert got["triton"]["server"] == (False, False, True, True, 400)


def metadata(server, proto, model):
    if proto == "grpc":
        m = grpcclient.InferenceServerClient(server.grpc_url).get_model_metadata(model, as_json=True)
    else:
        m = httpclient.InferenceServerClient(server.url).get_model_metadata(model)
    io = lambda ts: [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in ts]  # noqa: E731
    return {"name": m["name"], "versions": m.get("versions"), "platform": m.get("platform", ""),
            "inputs": io(m.get("inputs", [])), "outputs": io(m.get("outputs", []))}


@pytest.mark.parametrize("proto", ["http", "grpc"])
@pytest.mark.parametrize("model", GOOD)
def test_model_metadata_matches(servers, model, proto):
    got = {k: metadata(s, proto, model) for k, s in servers.items()}
    assert got["tern"] == got["triton"]


TRACE_UPDATES = [
    "{}",
    '{"trace_rate":"abc"}',
    '{"trace_rate":"12abc"}',
    '{"trace_rate":"3000000000"}',
    '{"trace_count":"-2"}',
    '{"trace_count":"7"}',
    '{"log_frequency":"x"}',
    '{"log_frequency":"3"}',
    '{"trace_level":["BAD"]}',
    '{"trace_level":[]}',
    '{"trace_level":["TIMESTAMPS","OFF"]}',
    '{"trace_level":["TIMESTAMPS"]}',
    '{"trace_level":["TENSORS"],"trace_rate":"0"}',
    '{"trace_file":"/tmp/x.json"}',
    '{"trace_rate":5}',
    '{"trace_level":"TIMESTAMPS"}',
    '{"foo":"bar"}',
    '{"trace_rate":null,"trace_count":null,"log_frequency":null}',
]


@pytest.mark.parametrize("route", ["/v2/trace/setting", "/v2/models/add_sub/trace/setting", "/v2/models/nosuch/trace/setting"])
def test_trace_settings_answer_as_triton(servers, route):
    """The trace extension: the same status and body for every update, byte for byte, in order."""

    def call(server, body=None):
        req = urllib.request.Request(f"http://{server.url}{route}", data=None if body is None else body.encode(),
                                     method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    for body in [None, *TRACE_UPDATES, None]:
        got = {name: call(s, body) for name, s in servers.items()}
        if got["triton"][0] >= 500 and got["tern"][0] >= 500:
            # Both refuse a wrong JSON type as an internal error; the parser texts differ.
            continue
        assert got["tern"] == got["triton"], body


def test_trace_settings_over_grpc_answer_as_triton(servers):
    def settings(server, **kw):
        c = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            return c.update_trace_settings(as_json=True, **kw)["settings"] if kw else c.get_trace_settings(as_json=True)["settings"]
        except InferenceServerException as e:
            return (e.status(), e.message())

    for kw in [{}, {"settings": {"trace_rate": "9"}}, {"settings": {"trace_count": "-2"}}, {"settings": {"trace_file": "/x"}},
               {"model_name": "add_sub", "settings": {"trace_count": "4"}}, {"settings": {"trace_rate": None}},
               {"model_name": "add_sub", "settings": {"trace_count": None}}, {"model_name": "nosuch", "settings": {"trace_rate": "1"}}]:
        got = {name: settings(s, **kw) for name, s in servers.items()}
        assert got["tern"] == got["triton"], kw
