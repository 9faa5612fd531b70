"""What a model folder or a load request must not be able to do to the
server: read files outside the model's folder through a config-named
symlink, hold a load forever with a named pipe, or turn a bad upload name
into a server error."""

import base64
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, Tern, tern_bin


def io_config(name, extra=""):
    return f"""name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] {extra} }} ]
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    repo = root / "models"
    outside = root / "secret.txt"
    outside.write_text("root:x:0:0\n" * 4)
    # Labels that are a symlink out of the model folder.
    (repo / "label_link" / "1").mkdir(parents=True)
    (repo / "label_link" / "config.pbtxt").write_text(io_config("label_link", 'label_filename: "labels.txt"'))
    os.symlink(outside, repo / "label_link" / "labels.txt")
    # Labels linked inside the folder are fine.
    (repo / "label_inside" / "1").mkdir(parents=True)
    (repo / "label_inside" / "real.txt").write_text("a\nb\nc\nd\n")
    (repo / "label_inside" / "config.pbtxt").write_text(io_config("label_inside", 'label_filename: "labels.txt"'))
    os.symlink(repo / "label_inside" / "real.txt", repo / "label_inside" / "labels.txt")
    # A model file that is a named pipe: opening it would block forever.
    (repo / "fifo_model" / "1").mkdir(parents=True)
    (repo / "fifo_model" / "config.pbtxt").write_text('name: "fifo_model"\nbackend: "onnxruntime"\n')
    os.mkfifo(repo / "fifo_model" / "1" / "model.onnx")
    (repo / "fine" / "1").mkdir(parents=True)
    (repo / "fine" / "config.pbtxt").write_text(io_config("fine"))
    t = Tern([f"--model-repository={repo}", "--exit-on-error=false", "--model-control-mode=explicit", "--load-model=*"])
    t.repo = str(repo)
    yield t
    t.stop()


def test_config_named_files_stay_inside_the_model_folder(hostile):
    c = httpclient.InferenceServerClient(hostile.url)
    index = {m["name"]: m for m in c.get_model_repository_index()}
    assert index["label_link"]["state"] == "UNAVAILABLE"
    reason = index["label_link"]["reason"]
    assert "label_filename 'labels.txt'" in reason and "outside the model's folder" in reason, reason
    assert index["label_inside"]["state"] == "READY"
    assert index["fine"]["state"] == "READY"


def test_a_named_pipe_model_file_is_refused_at_once(hostile):
    c = httpclient.InferenceServerClient(hostile.url)
    index = {m["name"]: m for m in c.get_model_repository_index()}
    assert index["fifo_model"]["state"] == "UNAVAILABLE"
    assert "is not a regular file" in index["fifo_model"]["reason"]
    started = time.time()
    with pytest.raises(Exception, match="not a regular file"):
        c.load_model("fifo_model")
    assert time.time() - started < 10


def test_a_nul_byte_in_an_uploaded_file_name_is_a_400(hostile):
    cfg = {"name": "up", "backend": "identity", "max_batch_size": 0,
           "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
           "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
    body = {"parameters": {"config": json.dumps(cfg), "file:1/a\u0000b": base64.b64encode(b"x").decode()}}
    req = urllib.request.Request(f"http://{hostile.url}/v2/repository/models/up/load", data=json.dumps(body).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400
    assert "file parameter 'file:1/a\u0000b' must be a relative path inside the model folder" in json.loads(e.value.read())["error"]


def raw_answer(sock, timeout=10):
    """One HTTP response: until its Content-Length is in, or the connection closes."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(1000):
            out += chunk
            head, sep, rest = out.partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
            if sep and length and len(rest) >= length[0]:
                break
    except ConnectionResetError:
        pass
    return out


def test_an_oversized_body_is_refused_at_once(hostile, server):
    """A Content-Length over --http-max-input-size is answered without
    waiting for a body that may never come (the read timeout is 60 s); a
    client that sends the whole oversized body before reading still gets the
    answer, not a broken pipe."""
    import socket

    host, port = hostile.url.split(":")
    s = socket.create_connection((host, int(port)))
    began = time.time()
    s.sendall(b"POST /v2/models/fine/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n")
    answer = raw_answer(s)
    assert answer.startswith(b"HTTP/1.1 400") and b"Unable to parse Content-Length, value is out of range" in answer, answer
    assert time.time() - began < 3
    s.close()
    import http.client

    # `server` has --http-max-input-size=1048576.
    for _ in range(3):
        conn = http.client.HTTPConnection(server.url, timeout=30)
        conn.request("POST", "/v2/models/fine/infer", body=b" " * (3 << 20))
        r = conn.getresponse()
        assert r.status == 400 and b"request JSON size of 3145728 bytes exceeds the maximum allowed input size of 1048576 bytes" in r.read()
        conn.close()


def test_a_trickling_body_cannot_hold_its_connection(start_tern, hostile):
    """One byte every 0.6 s never trips a 1 s read timeout, but the whole
    body must keep up an average rate: the request is refused after about
    the read timeout instead of taking 60 s."""
    import socket

    t = start_tern([f"--model-repository={hostile.repo}", "--exit-on-error=false", "--http-read-timeout-secs=1"])
    host, port = t.url.split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v2/models/fine/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
    began = time.time()
    s.settimeout(0.1)
    answer = b""
    while time.time() - began < 15 and not answer:
        try:
            s.sendall(b" ")
        except OSError:
            break
        try:
            answer = s.recv(1000)
        except socket.timeout:
            pass
        time.sleep(0.5)
    answer += raw_answer(s, 5)
    assert answer.startswith(b"HTTP/1.1 400") and b"the request body arrived too slowly" in answer, answer
    assert time.time() - began < 5


def test_the_descriptor_limit_does_not_flood_the_log(start_tern, hostile):
    """With the open-file limit reached, failed accepts are logged once and
    then at most every 10 s, not every 50 ms; the server recovers when
    connections close."""
    import shutil
    import socket

    if not shutil.which("prlimit"):
        pytest.skip("prlimit (util-linux) is not installed")
    t = start_tern([f"--model-repository={hostile.repo}", "--exit-on-error=false", "--allow-metrics=false", "--allow-grpc=false"],
                   wrapper=("prlimit", "--nofile=48:48"))
    host, port = t.url.split(":")
    held = []
    try:
        for _ in range(80):
            try:
                held.append(socket.create_connection((host, int(port)), timeout=2))
            except OSError:
                break
        time.sleep(3)
        failures = [line for line in t.lines if "accept failed" in line]
        assert 1 <= len(failures) <= 2, "".join(failures[:5])
    finally:
        for s in held:
            s.close()
    assert t.wait_log("accepting connections again", timeout=10)
    # The dead connections still queued are accepted and closed first.
    time.sleep(5)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = raw_answer(s, 10)
    assert answer.startswith(b"HTTP/1.1 200"), "".join(t.lines[-8:])


def test_a_body_of_whitespace_is_answered_promptly(hostile):
    """Scanning a JSON body for NaN/Infinity tokens was quadratic in runs of
    whitespace: a few MiB of spaces held a core for hours."""
    import http.client

    conn = http.client.HTTPConnection(hostile.url, timeout=30)
    conn.request("POST", "/v2/models/fine/infer", body=b" " * (8 << 20) + b"[NaN]")
    r = conn.getresponse()
    assert r.status == 400 and b"failed to parse the request JSON" in r.read()
    conn.close()


def slow_plugin(repo, name, sleep_ms):
    """A copy of the `misbehave` plugin whose initialize sleeps `sleep_ms`."""
    wasm = os.path.join(os.environ.get("TERN_PLUGINS_DIR", os.path.join(ROOT, "target", "wasm32-wasip2", "release")), "misbehave.wasm")
    if not os.path.exists(wasm):
        pytest.fail(f"{wasm} not found; run `make plugins` (or set TERN_PLUGINS_DIR)")
    (repo / name / "1").mkdir(parents=True)
    shutil.copy(wasm, repo / name / "1" / "model.wasm")
    (repo / name / "config.pbtxt").write_text(f"""name: "{name}"
backend: "wasm"
max_batch_size: 0
input [ {{ name: "MODE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] }} ]
parameters {{ key: "execution_timeout_ms" value: {{ string_value: "600000" }} }}
parameters {{ key: "init_sleep_ms" value: {{ string_value: "{sleep_ms}" }} }}
""")


def test_a_slow_load_holds_neither_other_loads_nor_the_server(tmp_path):
    """A load that takes minutes (here a plugin whose initialize sleeps 60 s)
    does not hold loads and unloads of other models, inference or the index;
    it is abandoned at --model-load-timeout-secs with a clear reason, and a
    later load of the same model is not held by the abandoned one."""
    repo = tmp_path / "models"
    slow_plugin(repo, "slow", 60000)
    for n in ("fine", "other"):
        (repo / n / "1").mkdir(parents=True)
        (repo / n / "config.pbtxt").write_text(io_config(n))
    # Compiled beforehand: the 4 s load timeout is for the plugin's initialize,
    # not for a debug build compiling it on a busy machine.
    cache = tmp_path / "cache"
    out = subprocess.run([tern_bin(), "plugin", "compile", str(repo), f"--cache-dir={cache}"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    t = Tern([f"--model-repository={repo}", "--model-control-mode=explicit", "--load-model=fine",
              "--model-load-timeout-secs=4", f"--wasm-cache-dir={cache}"])
    try:
        c = httpclient.InferenceServerClient(t.url)
        failure = []

        def load_slow():
            try:
                httpclient.InferenceServerClient(t.url, network_timeout=60).load_model("slow")
            except Exception as e:  # noqa: BLE001
                failure.append((time.time(), str(e)))

        started = time.time()
        loader = threading.Thread(target=load_slow)
        loader.start()
        time.sleep(0.5)
        c.load_model("other")
        c.unload_model("other")
        c.load_model("other")
        assert time.time() - started < 3, "a load of another model waited for the slow one"
        rows = {m["name"]: m for m in c.get_model_repository_index()}
        assert rows["slow"]["state"] == "LOADING" and rows["other"]["state"] == "READY"
        # The reason says what the load is doing and for how long.
        assert re.fullmatch(r"loading: version 1: starting instances and warming up, \d+ s", rows["slow"]["reason"]), rows["slow"]
        m = httpclient.InferInput("MODE", [1], "BYTES")
        m.set_data_from_numpy(np.array([b"ok"], dtype=np.object_))
        with pytest.raises(Exception, match=r"Request for unknown model: 'slow' has no available versions \(loading: version 1: starting instances"):
            c.infer("slow", [m])
        x = httpclient.InferInput("INPUT0", [4], "FP32")
        x.set_data_from_numpy(np.ones(4, dtype=np.float32))
        assert c.infer("fine", [x]).as_numpy("OUTPUT0").tolist() == [1.0] * 4
        loader.join(30)
        assert failure, "the slow load did not fail"
        ended, message = failure[0]
        assert 3.5 < ended - started < 15, ended - started
        assert "the load did not finish within 4 s (--model-load-timeout-secs)" in message, message
        rows = {m["name"]: m for m in c.get_model_repository_index()}
        assert rows["slow"]["state"] == "UNAVAILABLE"
        assert "did not finish within 4 s" in rows["slow"]["reason"]
        # Again: the abandoned load still sleeps, and does not hold this one.
        again = time.time()
        with pytest.raises(Exception, match="did not finish within 4 s"):
            httpclient.InferenceServerClient(t.url, network_timeout=60).load_model("slow")
        assert time.time() - again < 10
        assert c.is_model_ready("other")
    finally:
        stopped = time.time()
        t.stop()
        assert time.time() - stopped < 15, "the server did not stop promptly with loads abandoned"
