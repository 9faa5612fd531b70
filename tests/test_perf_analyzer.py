"""Triton's own load generator, perf_analyzer, against the built binary and the example
repository: HTTP and gRPC (sync, async, streaming, gzip), batching, system shared memory, an
ensemble with its composing models' server-side statistics, and a WebAssembly plugin. Outputs of `simple` are checked by
perf_analyzer itself (`validation_data`), and a wrong expectation must fail the run.

perf_analyzer comes from the `perf-analyzer` wheel, installed by `make setup` through
scripts/get_perf_analyzer.sh (it needs a newer glibc than Debian 12's; see the script)."""

import json
import os
import subprocess

import pytest

from conftest import ROOT, Tern

REPO = os.path.join(ROOT, "model_repository")
PA = os.environ.get("TERN_PERF_ANALYZER", os.path.join(ROOT, ".cache", "perf_analyzer", "perf_analyzer"))
# Short, count-based windows that always count as stable: these tests check behaviour, not speed.
WINDOWS = ["--measurement-mode=count_windows", "--measurement-request-count=50", "--stability-percentage=1000", "--max-trials=3"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    if not os.path.exists(PA):
        pytest.fail(f"perf_analyzer not found at {PA}; run `make setup` (scripts/get_perf_analyzer.sh)")
    for f in ("simple/1/model.onnx", "minilm/1/model.onnx", "add_sub/1/model.wasm"):
        if not os.path.exists(os.path.join(REPO, f)):
            pytest.fail(f"model_repository/{f} is missing; run `make setup`")
    cache = str(tmp_path_factory.mktemp("cwasm"))
    t = Tern([f"--model-repository={REPO}", f"--wasm-cache-dir={cache}", "--allow-client-shm=true"])
    yield t
    t.stop()


def simple_data(tmp_path, offset=0):
    """Input data for `simple` with the outputs perf_analyzer must see (plus `offset`)."""
    a, b = list(range(16)), [3] * 16
    path = tmp_path / f"simple_{offset}.json"
    path.write_text(json.dumps({
        "data": [{"INPUT0": a, "INPUT1": b}],
        "validation_data": [{"OUTPUT0": [x + y + offset for x, y in zip(a, b)], "OUTPUT1": [x - y for x, y in zip(a, b)]}],
    }))
    return str(path)


def perf_analyzer(*args, ok=True):
    p = subprocess.run([PA, *WINDOWS, *args], capture_output=True, text=True, timeout=180)
    out = p.stdout + p.stderr
    if ok:
        assert p.returncode == 0, out
        assert "Throughput:" in out and "Successful request count:" in out, out
    return p.returncode, out


def test_http_outputs_validated_and_server_stats(srv, tmp_path):
    _, out = perf_analyzer("-m", "simple", "-u", srv.url, "--input-data", simple_data(tmp_path), "--concurrency-range=2")
    # Server-side statistics come from the statistics extension, split like Triton's.
    assert "compute infer" in out and "queue" in out, out


def test_wrong_expected_outputs_fail_the_run(srv, tmp_path):
    rc, out = perf_analyzer("-m", "simple", "-u", srv.url, "--input-data", simple_data(tmp_path, offset=1), ok=False)
    assert rc != 0 and "doesn't match expected output" in out, out


@pytest.mark.parametrize(
    "mode",
    [[], ["--async"], ["--streaming"], ["--grpc-compression-algorithm=gzip"]],
    ids=["sync", "async", "streaming", "gzip"],
)
def test_grpc(srv, tmp_path, mode):
    perf_analyzer("-m", "simple", "-i", "grpc", "-u", srv.grpc_url, "--input-data", simple_data(tmp_path), "--concurrency-range=2", *mode)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batch_size(srv, protocol):
    url = srv.url if protocol == "http" else srv.grpc_url
    _, out = perf_analyzer("-m", "simple", "-i", protocol, "-u", url, "-b", "4")
    assert "Batch size: 4" in out, out


def test_ensemble_with_composing_model_stats(srv):
    _, out = perf_analyzer("-m", "text_embedding", "-i", "grpc", "-u", srv.grpc_url, "--string-data=a sentence to embed", "--concurrency-range=2")
    assert "Composing models:" in out, out
    for step in ("bert_tokenizer", "minilm", "embed_pool"):
        assert f"{step}, version: 1" in out, out


def test_wasm_plugin(srv):
    perf_analyzer("-m", "add_sub", "-u", srv.url)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory(srv, protocol):
    # perf_analyzer registers its own regions and names them in every request, inputs and
    # outputs; Triton's C++ HTTP client rejects a shared-memory output that has `parameters`.
    url = srv.url if protocol == "http" else srv.grpc_url
    perf_analyzer("-m", "simple", "-i", protocol, "-u", url, "--shared-memory=system", "--output-shared-memory-size=64")
