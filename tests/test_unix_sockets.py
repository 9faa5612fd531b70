"""End-to-end tests of the frontends on Unix-domain sockets
(`--grpc-address=unix:<path>`, `--http-address=unix:<path>`, alongside TCP or
instead of it): tritonclient.grpc with a `unix:` target, curl --unix-socket,
the socket file's mode and owner, stale and busy socket files, and the files
removed at shutdown."""

import grp
import json
import os
import queue
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import Tern, tern_bin


@pytest.fixture
def sockdir():
    # Socket paths are limited to 107 bytes: a short folder, not tmp_path.
    d = tempfile.mkdtemp(prefix="tern-us-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(repo, args):
    t = Tern([f"--model-repository={repo}", *args], wait_ready=False)
    deadline = time.time() + 60
    while time.time() < deadline and "started Metrics Service" not in t.log() and t.proc.poll() is None:
        time.sleep(0.05)
    assert "started Metrics Service" in t.log(), t.log()
    return t


def curl(sock, path, body=None):
    cmd = ["curl", "-s", "--max-time", "30", "--unix-socket", sock, "-w", "\n%{http_code}", f"http://localhost{path}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text, code = out.stdout.rsplit("\n", 1)
    return int(code), text


def simple_inputs():
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return a, b, inputs


def test_grpc_and_http_on_unix_sockets_beside_tcp(good_repo, sockdir):
    """HTTP on a socket only; gRPC on a socket and loopback TCP at once."""
    http_sock, grpc_sock = f"{sockdir}/http.sock", f"{sockdir}/grpc.sock"
    t = start(good_repo, [f"--http-address=unix:{http_sock}", f"--grpc-address=unix:{grpc_sock},127.0.0.1"])
    try:
        assert f"started HTTP service at unix:{http_sock}" in t.log()
        assert f"started GRPCInferenceService at unix:{grpc_sock}" in t.log()
        tcp = re.search(r"started GRPCInferenceService at 127\.0\.0\.1:(\d+)", t.log())
        assert tcp, t.log()
        for path in (http_sock, grpc_sock):
            st = os.stat(path)
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660, oct(st.st_mode)

        a, b, inputs = simple_inputs()
        for url in (f"unix:{grpc_sock}", f"127.0.0.1:{tcp.group(1)}"):
            c = grpcclient.InferenceServerClient(url)
            assert c.is_server_live() and c.is_model_ready("simple")
            r = c.infer("simple", inputs)
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
            c.close()

        # A stream over the socket: several calls on one HTTP/2 stream.
        responses = queue.Queue()
        c = grpcclient.InferenceServerClient(f"unix:{grpc_sock}")
        c.start_stream(callback=lambda result, error: responses.put((result, error)))
        for _ in range(3):
            c.async_stream_infer("simple", inputs)
        for _ in range(3):
            result, error = responses.get(timeout=30)
            assert error is None, error
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        c.stop_stream()
        c.close()

        assert curl(http_sock, "/v2/health/ready")[0] == 200
        code, text = curl(http_sock, "/v2/models/simple/infer", {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.flatten().tolist()},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.flatten().tolist()},
            ]
        })
        assert code == 200, text
        out = {o["name"]: o["data"] for o in json.loads(text)["outputs"]}
        assert out["OUTPUT0"] == (a + b).flatten().tolist()
        code, text = curl(http_sock, "/v2/models/nonexistent/infer", {"inputs": []})
        assert code == 404 and "Request for unknown model" in text, text
    finally:
        assert t.stop() == 0, t.log()
    assert not os.path.exists(http_sock) and not os.path.exists(grpc_sock), "the socket files go at shutdown"


def test_socket_mode_and_owner(good_repo, sockdir):
    # As root, another user's; otherwise this user's own (the flag's path is the same).
    uid, gid = (65534, 65534) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    user, group = pwd.getpwuid(uid).pw_name, grp.getgrgid(gid).gr_name
    sock = f"{sockdir}/g.sock"
    t = start(good_repo, [f"--grpc-address=unix:{sock}", "--unix-socket-mode=0600", f"--unix-socket-owner={user}:{group}"])
    try:
        st = os.stat(sock)
        assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (uid, gid), st
        # Root may still connect: the server answers through it.
        c = grpcclient.InferenceServerClient(f"unix:{sock}")
        assert c.is_server_live()
        c.close()
    finally:
        t.stop()


@pytest.mark.parametrize(
    "flags,expect",
    [
        (["--unix-socket-mode=0999"], "--unix-socket-mode: '0999' is not an octal permission mode"),
        (["--unix-socket-owner=no-such-user-tern"], "--unix-socket-owner: unknown user 'no-such-user-tern'"),
        # Metrics bind last: the HTTP socket bound before is closed and removed again.
        (["--metrics-address=unix:/no/such/folder/m.sock"], "failed to start Metrics service: Unavailable - Socket 'unix:/no/such/folder/m.sock' cannot be bound"),
    ],
)
def test_bad_socket_flags_fail_at_startup(good_repo, sockdir, flags, expect):
    p = subprocess.run(
        [tern_bin(), f"--model-repository={good_repo}", f"--http-address=unix:{sockdir}/h.sock", "--grpc-port=0", "--metrics-port=0", *flags],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode != 0
    assert expect in p.stdout + p.stderr, p.stdout + p.stderr
    assert not os.path.exists(f"{sockdir}/h.sock"), "nothing is left bound"


def test_stale_socket_is_replaced_and_a_live_one_is_in_use(good_repo, sockdir):
    sock = f"{sockdir}/h.sock"
    # What a killed server leaves behind: a socket file nobody listens on.
    first = start(good_repo, [f"--http-address=unix:{sock}"])
    first.stop(sig=9)
    assert os.path.exists(sock)
    t = start(good_repo, [f"--http-address=unix:{sock}"])
    try:
        assert "removing stale socket file" in t.log()
        assert curl(sock, "/v2/health/live")[0] == 200
        p = subprocess.run(
            [tern_bin(), f"--model-repository={good_repo}", f"--http-address=unix:{sock}", "--grpc-port=0", "--metrics-port=0"],
            capture_output=True, text=True, timeout=120,
        )
        assert p.returncode != 0
        assert f"failed to start HTTP service: Unavailable - Socket 'unix:{sock}' already in use" in p.stdout + p.stderr
        # The refused server left the live socket alone.
        assert curl(sock, "/v2/health/live")[0] == 200
    finally:
        t.stop()
    plain = f"{sockdir}/plain"
    with open(plain, "w") as f:
        f.write("keep")
    p = subprocess.run(
        [tern_bin(), f"--model-repository={good_repo}", f"--http-address=unix:{plain}", "--grpc-port=0", "--metrics-port=0"],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode != 0 and "the path exists and is not a socket" in p.stdout + p.stderr
    assert open(plain).read() == "keep"
