"""Startup, failure handling and shutdown of the real binary."""

import os
import signal
import subprocess
import threading
import time

import numpy as np
import tritonclient.http as httpclient

from conftest import Tern, tern_bin


def test_exit_on_error_default(test_repo):
    t = Tern([f"--model-repository={test_repo}"], wait_ready=False)
    rc = t.wait(60)
    assert rc != 0
    assert "exiting (--exit-on-error=true)" in t.log()


def test_unknown_and_unimplemented_flags():
    r = subprocess.run([tern_bin(), "--model-repository=/tmp", "--repoagent-directory=/r"], capture_output=True, text=True)
    assert r.returncode == 2 and "'--repoagent-directory' is not supported" in r.stderr
    r = subprocess.run([tern_bin(), "--model-repository=/tmp", "--no-such-flag"], capture_output=True, text=True)
    assert r.returncode == 2 and "--no-such-flag" in r.stderr


def test_missing_repository_is_an_error(tmp_path):
    t = Tern([f"--model-repository={tmp_path / 'missing'}"], wait_ready=False)
    assert t.wait(30) != 0
    assert f"failed to stat file {tmp_path / 'missing'}" in t.log()


def test_missing_onnxruntime_library_is_a_clean_load_error(start_tern, good_repo):
    t = start_tern([f"--model-repository={good_repo}", "--exit-on-error=false"], env={"ORT_DYLIB_PATH": "/nonexistent/libonnxruntime.so"})
    c = httpclient.InferenceServerClient(t.url)
    assert not c.is_model_ready("simple")
    assert c.is_model_ready("identity_fp32")  # other backends keep serving
    assert "ONNX Runtime library could not be loaded" in t.log() and "make setup" in t.log()
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    assert c.infer("identity_fp32", [inp]).as_numpy("OUTPUT0").shape == (1, 2)


def test_auto_complete_can_be_disabled(start_tern, good_repo):
    t = Tern([f"--model-repository={good_repo}", "--disable-auto-complete-config"], wait_ready=False)
    assert t.wait(60) != 0
    assert "simple_autocomplete" in t.log() and "auto-complete is disabled" in t.log()


def test_graceful_shutdown_finishes_in_flight_requests(start_tern, good_repo):
    t = start_tern([f"--model-repository={good_repo}", "--exit-timeout-secs=10"])
    c = httpclient.InferenceServerClient(t.url)
    inp = httpclient.InferInput("INPUT0", [1, 2], "INT32")
    inp.set_data_from_numpy(np.array([[4, 5]], dtype=np.int32))
    result = {}

    def call():
        try:
            result["r"] = c.infer("slow", [inp]).as_numpy("OUTPUT0")
        except Exception as e:  # noqa: BLE001
            result["e"] = e

    th = threading.Thread(target=call)
    th.start()
    time.sleep(0.1)
    t.proc.send_signal(signal.SIGTERM)
    th.join(30)
    assert t.wait(30) == 0
    assert "e" not in result, result.get("e")
    np.testing.assert_array_equal(result["r"], [[4, 5]])
