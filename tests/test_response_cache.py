"""The response cache (Triton's --cache-config and per-model
response_cache) through the built binary with tritonclient: hits answer
without running the model, the key covers inputs and requested outputs,
LRU eviction in the local cache's budget, statistics and metrics with
Triton's names, ensembles cached at the top level, Triton's load and
command-line refusals."""

import os
import shutil
import subprocess
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from conftest import tern_bin
from test_plugins import plugins_dir


def pair(name, cache=True, extra="", dims="[ -1 ]", max_batch=8):
    """An identity model with two INT32 inputs and outputs."""
    return f'''name: "{name}"
backend: "identity"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: {dims} }},
        {{ name: "INPUT1" data_type: TYPE_INT32 dims: {dims} }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: {dims} }},
         {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: {dims} }} ]
response_cache {{ enable: {"true" if cache else "false"} }}
{extra}
'''


ENSEMBLE = '''name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "B" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
response_cache { enable: true }
ensemble_scheduling { step [ {
  model_name: "plain" model_version: -1
  input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
  output_map { key: "OUTPUT0" value: "Y" }
} ] }
'''


def repo(tmp_path, models):
    root = tmp_path / "models"
    for name, cfg in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(cfg)
    return str(root)


def inputs(mod, a, b):
    out = []
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        i = mod.InferInput(name, list(data.shape), "INT32")
        i.set_data_from_numpy(data)
        out.append(i)
    return out


def http_infer(t, model, a, b, outputs=None, request_id=""):
    c = httpclient.InferenceServerClient(t.url)
    req = [httpclient.InferRequestedOutput(o) for o in outputs] if outputs else None
    return c.infer(model, inputs(httpclient, a, b), outputs=req, request_id=request_id)


def stats(t, model):
    s = httpclient.InferenceServerClient(t.url).get_inference_statistics(model)["model_stats"][0]
    i = s["inference_stats"]
    return {
        "exec": s["execution_count"],
        "inferences": s["inference_count"],
        "success": i["success"]["count"],
        "hit": i["cache_hit"]["count"],
        "miss": i["cache_miss"]["count"],
        "queue": i["queue"]["count"],
        "compute": i["compute_infer"]["count"],
    }


def scrape(t):
    with urllib.request.urlopen(f"http://{t.metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def sample(families, family, **labels):
    found = [s.value for s in families[family].samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (family, labels, found)
    return found[0]


A = np.array([[1, 2, 3, 4]], dtype=np.int32)
B = np.array([[10, 20, 30, 40]], dtype=np.int32)


@pytest.fixture
def cached(tmp_path, start_tern):
    r = repo(tmp_path, {"m": pair("m"), "plain": pair("plain", cache=False), "ens": ENSEMBLE})
    return start_tern([f"--model-repository={r}", "--cache-config=local,size=1048576"])


def test_a_repeated_request_is_answered_without_the_model(cached):
    first = http_infer(cached, "m", A, B, request_id="one")
    assert stats(cached, "m") == {"exec": 1, "inferences": 1, "success": 1, "hit": 0, "miss": 1, "queue": 1, "compute": 1}
    second = http_infer(cached, "m", A, B, request_id="two")
    np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), first.as_numpy("OUTPUT0"))
    np.testing.assert_array_equal(second.as_numpy("OUTPUT1"), B)
    assert second.get_response()["id"] == "two"
    # As Triton: a hit is a success with queue time, no execution, inference or compute.
    assert stats(cached, "m") == {"exec": 1, "inferences": 1, "success": 2, "hit": 1, "miss": 1, "queue": 2, "compute": 1}
    # gRPC reads the same entry.
    g = grpcclient.InferenceServerClient(cached.grpc_url)
    r = g.infer("m", inputs(grpcclient, A, B), request_id="three")
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), A)
    assert r.get_response().id == "three"
    gs = g.get_inference_statistics("m", as_json=True)["model_stats"][0]["inference_stats"]
    assert int(gs["cache_hit"]["count"]) == 2 and int(gs["cache_hit"]["ns"]) > 0
    assert int(gs["cache_miss"]["count"]) == 1
    # A model that does not enable the cache is never cached.
    for _ in range(2):
        http_infer(cached, "plain", A, B)
    assert stats(cached, "plain")["exec"] == 2 and stats(cached, "plain")["hit"] == 0


def test_the_key_covers_data_shape_and_requested_outputs(cached):
    http_infer(cached, "m", A, B)
    # Other data, the same bytes in another shape, a subset of outputs: each a miss.
    http_infer(cached, "m", A + 1, B)
    reshaped = http_infer(cached, "m", A.reshape(2, 2), B.reshape(2, 2))
    assert reshaped.as_numpy("OUTPUT0").shape == (2, 2)
    only1 = http_infer(cached, "m", A, B, outputs=["OUTPUT1"])
    assert only1.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(only1.as_numpy("OUTPUT1"), B)
    assert stats(cached, "m")["miss"] == 4 and stats(cached, "m")["hit"] == 0
    # ...and each of those is now a hit, answering with what it asked for.
    again = http_infer(cached, "m", A, B, outputs=["OUTPUT1"])
    assert again.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(again.as_numpy("OUTPUT1"), B)
    assert http_infer(cached, "m", A.reshape(2, 2), B.reshape(2, 2)).as_numpy("OUTPUT1").shape == (2, 2)
    # (the reshaped request is a batch of 2: five batch elements inferred)
    assert stats(cached, "m") == {"exec": 4, "inferences": 5, "success": 6, "hit": 2, "miss": 4, "queue": 6, "compute": 4}


def test_a_failed_request_is_not_cached(tmp_path, start_tern):
    """The `misbehave` plugin answers `count` with its number of executions
    and fails `error` cleanly: a cached `count` keeps its first answer, an
    error is never kept (Triton caches error responses too)."""
    root = tmp_path / "models"
    (root / "mis" / "1").mkdir(parents=True)
    shutil.copy(os.path.join(plugins_dir(), "misbehave.wasm"), root / "mis" / "1" / "model.wasm")
    (root / "mis" / "config.pbtxt").write_text('''name: "mis"
backend: "wasm"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
response_cache { enable: true }
''')
    t = start_tern([f"--model-repository={root}", "--cache-config=local,size=1048576"])
    c = httpclient.InferenceServerClient(t.url)

    def call(mode):
        i = httpclient.InferInput("MODE", [1], "BYTES")
        i.set_data_from_numpy(np.array([mode.encode()], dtype=object))
        return c.infer("mis", [i]).as_numpy("OUTPUT0")[0].decode()

    for _ in range(2):
        with pytest.raises(InferenceServerException, match="asked for an error"):
            call("error")
    first = call("count")
    assert call("count") == first, "answered from the cache"
    assert call("ok") == "ok"
    assert int(call("count")) == int(first), "still the cached answer"
    s = stats(t, "mis")
    assert (s["hit"], s["miss"], s["exec"]) == (2, 2, 4), s


def test_an_ensemble_hit_skips_its_steps(cached):
    c = httpclient.InferenceServerClient(cached.url)
    ins = [httpclient.InferInput("A", [1, 4], "INT32"), httpclient.InferInput("B", [1, 4], "INT32")]
    ins[0].set_data_from_numpy(A)
    ins[1].set_data_from_numpy(B)
    for _ in range(3):
        np.testing.assert_array_equal(c.infer("ens", ins).as_numpy("Y"), A)
    assert stats(cached, "plain")["exec"] == 1, "the step ran once"
    s = stats(cached, "ens")
    assert (s["hit"], s["miss"], s["success"]) == (2, 1, 3)


def test_metrics_name_the_cache_as_triton_does(cached):
    http_infer(cached, "m", A, B)
    http_infer(cached, "m", A, B)
    text, f = scrape(cached)
    assert sample(f, "nv_cache_num_hits_per_model", model="m", version="1") == 1
    assert sample(f, "nv_cache_num_misses_per_model", model="m", version="1") == 1
    assert "nv_cache_hit_duration_per_model" in f and "nv_cache_miss_duration_per_model" in f
    assert 'nv_cache_num_hits_per_model{model="plain"' not in text, "only models that enable the cache"
    assert sample(f, "nv_cache_num_entries") == 1
    assert sample(f, "nv_cache_num_hits") == 1 and sample(f, "nv_cache_num_lookups") == 2
    assert 0 < sample(f, "nv_cache_util") < 0.01
    assert f["nv_cache_util"].type == "gauge"
    assert sample(f, "nv_inference_exec_count", model="m", version="1") == 1
    assert sample(f, "nv_inference_request_success", model="m", version="1") == 2


def test_cache_summaries_with_summary_latencies(tmp_path, start_tern):
    """--metrics-config summary_latencies=true adds Triton's cache summaries
    for the models that enable the cache."""
    r = repo(tmp_path, {"m": pair("m"), "plain": pair("plain", cache=False)})
    t = start_tern([f"--model-repository={r}", "--cache-config=local,size=1048576",
                    "--metrics-config=summary_latencies=true"])
    for _ in range(3):
        http_infer(t, "m", A, B)
    http_infer(t, "plain", A, B)
    text, f = scrape(t)
    hit, miss = f["nv_cache_hit_summary_per_model"], f["nv_cache_miss_summary_per_model"]
    assert hit.type == "summary" and hit.documentation == "Summary of cache hit counts/durations per model, in microseconds."
    count = lambda fam: next(s.value for s in fam.samples if s.name.endswith("_count") and s.labels.get("model") == "m")
    assert (count(hit), count(miss)) == (2, 1)
    assert any(s.labels.get("quantile") for s in hit.samples), "quantiles are rendered"
    assert 'nv_cache_hit_summary_per_model_count{model="plain"' not in text
    assert "nv_inference_request_summary_us" in f, "kept for cached models too (Triton drops it: a FIXME there)"


def test_the_local_cache_evicts_the_least_recently_used(tmp_path, start_tern):
    # Entries of a [1, 10000] pair are ~80 KB: a 200 KB cache holds two.
    r = repo(tmp_path, {"m": pair("m")})
    t = start_tern([f"--model-repository={r}", "--cache-config=local,size=200000"])
    x = [np.full((1, 10000), i, dtype=np.int32) for i in range(3)]
    http_infer(t, "m", x[0], x[0])
    http_infer(t, "m", x[1], x[1])
    http_infer(t, "m", x[0], x[0])  # hit: 0 is now newer than 1
    http_infer(t, "m", x[2], x[2])  # evicts 1
    assert stats(t, "m")["hit"] == 1
    http_infer(t, "m", x[0], x[0])
    assert stats(t, "m")["hit"] == 2
    http_infer(t, "m", x[1], x[1])
    assert stats(t, "m")["hit"] == 2, "1 was evicted"
    _, f = scrape(t)
    assert sample(f, "nv_cache_num_evictions") >= 1
    # A response larger than the whole cache is answered, logged, never kept.
    big = np.ones((1, 40000), dtype=np.int32)
    for _ in range(2):
        np.testing.assert_array_equal(http_infer(t, "m", big, big).as_numpy("OUTPUT0"), big)
    assert t.wait_log("is greater than total cache size: 200000")
    assert "Failed to insert key [" in t.log()
    assert stats(t, "m")["hit"] == 2


def test_without_a_server_cache_nothing_is_cached(tmp_path, start_tern):
    r = repo(tmp_path, {"m": pair("m")})
    t = start_tern([f"--model-repository={r}"])
    http_infer(t, "m", A, B)
    http_infer(t, "m", A, B)
    assert stats(t, "m")["exec"] == 2 and stats(t, "m")["miss"] == 0


def test_decoupled_and_sequence_models_are_refused(tmp_path, start_tern):
    r = repo(tmp_path, {
        "dec": pair("dec", extra="model_transaction_policy { decoupled: true }"),
        "seq": pair("seq", extra="sequence_batching { }"),
    })
    t = start_tern([f"--model-repository={r}", "--cache-config=local,size=1048576", "--exit-on-error=false"])
    c = httpclient.InferenceServerClient(t.url)
    index = {m["name"]: m for m in c.get_model_repository_index()}
    assert index["dec"]["reason"].endswith(
        "Response Cache does not currently support model dec with 'decoupled' transaction policy. Please disable the response cache.")
    assert "Response Cache does not currently support model seq with sequence batching scheduler" in index["seq"]["reason"]


@pytest.mark.parametrize("args, message", [
    (["--cache-config=local"], "No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got local"),
    (["--cache-config=local,size="], "--cache-config option format is '<cache name>,<setting>=<value>'. Got local,size="),
    (["--cache-config=local,foo=1"], "Failed to initialize LocalCache: config didn't contain a valid 'size' field."),
    (["--cache-config=local,size=abc"], "'size' must be a number of bytes, got 'abc'"),
    (["--cache-config=local,size=10", "--cache-config=redis,host=h"], "only a single cache is currently supported"),
    (["--cache-config=redis,host=h"], "Failed to initialize RedisCache, didn't specify address."),
    (["--cache-config=foo,size=1"], "unknown cache 'foo'"),
    (["--cache-config=local,size=10", "--response-cache-byte-size=10"], "Incompatible flags --response-cache-byte-size and --cache-config both provided"),
])
def test_bad_cache_flags_stop_the_server_with_tritons_words(tmp_path, args, message):
    r = repo(tmp_path, {"m": pair("m")})
    p = subprocess.run([tern_bin(), f"--model-repository={r}", "--http-port=0", "--grpc-port=0", "--metrics-port=0", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert message in p.stdout + p.stderr


def test_the_deprecated_byte_size_flag_is_a_local_cache(tmp_path, start_tern):
    r = repo(tmp_path, {"m": pair("m")})
    t = start_tern([f"--model-repository={r}", "--response-cache-byte-size=1048576", "--cache-directory=/opt/tritonserver/caches"])
    http_infer(t, "m", A, B)
    http_infer(t, "m", A, B)
    assert stats(t, "m")["hit"] == 1
    assert "'--response-cache-byte-size' has been deprecated!" in t.log()


# --- the redis cache: a real redis-server (Debian's package, which `make` installs) ---

def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, port=None):
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server not found: `make e2e` installs Debian's redis-server")
        self.port = port or free_port()
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import socket
        import time
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def redis_server():
    r = RedisServer()
    yield r
    r.stop()


def redis_args(port, *extra):
    return ["--cache-config=redis,host=127.0.0.1", f"--cache-config=redis,port={port}", *extra]


def test_servers_sharing_a_redis_share_their_entries(tmp_path, start_tern, redis_server):
    r = repo(tmp_path, {"m": pair("m")})
    one = start_tern([f"--model-repository={r}", *redis_args(redis_server.port)])
    two = start_tern([f"--model-repository={r}", *redis_args(redis_server.port)])
    http_infer(one, "m", A, B)
    assert stats(one, "m")["miss"] == 1
    answer = http_infer(two, "m", A, B, request_id="x")
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), A)
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), B)
    assert answer.get_response()["id"] == "x"
    assert stats(two, "m") == {"exec": 0, "inferences": 0, "success": 1, "hit": 1, "miss": 0, "queue": 1, "compute": 0}
    _, f = scrape(two)
    assert sample(f, "nv_cache_num_hits_per_model", model="m", version="1") == 1
    assert "nv_cache_util" not in f, "the local cache's gauges are the local cache's"


def test_requests_are_answered_while_redis_is_away(tmp_path, start_tern, redis_server):
    import time
    r = repo(tmp_path, {"m": pair("m")})
    t = start_tern([f"--model-repository={r}", *redis_args(redis_server.port, "--cache-config=redis,socket_timeout=300",
                                                            "--cache-config=redis,connect_timeout=300")])
    http_infer(t, "m", A, B)
    http_infer(t, "m", A, B)
    assert stats(t, "m")["hit"] == 1
    redis_server.stop()
    started = time.time()
    for i in range(5):
        np.testing.assert_array_equal(http_infer(t, "m", A + i, B).as_numpy("OUTPUT0"), A + i)
    assert time.time() - started < 10, "a missing redis costs at most its timeouts"
    s = stats(t, "m")
    assert (s["exec"], s["hit"]) == (6, 1), s
    _, f = scrape(t)
    assert sample(f, "tern_response_cache_failures", operation="lookup") >= 5
    assert t.wait_log("Failed to insert key [")
    # Redis back on the same port: the connection comes back by itself.
    back = RedisServer(redis_server.port)
    redis_server.proc = back.proc
    deadline = time.time() + 20
    while time.time() < deadline and stats(t, "m")["hit"] < 2:
        http_infer(t, "m", A + 100, B)
        time.sleep(0.2)
    assert stats(t, "m")["hit"] >= 2, "cached again once redis returned"


def test_an_unreachable_redis_stops_the_startup(tmp_path):
    r = repo(tmp_path, {"m": pair("m")})
    p = subprocess.run([tern_bin(), f"--model-repository={r}", "--http-port=0", "--grpc-port=0", "--metrics-port=0",
                        *redis_args(free_port(), "--cache-config=redis,connect_timeout=300")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "Failed to initialize RedisCache: 127.0.0.1:" in p.stdout + p.stderr
