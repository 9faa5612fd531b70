"""Fixtures for the end-to-end tests: generate the test model repository and
run the built `tern` binary (TERN_BIN) on a free port, the way users do."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gen_models  # noqa: E402

# The ONNX Runtime library `make setup` installs, unless the caller chose another.
os.environ.setdefault("ORT_DYLIB_PATH", os.path.join(ROOT, ".cache", "onnxruntime", "libonnxruntime.so"))


def tern_bin():
    path = os.environ.get("TERN_BIN", os.path.join(ROOT, "target", "debug", "tern"))
    if not os.path.exists(path):
        pytest.fail(f"tern binary not found at {path}; run `make e2e` (or set TERN_BIN)")
    return path


class Tern:
    """A running tern process; `url` is host:port of its HTTP endpoint."""

    def __init__(self, args, env=None, wait_ready=True, binary=None, wrapper=()):
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env = {k: v for k, v in full_env.items() if v is not None}  # None removes a variable
        self.proc = subprocess.Popen(
            [
                *wrapper,
                binary or tern_bin(),
                "--http-port=0",
                "--http-address=127.0.0.1",
                "--grpc-port=0",
                "--grpc-address=127.0.0.1",
                "--metrics-port=0",
                "--metrics-address=127.0.0.1",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=full_env,
        )
        self.lines = []
        self.url = None
        self.grpc_url = None
        self.metrics_url = None
        started = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(r"started GRPCInferenceService at [^:]+:(\d+)", line)
                if m:
                    self.grpc_url = f"127.0.0.1:{m.group(1)}"
                m = re.search(r"started Metrics Service at [^:]+:(\d+)", line)
                if m:
                    self.metrics_url = f"127.0.0.1:{m.group(1)}"
                m = re.search(r"started HTTP service at [^:]+:(\d+)", line)
                if m:
                    self.url = f"127.0.0.1:{m.group(1)}"
                if (
                    self.url
                    and (self.grpc_url or "--allow-grpc=false" in args)
                    and (self.metrics_url or "--allow-metrics=false" in args)
                ):
                    started.set()
            started.set()

        self.thread = threading.Thread(target=pump, daemon=True)
        self.thread.start()
        if wait_ready:
            started.wait(60)
            if self.url is None:
                self.stop()
                raise RuntimeError("tern did not start:\n" + self.log())

    def log(self):
        return "".join(self.lines)

    def wait_log(self, text, timeout=10):
        """True once `text` is in the log: lines reach it through a reader
        thread, so a line the server just wrote may not be there yet."""
        deadline = time.time() + timeout
        while text not in self.log() and time.time() < deadline:
            time.sleep(0.05)
        return text in self.log()

    def wait(self, timeout=30):
        rc = self.proc.wait(timeout)
        self.thread.join(5)
        return rc

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.thread.join(5)
        return self.proc.returncode


def infer_simple(t, name, version=""):
    """Asks the `simple`-shaped model `name` (INT32 [1, 16] add and
    subtract) over HTTP and gRPC on the server `t`, and checks the answers."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    for mod, url in ((httpclient, t.url), (grpcclient, t.grpc_url)):
        c = mod.InferenceServerClient(url)
        inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        r = c.infer(name, inputs, model_version=version)
        assert (r.as_numpy("OUTPUT0") == a + b).all() and (r.as_numpy("OUTPUT1") == a - b).all()


@pytest.fixture(scope="session")
def test_repo(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("repo") / "models")
    gen_models.test(root)
    return root


@pytest.fixture(scope="session")
def good_repo(test_repo, tmp_path_factory):
    """The test repository without the deliberately broken models."""
    import shutil

    root = str(tmp_path_factory.mktemp("good") / "models")
    shutil.copytree(test_repo, root, ignore=shutil.ignore_patterns("broken_*", "gpu_only"))
    return root


@pytest.fixture(scope="session")
def server(test_repo):
    """One server over the whole test repository (broken models included)."""
    t = Tern([f"--model-repository={test_repo}", "--exit-on-error=false", "--http-max-input-size=1048576"])
    yield t
    t.stop()


@pytest.fixture
def start_tern():
    started = []

    def start(args, **kw):
        t = Tern(args, **kw)
        started.append(t)
        return t

    yield start
    for t in started:
        t.stop(sig=signal.SIGKILL)


@pytest.fixture
def client(server):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(server.url, concurrency=4)
    yield c
    c.close()


@pytest.fixture(scope="module")
def shm_server(good_repo):
    """A server over the good repository with client shared memory allowed."""
    t = Tern([f"--model-repository={good_repo}", "--allow-client-shm=true"])
    yield t
    t.stop()


@pytest.fixture
def regions():
    """Makes system shared-memory regions (`make(size)` -> name, key, handle); destroys them after the test."""
    import uuid

    import tritonclient.utils.shared_memory as shm

    made = []

    def make(size):
        name = f"tern_{uuid.uuid4().hex[:10]}"
        h = shm.create_shared_memory_region(name, "/" + name, size)
        made.append(h)
        return name, "/" + name, h

    yield make
    for h in made:
        shm.destroy_shared_memory_region(h)


# `make e2e` sets TERN_STRICT_SKIPS=1: everything a test needs is installed by
# make, so the only skip allowed is for hardware this machine lacks (a GPU).
# Any other skip fails the run, with its reason (`-rs` prints them all).
ALLOWED_SKIP = re.compile(r"\bGPU\b|CUDA")


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("TERN_STRICT_SKIPS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    bad = []
    for rep in (reporter.stats.get("skipped", []) if reporter else []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if not ALLOWED_SKIP.search(reason):
            bad.append(f"{rep.nodeid}: {reason}")
    if bad:
        reporter.write_line("skips that are not about missing GPU hardware (TERN_STRICT_SKIPS=1):", red=True)
        for line in bad:
            reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# `make e2e` runs two workers that take whole files in collection order
# (`--dist loadfile --no-loadscope-reorder`). The long files go first, so the
# two workers share them; the plugin memory soak goes last: it keeps both
# cores busy for minutes, and beside it timing tests miss their deadlines
# (the plugin log flood's deadline, in test_plugins.py, which goes first).
FIRST = ["test_lang_plugins.py", "test_detection.py", "test_perf_analyzer.py", "test_plugins.py"]
LAST = ["test_plugin_memory.py"]


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        name = os.path.basename(str(item.fspath))
        if name in FIRST:
            return FIRST.index(name)
        return len(FIRST) + 1 if name in LAST else len(FIRST)

    items.sort(key=rank)  # stable: tests keep their order within a file
