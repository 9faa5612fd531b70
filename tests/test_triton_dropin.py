"""Triton drop-in behaviour, end to end through the binary with tritonclient:
tritonserver command lines, startup failures, ensembles mixing batching and
non-batching steps, reshape with variable dims, very large config values,
normalised configs, dynamic-batcher timing, queue timeouts while busy, gRPC
deadlines, ensemble classification labels and shutdown in poll mode. Each
test is written from Triton's documented (or source) behaviour."""

import json
import os
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from conftest import Tern
from gen_models import identity_onnx, io_config, write


def get(url, path):
    try:
        with urllib.request.urlopen(f"http://{url}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def ident(root, name, max_batch, dims, extra=""):
    write(f"{root}/{name}/config.pbtxt", io_config(name, "TYPE_FP32", dims, max_batch, "identity", extra))
    write(f"{root}/{name}/1/.keep", "")


def ensemble(root, name, max_batch, model, in_dims, out_dims, in_extra="", out_label=""):
    d = lambda dims: ", ".join(str(x) for x in dims)  # noqa: E731
    write(
        f"{root}/{name}/config.pbtxt",
        f'''name: "{name}"
platform: "ensemble"
max_batch_size: {max_batch}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {d(in_dims)} ] {in_extra} }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {d(out_dims)} ] {out_label} }} ]
ensemble_scheduling {{ step [ {{ model_name: "{model}" model_version: -1
  input_map {{ key: "INPUT0" value: "IN" }} output_map {{ key: "OUTPUT0" value: "OUT" }} }} ] }}
''',
    )
    write(f"{root}/{name}/1/.keep", "")


@pytest.fixture(scope="module")
def dropin_repo(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dropin") / "models")
    # The three ensembles of the issue: Triton serves them all.
    ident(root, "ident_nobatch", 0, [-1, -1])
    ident(root, "ident_batch", 8, [-1])
    ident(root, "ident_412", 8, [4, 1, 2])
    ensemble(root, "ens_batch_over_nobatch", 8, "ident_nobatch", [16], [16])
    ensemble(root, "ens_nobatch_over_batch", 0, "ident_batch", [16], [1, 16])
    ensemble(root, "ens_reshape", 8, "ident_412", [8], [4, 1, 2], in_extra="reshape { shape: [ 4, 1, 2 ] }")
    ensemble(root, "ens_out_reshape", 8, "ident_412", [4, 1, 2], [8], out_label="reshape { shape: [ 4, 1, 2 ] }")
    # reshape with a variable dimension, served by ONNX Runtime.
    identity_onnx(f"{root}/reshape_var/1/model.onnx", TensorProto.FLOAT, ["b", 8, "n", 1, 6])
    write(
        f"{root}/reshape_var/config.pbtxt",
        '''name: "reshape_var"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ] reshape { shape: [ 8, -1, 1, 6 ] } } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 8, -1, 1, 6 ] } ]
''',
    )
    # Very large but valid values.
    ident(
        root,
        "huge_priorities",
        8,
        [-1],
        "dynamic_batching { priority_levels: 18446744073709551615 default_priority_level: 4294967296 }",
    )
    # Preferred [2, 6], max 8, 10 s queue delay: a request of 7 must not wait.
    ident(root, "batch_at_once", 8, [-1], "dynamic_batching { preferred_batch_size: [ 2, 6 ] max_queue_delay_microseconds: 10000000 }")
    # One slow instance, and queued requests that time out after 200 ms.
    ident(
        root,
        "slow_timeout",
        8,
        [-1],
        'instance_group [ { kind: KIND_CPU count: 1 } ]\n'
        'parameters { key: "execute_delay_ms" value: { string_value: "1500" } }\n'
        "dynamic_batching { default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 200000 } }",
    )
    ident(root, "slow", 8, [-1], 'parameters { key: "execute_delay_ms" value: { string_value: "2000" } }')
    # Classification through an ensemble: the composing model's labels.
    ident(root, "labelled", 8, [20])
    with open(f"{root}/labelled/config.pbtxt", "a") as f:
        pass
    cfg = open(f"{root}/labelled/config.pbtxt").read().replace(
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 20 ] } ]',
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 20 ] label_filename: "labels.txt" } ]',
    )
    write(f"{root}/labelled/config.pbtxt", cfg)
    write(f"{root}/labelled/labels.txt", "".join(f"label{i}\n" for i in range(20)))
    ensemble(root, "ens_labelled", 8, "labelled", [20], [20])
    return root


@pytest.fixture(scope="module")
def dropin(dropin_repo):
    t = Tern([f"--model-repository={dropin_repo}"])
    yield t
    t.stop()


# --- the tritonserver command line ------------------------------------------


def test_triton_command_line_forms(start_tern, dropin_repo):
    # Booleans as 1/0/on/off in any case, a repeated flag (last wins), and
    # unambiguous prefixes of long flags, as getopt_long accepts them.
    t = start_tern(
        [
            f"--model-repository={dropin_repo}",
            "--log-info=1",
            "--log-verbose",
            "2",
            "--log-verbose",
            "0",
            "--log-warn=false",
            "--strict-readiness=ON",
            "--exit-on-err=Off",
        ]
    )
    c = httpclient.InferenceServerClient(t.url)
    meta = c.get_server_metadata()
    assert meta["name"] == "triton", "Triton's default --id, which client examples check"
    assert "tern" in meta["extensions"]
    assert c.is_server_ready()


def test_tritons_jetson_command_line_starts_the_server(start_tern, dropin_repo):
    """Triton's Jetson instructions start tritonserver with a backend folder,
    a minimum compute capability and python backend settings: accepted, each
    logged as having no effect."""
    t = start_tern([
        f"--model-repository={dropin_repo}",
        "--backend-directory=/opt/tritonserver/backends",
        "--min-supported-compute-capability=5.3",
        "--backend-config=python,shm-default-byte-size=2097152",
    ])
    assert httpclient.InferenceServerClient(t.url).is_server_ready()
    log = t.log()
    assert "--backend-directory '/opt/tritonserver/backends' has no effect" in log
    assert "--min-supported-compute-capability 5.3 has no effect" in log
    assert "--backend-config 'python,shm-default-byte-size=2097152' has no effect in Tern" in log


def test_bad_boolean_is_refused_with_tritons_words(tmp_path):
    t = Tern([f"--model-repository={tmp_path}", "--log-info=yes"], wait_ready=False)
    assert t.wait() != 0
    assert "invalid value for bool option: yes" in t.log()


def test_missing_repository_without_exit_on_error(start_tern, tmp_path):
    missing = tmp_path / "nowhere"
    t = start_tern([f"--model-repository={missing}", "--exit-on-error=false"])
    # As tritonserver: up and answering metadata, but not live (it failed to
    # initialise) and not ready.
    assert get(t.url, "/v2")[0] == 200
    assert get(t.url, "/v2/health/live")[0] == 400
    assert get(t.url, "/v2/health/ready")[0] == 400
    g = grpcclient.InferenceServerClient(t.grpc_url)
    assert not g.is_server_live()
    assert not g.is_server_ready()
    assert f"failed to stat file {missing}" in t.log()


def test_missing_repository_exits_by_default(tmp_path):
    t = Tern([f"--model-repository={tmp_path / 'nowhere'}"], wait_ready=False)
    assert t.wait() != 0
    assert "failed to stat file" in t.log()


def test_port_in_use_is_reported_as_triton_does(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        t = Tern([f"--model-repository={tmp_path}", f"--grpc-port={port}"], wait_ready=False)
        assert t.wait() != 0
        assert f"failed to start GRPC service: Unavailable - Socket '127.0.0.1:{port}' already in use" in t.log()
    finally:
        busy.close()


# --- configurations Triton accepts --------------------------------------------


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_ensembles_mixing_batching_and_non_batching_steps(dropin, proto):
    mod = httpclient if proto == "http" else grpcclient
    c = mod.InferenceServerClient(dropin.url if proto == "http" else dropin.grpc_url)
    cases = [
        ("ens_batch_over_nobatch", np.arange(32, dtype=np.float32).reshape(2, 16), (2, 16)),
        ("ens_nobatch_over_batch", np.arange(16, dtype=np.float32), (1, 16)),
        ("ens_reshape", np.arange(24, dtype=np.float32).reshape(3, 8), (3, 4, 1, 2)),
        # An output's reshape is what the steps produce; clients get its dims.
        ("ens_out_reshape", np.arange(24, dtype=np.float32).reshape(3, 4, 1, 2), (3, 8)),
    ]
    for model, x, out_shape in cases:
        assert c.is_model_ready(model), model
        inp = mod.InferInput("IN", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        out = c.infer(model, [inp]).as_numpy("OUT")
        assert out.shape == out_shape, model
        np.testing.assert_array_equal(out.reshape(-1), x.reshape(-1))


def test_reshape_with_a_variable_dimension(dropin):
    c = httpclient.InferenceServerClient(dropin.url)
    x = np.random.rand(2, 2, 4, 5, 6).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out = c.infer("reshape_var", [inp]).as_numpy("OUTPUT0")
    assert out.shape == (2, 8, 5, 1, 6)
    np.testing.assert_array_equal(out.reshape(-1), x.reshape(-1))


def test_very_large_config_values_load_and_serve(dropin):
    c = httpclient.InferenceServerClient(dropin.url)
    x = np.ones((1, 3), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    inp.set_data_from_numpy(x)
    for priority in (0, 1, 4294967296, 2**63 - 1):
        out = c.infer("huge_priorities", [inp], priority=priority).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, x)
    cfg = c.get_model_config("huge_priorities")
    assert int(cfg["dynamic_batching"]["priority_levels"]) == 18446744073709551615


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_normalised_config_has_the_fields_triton_fills(dropin, proto):
    if proto == "http":
        cfg = httpclient.InferenceServerClient(dropin.url).get_model_config("batch_at_once")
    else:
        cfg = grpcclient.InferenceServerClient(dropin.grpc_url).get_model_config("batch_at_once", as_json=True)["config"]
    assert "model_transaction_policy" not in cfg, "Triton gives only ensembles one"
    assert cfg["optimization"]["input_pinned_memory"]["enable"] is True
    if proto == "http":
        ens = httpclient.InferenceServerClient(dropin.url).get_model_config("ens_reshape")
        assert ens["model_transaction_policy"] == {"decoupled": False}


# --- scheduling ----------------------------------------------------------------


def test_batcher_sends_at_once_when_no_larger_preferred_batch_can_form(dropin):
    c = httpclient.InferenceServerClient(dropin.url)
    x = np.ones((7, 2), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [7, 2], "FP32")
    inp.set_data_from_numpy(x)
    start = time.monotonic()
    c.infer("batch_at_once", [inp])
    assert time.monotonic() - start < 5, "waited for the 10 s queue delay"


def test_queue_timeouts_keep_firing_for_later_requests(dropin):
    # One deadline watch per model: requests queued after an earlier one still
    # time out on time.
    c = httpclient.InferenceServerClient(dropin.url, concurrency=4)
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    first = c.async_infer("slow_timeout", [inp])
    time.sleep(0.3)
    for _ in range(3):
        start = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            c.infer("slow_timeout", [inp])
        assert "Request timeout expired" in str(e.value)
        assert time.monotonic() - start < 0.9
    first.get_result()


def test_queue_timeout_fires_while_the_instance_is_busy(dropin):
    c = httpclient.InferenceServerClient(dropin.url, concurrency=2)
    x = np.ones((1, 2), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(x)
    first = c.async_infer("slow_timeout", [inp])
    time.sleep(0.3)  # the first request holds the only instance for 1.5 s
    start = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        c.infer("slow_timeout", [inp])
    elapsed = time.monotonic() - start
    assert "Request timeout expired" in str(e.value)
    assert elapsed < 0.9, f"answered after {elapsed:.2f}s, not at its 0.2 s deadline"
    first.get_result()


def test_grpc_client_deadline_is_deadline_exceeded(dropin):
    g = grpcclient.InferenceServerClient(dropin.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    with pytest.raises(InferenceServerException) as e:
        g.infer("slow", [inp], client_timeout=0.3)
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED", e.value.status()
    assert "Deadline Exceeded" in str(e.value)


def test_grpc_client_deadline_on_a_repository_call(tmp_path, start_tern):
    """Not only inference: a load that outlasts the client's deadline answers
    DEADLINE_EXCEEDED 'Deadline Exceeded' at the deadline, as tritonserver's
    gRPC runtime does, and the load itself goes on to READY."""
    root = tmp_path / "models"
    (root / "slowload" / "1").mkdir(parents=True)
    (root / "slowload" / "config.pbtxt").write_text(
        'name: "slowload"\nbackend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'parameters { key: "execute_delay_ms" value: { string_value: "2000" } }\n'
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value: '
        '{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]\n')
    t = start_tern([f"--model-repository={root}", "--model-control-mode=explicit"])
    g = grpcclient.InferenceServerClient(t.grpc_url)
    start = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        g.load_model("slowload", client_timeout=0.5)
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED" and "Deadline Exceeded" in str(e.value)
    assert time.monotonic() - start < 1.5
    deadline = time.monotonic() + 10
    while not g.is_model_ready("slowload") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert g.is_model_ready("slowload"), "the load went on after the client's deadline"


def test_model_load_retry_count_tries_a_failing_version_again(tmp_path, start_tern):
    """--model-load-retry-count=2: a version that fails is created three times
    in all, then fails with its last error, as tritonserver retries it."""
    root = tmp_path / "models"
    (root / "flaky" / "1").mkdir(parents=True)
    (root / "flaky" / "config.pbtxt").write_text(
        'name: "flaky"\nbackend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'parameters { key: "execute_delay_ms" value: { string_value: "soon" } }\n')
    t = start_tern([f"--model-repository={root}", "--model-control-mode=explicit", "--model-load-retry-count=2"])
    c = httpclient.InferenceServerClient(t.url)
    with pytest.raises(InferenceServerException) as e:
        c.load_model("flaky")
    assert "execute_delay_ms" in str(e.value)
    assert t.wait_log("(attempt 2 of 3)")
    assert "(attempt 3 of 3)" not in t.log(), "the last failure is the load's, not a retry"


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_classification_of_more_than_a_million_elements_is_refused(tmp_path, start_tern, proto):
    """As current Triton: INVALID_ARG 'classification output tensor too large'."""
    root = tmp_path / "models"
    (root / "wide" / "1").mkdir(parents=True)
    (root / "wide" / "config.pbtxt").write_text(
        'name: "wide"\nbackend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]\n')
    t = start_tern([f"--model-repository={root}"])
    mod = httpclient if proto == "http" else grpcclient
    c = mod.InferenceServerClient(t.url if proto == "http" else t.grpc_url)
    for n, ok in ((1_000_000, True), (1_000_001, False)):
        i = mod.InferInput("INPUT0", [n], "UINT8")
        i.set_data_from_numpy(np.zeros(n, dtype=np.uint8))
        out = [mod.InferRequestedOutput("OUTPUT0", class_count=1)]
        if ok:
            assert c.infer("wide", [i], outputs=out).as_numpy("OUTPUT0").shape == (1,)
        else:
            with pytest.raises(InferenceServerException, match="classification output tensor too large"):
                c.infer("wide", [i], outputs=out)


# --- protocol details ------------------------------------------------------------


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_ensemble_classification_uses_the_composing_models_labels(dropin, proto):
    mod = httpclient if proto == "http" else grpcclient
    c = mod.InferenceServerClient(dropin.url if proto == "http" else dropin.grpc_url)
    x = np.arange(20, dtype=np.float32).reshape(1, 20)

    def top2(model, inp_name, out_name):
        inp = mod.InferInput(inp_name, [1, 20], "FP32")
        inp.set_data_from_numpy(x)
        kw = {"binary_data": False} if proto == "http" else {}
        out = [mod.InferRequestedOutput(out_name, class_count=2, **kw)]
        got = c.infer(model, [inp], outputs=out).as_numpy(out_name)
        return [v.decode() if isinstance(v, bytes) else v for v in got.reshape(-1)]

    top = top2("ens_labelled", "IN", "OUT")
    assert top[0] == "19.000000:19:label19", top
    # The composing model answers the same.
    assert top2("labelled", "INPUT0", "OUTPUT0") == top


# --- lifecycle -----------------------------------------------------------------------


def test_poll_mode_stops_polling_before_shutdown(tmp_path):
    root = str(tmp_path / "models")
    ident(root, "first", 8, [-1])
    t = Tern([f"--model-repository={root}", "--model-control-mode=poll", "--repository-poll-secs=1"])
    # A model appears while the server stops: it must not load after SIGTERM.
    ident(root, "second", 8, [-1])
    rc = t.stop()
    assert rc == 0, t.log()
    log = t.log()
    stop_at = log.index("shutting down")
    assert "second" not in log[stop_at:], log[stop_at:]
    assert "stopped" in log[stop_at:]


def test_binary_data_output_covers_only_unlisted_outputs(dropin):
    import http.client

    def post(body):
        conn = http.client.HTTPConnection(dropin.url, timeout=10)
        raw = json.dumps(body).encode()
        conn.request("POST", "/v2/models/ident_batch/infer", raw, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        header_len = r.getheader("Inference-Header-Content-Length")
        conn.close()
        return r.status, json.loads(data[: int(header_len)] if header_len else data)

    inputs = [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]
    # A listed output without its own binary_data is JSON, whatever binary_data_output says.
    status, resp = post({"inputs": inputs, "outputs": [{"name": "OUTPUT0"}], "parameters": {"binary_data_output": True}})
    assert status == 200 and resp["outputs"][0]["data"] == [1.0, 2.0], resp
    # Unlisted outputs follow binary_data_output.
    status, resp = post({"inputs": inputs, "parameters": {"binary_data_output": True}})
    assert status == 200 and resp["outputs"][0]["parameters"]["binary_data_size"] == 8, resp
    # The listed output's own binary_data wins.
    status, resp = post({"inputs": inputs, "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]})
    assert status == 200 and "data" not in resp["outputs"][0], resp


def test_auto_complete_of_a_config_giving_only_max_batch_size(tmp_path, start_tern):
    """As Triton's onnxruntime backend: the inputs and outputs are filled from
    the model, the dynamic batcher is added (preferred size = max_batch_size)
    and default_model_filename is the file the backend loads."""
    import shutil

    from conftest import ROOT

    root = tmp_path / "models"
    (root / "mbs8" / "1").mkdir(parents=True)
    shutil.copy(f"{ROOT}/model_repository/simple_autocomplete/1/model.onnx", root / "mbs8" / "1" / "model.onnx")
    (root / "mbs8" / "config.pbtxt").write_text("max_batch_size: 8\n")
    t = start_tern([f"--model-repository={root}"])
    cfg = httpclient.InferenceServerClient(t.url).get_model_config("mbs8")
    assert cfg["max_batch_size"] == 8 and cfg["dynamic_batching"]["preferred_batch_size"] == [8]
    assert [i["name"] for i in cfg["input"]] == ["INPUT0", "INPUT1"] and cfg["default_model_filename"] == "model.onnx"


def test_the_checksum_repository_agent_guards_the_model_files(tmp_path, start_tern):
    """Triton's `checksum` agent: `MD5:<path in the model folder>` must match
    on every load; a mismatch fails the load with the agent's message, an
    agent Tern does not have fails it too, the rest serves."""
    import hashlib
    import shutil

    from conftest import ROOT

    root = tmp_path / "models"
    onnx = f"{ROOT}/model_repository/simple_autocomplete/1/model.onnx"
    digest = hashlib.md5(open(onnx, "rb").read()).hexdigest()

    def model(name, agents):
        (root / name / "1").mkdir(parents=True)
        shutil.copy(onnx, root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(
            f'max_batch_size: 8\nmodel_repository_agents {{ agents [ {agents} ] }}\n')

    model("verified", f'{{ name: "checksum" parameters {{ key: "MD5:1/model.onnx" value: "{digest}" }} }}')
    model("tampered", '{ name: "checksum" parameters { key: "MD5:1/model.onnx" value: "0123456789abcdef0123456789abcdef" } }')
    model("agentless", '{ name: "unzip" }')
    t = start_tern([f"--model-repository={root}", "--exit-on-error=false", "--model-control-mode=explicit",
                    "--load-model=*"])
    c = httpclient.InferenceServerClient(t.url)
    rows = {m["name"]: m for m in c.get_model_repository_index()}
    assert rows["verified"]["state"] == "READY", rows
    assert rows["tampered"]["state"] == "UNAVAILABLE"
    assert rows["tampered"]["reason"] == ("model 'tampered': Mismatched MD5 hash for file 1/model.onnx, expect: "
                                          f"0123456789abcdef0123456789abcdef, got: {digest}"), rows["tampered"]
    assert "repository agent 'unzip' is not available" in rows["agentless"]["reason"], rows["agentless"]
    # Every load checks again: a file changed after the first load is refused by a reload.
    with open(root / "verified" / "1" / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(InferenceServerException, match="Mismatched MD5 hash for file 1/model.onnx"):
        c.load_model("verified")
    assert c.is_model_ready("verified")  # the loaded version keeps serving
