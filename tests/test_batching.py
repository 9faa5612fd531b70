"""Dynamic batcher, queue policies, warmup, statistics and logging, end to end.

Each test writes its own small repository of identity models and starts the
real binary, using Triton's QA hook TRITONSERVER_DELAY_SCHEDULER=N (hold
requests until N are queued) to make batch composition deterministic."""

import concurrent.futures
import json
import os
import re
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import Tern
from test_http import raw


def identity_model(name, max_batch=8, dims="[ -1 ]", dyna="dynamic_batching { }", count=1, delay_ms=0, extra="", ragged=False):
    return f'''name: "{name}"
backend: "identity"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: {dims} {"allow_ragged_batch: true" if ragged else ""} }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: {dims} }} ]
instance_group [ {{ kind: KIND_CPU count: {count} }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
{dyna}
{extra}
'''


def make_repo(tmp_path, models, files=None):
    root = tmp_path / "models"
    for name, cfg in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(cfg)
    for path, data in (files or {}).items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return str(root)


def start(start_tern, repo, hook=None, extra_args=()):
    env = {"TRITONSERVER_DELAY_SCHEDULER": str(hook)} if hook else {}
    return start_tern([f"--model-repository={repo}", "--log-verbose=1", *extra_args], env=env)


def infer(url, model, data, request_id="", params=None):
    c = httpclient.InferenceServerClient(url, connection_timeout=60, network_timeout=60)
    try:
        inp = httpclient.InferInput("INPUT0", list(data.shape), "INT32")
        inp.set_data_from_numpy(data)
        params = dict(params or {})
        kw = {k: params.pop(k) for k in ("priority", "timeout") if k in params}
        return c.infer(model, [inp], request_id=request_id, parameters=params or None, **kw).as_numpy("OUTPUT0")
    finally:
        c.close()


def send_all(url, model, datas, gap=0.02, ids=None, params=None):
    """Sends requests in this order (gap apart) from separate threads; returns results or exceptions."""
    with concurrent.futures.ThreadPoolExecutor(len(datas)) as pool:
        futures = []
        for i, d in enumerate(datas):
            futures.append(pool.submit(infer, url, model, d, ids[i] if ids else str(i), params[i] if params else None))
            time.sleep(gap)
        out = []
        for f in futures:
            try:
                out.append(f.result())
            except InferenceServerException as e:
                out.append(e)
        return out


def stats(url, model):
    status, _, body = raw(type("S", (), {"url": url})(), "GET", f"/v2/models/{model}/stats")
    assert status == 200, body
    return json.loads(body)["model_stats"][0]


def batch_sizes(st):
    return {b["batch_size"]: b["compute_infer"]["count"] for b in st["batch_stats"]}


def executions(t, model, settle=0.3, timeout=10):
    """Batches as logged by the 'executing' lines: list of request-id lists.

    The server writes its log from a thread of its own and the test reads it
    through another, so a line logged before a response may arrive after it:
    wait until some lines are there and none has come for `settle` seconds."""

    def parse():
        out = []
        for line in t.log().splitlines():
            m = re.search(rf"executing model={model} version=\d+ instance=\S+ batch_size=\d+ requests=\d+ ids=\[([^\]]*)\]", line)
            if m:
                out.append(m.group(1).split(","))
        return out

    deadline = time.time() + timeout
    last, since = parse(), time.time()
    while time.time() < deadline:
        time.sleep(0.05)
        now = parse()
        if now != last:
            last, since = now, time.time()
        elif last and time.time() - since >= settle:
            break
    return last


def ones(batch=1, width=4, value=1):
    return np.full((batch, width), value, dtype=np.int32)


def test_largest_preferred_batch_first(start_tern, tmp_path):
    repo = make_repo(tmp_path, {"m": identity_model("m", dyna="dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 10000000 }", delay_ms=50)})
    t = start(start_tern, repo, hook=6)
    results = send_all(t.url, "m", [ones(value=i) for i in range(6)])
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r, ones(value=i))
    st = stats(t.url, "m")
    assert batch_sizes(st) == {4: 1, 2: 1}
    assert st["execution_count"] == 2 and st["inference_count"] == 6
    assert [len(b) for b in executions(t, "m")] == [4, 2]


def test_queue_delay_expiry_sends_what_is_queued(start_tern, tmp_path):
    repo = make_repo(tmp_path, {"m": identity_model("m", dyna="dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 400000 }")})
    t = start(start_tern, repo)
    began = time.time()
    results = send_all(t.url, "m", [ones(value=i) for i in range(3)], gap=0.01)
    elapsed = time.time() - began
    assert all(isinstance(r, np.ndarray) for r in results)
    assert elapsed >= 0.35, elapsed
    assert batch_sizes(stats(t.url, "m")) == {3: 1}


def test_max_batch_size_never_exceeded(start_tern, tmp_path):
    repo = make_repo(tmp_path, {"m": identity_model("m", max_batch=4, delay_ms=50)})
    t = start(start_tern, repo, hook=7)
    batches = [1, 2, 1, 3, 1, 1, 2]
    results = send_all(t.url, "m", [ones(batch=b, value=i) for i, b in enumerate(batches)])
    for i, (b, r) in enumerate(zip(batches, results)):
        np.testing.assert_array_equal(r, ones(batch=b, value=i))
    # Arrival order 1,2,1 | 3,1 | 1,2 : each batch as large as fits, never above 4.
    assert batch_sizes(stats(t.url, "m")) == {4: 2, 3: 1}


def test_shape_mismatch_keeps_requests_apart(start_tern, tmp_path):
    repo = make_repo(tmp_path, {"m": identity_model("m", delay_ms=50)})
    t = start(start_tern, repo, hook=4)
    datas = [ones(width=2, value=0), ones(width=2, value=1), ones(width=3, value=2), ones(width=3, value=3)]
    results = send_all(t.url, "m", datas)
    for d, r in zip(datas, results):
        np.testing.assert_array_equal(r, d)
    assert batch_sizes(stats(t.url, "m")) == {2: 2}
    assert executions(t, "m") == [["0", "1"], ["2", "3"]]


def test_ragged_inputs_batch_together(start_tern, tmp_path):
    repo = make_repo(tmp_path, {"m": identity_model("m", ragged=True, delay_ms=50)})
    t = start(start_tern, repo, hook=3)
    datas = [ones(width=w, value=w) for w in (2, 3, 5)]
    results = send_all(t.url, "m", datas)
    for d, r in zip(datas, results):
        np.testing.assert_array_equal(r, d)
    assert batch_sizes(stats(t.url, "m")) == {3: 1}


def test_priorities(start_tern, tmp_path):
    dyna = "dynamic_batching { preferred_batch_size: [ 1 ] priority_levels: 2 default_priority_level: 2 }"
    repo = make_repo(tmp_path, {"m": identity_model("m", dyna=dyna, delay_ms=20)})
    t = start(start_tern, repo, hook=3)
    results = send_all(t.url, "m", [ones()] * 3, ids=["low-a", "low-b", "high"], params=[None, None, {"priority": 1}])
    assert all(isinstance(r, np.ndarray) for r in results)
    assert executions(t, "m") == [["high"], ["low-a"], ["low-b"]]
    # As Triton: a priority above priority_levels runs at the default level.
    np.testing.assert_array_equal(infer(t.url, "m", ones(), params={"priority": 3}), ones())


def test_queue_policy_reject_delay_and_override(start_tern, tmp_path):
    models = {
        "reject": identity_model("reject", delay_ms=400, dyna="dynamic_batching { default_queue_policy { default_timeout_microseconds: 100000 } }"),
        "delay": identity_model("delay", delay_ms=400, dyna="dynamic_batching { default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100000 } }"),
        "override": identity_model(
            "override",
            delay_ms=400,
            dyna="dynamic_batching { default_queue_policy { default_timeout_microseconds: 200000 allow_timeout_override: true } }",
        ),
        "small": identity_model("small", delay_ms=400, dyna="dynamic_batching { default_queue_policy { max_queue_size: 1 } }"),
    }
    t = start(start_tern, make_repo(tmp_path, models))
    # The first request occupies the only instance; the second waits past its timeout.
    r = send_all(t.url, "reject", [ones(value=1), ones(value=2)], gap=0.05)
    np.testing.assert_array_equal(r[0], ones(value=1))
    assert isinstance(r[1], InferenceServerException) and r[1].status() == "503" and "timeout expired" in r[1].message()
    r = send_all(t.url, "delay", [ones(value=1), ones(value=2)], gap=0.05)
    assert all(isinstance(x, np.ndarray) for x in r), r
    # A request may shorten the timeout (10 ms) but not lengthen it (10 s stays 200 ms).
    r = send_all(t.url, "override", [ones(), ones(), ones()], gap=0.05, params=[None, {"timeout": 10000}, {"timeout": 10000000}])
    assert isinstance(r[0], np.ndarray)
    assert isinstance(r[1], InferenceServerException) and "timeout expired" in r[1].message()
    assert isinstance(r[2], InferenceServerException) and "timeout expired" in r[2].message()
    # max_queue_size 1: one executing, one queued, the third is refused at once with 503.
    began = time.time()
    r = send_all(t.url, "small", [ones(), ones(), ones()], gap=0.05)
    assert isinstance(r[0], np.ndarray) and isinstance(r[1], np.ndarray)
    assert isinstance(r[2], InferenceServerException) and r[2].status() == "503" and "Exceeds maximum queue size" in r[2].message()
    st = stats(t.url, "small")
    assert st["inference_stats"]["success"]["count"] == 2 and st["inference_stats"]["fail"]["count"] == 1
    assert time.time() - began < 5


def test_a_model_without_batching_keeps_dynamic_batching_queue_policies(start_tern, tmp_path):
    """As in Triton, `dynamic_batching` on a max_batch_size 0 model gives it the
    batcher's queue: max_queue_size refuses the overflow, each request still
    executes alone, and the queue delay does not hold a lone request."""
    dyna = "dynamic_batching { max_queue_delay_microseconds: 10000000 default_queue_policy { max_queue_size: 1 } }"
    repo = make_repo(tmp_path, {"nobatch": identity_model("nobatch", max_batch=0, dims="[ -1, -1 ]", dyna=dyna, delay_ms=400)})
    t = start(start_tern, repo)
    began = time.time()
    r = send_all(t.url, "nobatch", [ones(value=1), ones(value=2), ones(value=3)], gap=0.05)
    np.testing.assert_array_equal(r[0], ones(value=1))
    np.testing.assert_array_equal(r[1], ones(value=2))
    assert isinstance(r[2], InferenceServerException) and r[2].status() == "503", r[2]
    assert "Exceeds maximum queue size" in r[2].message()
    assert executions(t, "nobatch") == [["0"], ["1"]]
    assert time.time() - began < 5


def test_two_instances_execute_in_parallel(start_tern, tmp_path):
    repo = make_repo(tmp_path, {"m": identity_model("m", max_batch=1, count=2, delay_ms=500, dyna="")})
    t = start(start_tern, repo)
    began = time.time()
    results = send_all(t.url, "m", [ones(value=1), ones(value=2)], gap=0.0)
    assert time.time() - began < 0.95
    np.testing.assert_array_equal(results[1], ones(value=2))
    st = stats(t.url, "m")
    assert st["execution_count"] == 2 and st["inference_count"] == 2


def test_statistics_are_exact(start_tern, tmp_path):
    repo = make_repo(tmp_path, {"m": identity_model("m", delay_ms=30)})
    t = start(start_tern, repo, hook=3)
    send_all(t.url, "m", [ones(batch=2), ones(batch=1), ones(batch=3)])
    infer(t.url, "m", ones(batch=1))
    with pytest.raises(InferenceServerException):
        infer(t.url, "m", ones(batch=9))  # over max_batch_size: a failure, never executed
    st = stats(t.url, "m")
    assert st["name"] == "m" and st["version"] == "1"
    assert st["inference_count"] == 7
    assert st["execution_count"] == 2
    s = st["inference_stats"]
    assert s["success"]["count"] == 4 and s["fail"]["count"] == 1 and s["queue"]["count"] == 4
    assert s["compute_infer"]["count"] == 4 and s["compute_infer"]["ns"] >= 4 * 30_000_000
    assert batch_sizes(st) == {6: 1, 1: 1}
    assert st["last_inference"] > 1_600_000_000_000
    status, _, body = raw(type("S", (), {"url": t.url})(), "GET", "/v2/models/stats")
    assert [m["name"] for m in json.loads(body)["model_stats"]] == ["m"]
    status, _, body = raw(type("S", (), {"url": t.url})(), "GET", "/v2/models/nope/stats")
    assert status == 404


def test_many_threads_never_mix_outputs(start_tern, tmp_path, test_repo):
    import shutil

    root = tmp_path / "models"
    shutil.copytree(os.path.join(test_repo, "simple"), root / "simple")
    cfg = (root / "simple" / "config.pbtxt").read_text()
    (root / "simple" / "config.pbtxt").write_text(cfg + "\ndynamic_batching { max_queue_delay_microseconds: 2000 }\n")
    t = start_tern([f"--model-repository={root}"])

    def one(i):
        c = httpclient.InferenceServerClient(t.url)
        try:
            a = np.full((1 + i % 3, 16), i, dtype=np.int32)
            b = np.tile(np.arange(16, dtype=np.int32), (1 + i % 3, 1))
            inputs = [httpclient.InferInput("INPUT0", list(a.shape), "INT32"), httpclient.InferInput("INPUT1", list(b.shape), "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            r = c.infer("simple", inputs, request_id=str(i))
            return r.get_response()["id"] == str(i) and np.array_equal(r.as_numpy("OUTPUT0"), a + b) and np.array_equal(r.as_numpy("OUTPUT1"), a - b)
        finally:
            c.close()

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        assert all(pool.map(one, range(300)))
    st = stats(t.url, "simple")
    assert st["execution_count"] < 300  # requests really were batched
    assert st["inference_stats"]["success"]["count"] == 300


def test_auto_complete_enables_dynamic_batching(client):
    cfg = client.get_model_config("simple_autocomplete")
    assert cfg["max_batch_size"] == 4 and "dynamic_batching" in cfg


def test_warmup_runs_on_every_instance_before_ready(start_tern, tmp_path):
    warm = '''model_warmup [
  { name: "zeros" batch_size: 2 inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } } },
  { name: "random" batch_size: 1 count: 2 inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 4 ] random_data: true } } },
  { name: "file" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 4 ] input_data_file: "in.bin" } } }
]'''
    bad = '''model_warmup [ { name: "short_file" batch_size: 1 inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 4 ] input_data_file: "short.bin" } } } ]'''
    repo = make_repo(
        tmp_path,
        {"good": identity_model("good", count=2, extra=warm), "bad": identity_model("bad", extra=bad)},
        files={"good/warmup/in.bin": np.arange(4, dtype=np.int32).tobytes(), "bad/warmup/short.bin": b"\0" * 3},
    )
    t = start_tern([f"--model-repository={repo}", "--exit-on-error=false"])
    c = httpclient.InferenceServerClient(t.url)
    assert c.is_model_ready("good") and not c.is_model_ready("bad")
    warm_lines = [l for l in t.log().splitlines() if "warmup sample" in l and "good" in l]
    assert len([l for l in warm_lines if "'zeros'" in l]) == 2  # once per instance
    assert any("'random' ran 2 time(s)" in l for l in warm_lines)
    index = {r["name"]: r for r in c.get_model_repository_index()}
    assert "warmup sample 'short_file'" in index["bad"]["reason"]
    # Warmup executions do not count in the statistics.
    assert stats(t.url, "good")["execution_count"] == 0


def test_warmup_failure_fails_the_load(start_tern, tmp_path):
    cfg = identity_model("m", extra='model_warmup [ { name: "w" batch_size: 1 inputs { key: "WRONG" value: { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } } } ]')
    t = start_tern([f"--model-repository={make_repo(tmp_path, {'m': cfg})}", "--exit-on-error=false"])
    index = httpclient.InferenceServerClient(t.url).get_model_repository_index()
    assert index[0]["state"] == "UNAVAILABLE" and "warmup sample 'w'" in index[0]["reason"]


def test_logging_extension_and_formats(start_tern, tmp_path):
    repo = make_repo(tmp_path, {"m": identity_model("m")})
    t = start_tern([f"--model-repository={repo}", "--log-format=ISO8601"])
    s = type("S", (), {"url": t.url})()
    status, _, body = raw(s, "GET", "/v2/logging")
    settings = json.loads(body)
    assert settings == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0, "log_format": "ISO8601"}
    # Triton's layout: level letter, process id, source file and line, the message as a JSON string.
    assert any(re.match(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ \w+\.rs:\d+\] "', l) for l in t.log().splitlines())
    infer(t.url, "m", ones(), request_id="quiet")
    status, _, body = raw(s, "POST", "/v2/logging", json.dumps({"log_verbose_level": 1, "log_format": "default"}).encode())
    assert status == 200 and json.loads(body)["log_verbose_level"] == 1
    infer(t.url, "m", ones(), request_id="loud")
    time.sleep(0.2)
    assert executions(t, "m") == [["loud"]]
    assert any(re.match(r'I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ \w+\.rs:\d+\] "executing model=m', l) for l in t.log().splitlines())
    # A request id cannot forge a log line: the message is escaped.
    infer(t.url, "m", ones(), request_id='x\nE1129 00:00:00.000000 1 forged.cc:1] "boom"')
    assert t.wait_log('ids=[x\\nE1129 00:00:00.000000 1 forged.cc:1] \\"boom\\"]')
    assert not any(l.startswith("E1129 00:00:00.000000 1 forged") for l in t.log().splitlines())
    status, _, body = raw(s, "POST", "/v2/logging", json.dumps({"log_file": "/tmp/x"}).encode())
    assert status == 501
    status, _, body = raw(s, "POST", "/v2/logging", json.dumps({"log_verbose_level": "high"}).encode())
    assert status == 400


def test_a_string_onnx_cannot_take_fails_alone_in_its_batch(start_tern, tmp_path):
    """A NUL byte or invalid UTF-8 cannot become an ORT string: that request gets a 400, its batch-mates run."""
    import gen_models
    from onnx import TensorProto

    cfg = '''name: "s"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
dynamic_batching { }
'''
    repo = make_repo(tmp_path, {"s": cfg})
    gen_models.identity_onnx(f"{repo}/s/1/model.onnx", TensorProto.STRING, ["batch", "n"])
    t = start(start_tern, repo, hook=4)
    datas = [[b"a", b"b"], [b"x\x00y", b"c"], [b"d", b"e"], [b"f", b"\xff"]]

    def one(i):
        c = httpclient.InferenceServerClient(t.url, network_timeout=60)
        inp = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
        inp.set_data_from_numpy(np.array([datas[i]], dtype=np.object_))
        try:
            return c.infer("s", [inp], request_id=str(i)).as_numpy("OUTPUT0")
        except InferenceServerException as e:
            return e
        finally:
            c.close()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    assert [len(b) for b in executions(t, "s")] == [4], "the four requests were batched together"
    for i in (0, 2):
        assert list(results[i].flatten()) == datas[i]
    assert isinstance(results[1], InferenceServerException) and results[1].status() == "400"
    assert "input 'INPUT0': element 0 has a NUL byte at position 1" in results[1].message()
    assert isinstance(results[3], InferenceServerException) and results[3].status() == "400"
    assert "element 1 is not valid UTF-8" in results[3].message()
