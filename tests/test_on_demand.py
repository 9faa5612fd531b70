"""Models loaded on demand (`--model-load-on-demand`, explicit mode): many
small models under a memory budget that holds a few, a burst that touches
all of them, requests racing a model's eviction (none may fail), idle
unloading on time, long requests and streams that outlive the idle time,
and the timeout and refusal errors."""

import json
import os
import re
import shutil
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import gen_models
from test_model_control import wait_for

TABLE_MIB = 32
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WASM_DIR = os.environ.get("TERN_PLUGINS_DIR", os.path.join(ROOT, "target", "wasm32-wasip2", "release"))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def on_demand(root, *extra):
    return [f"--model-repository={root}", "--model-control-mode=explicit", "--model-load-on-demand", *extra]


def infer_id(c, model, **kw):
    a = np.array([[1.5, -2.0]], dtype=np.float32)
    i = httpclient.InferInput("INPUT0", list(a.shape), "FP32")
    i.set_data_from_numpy(a)
    out = c.infer(model, [i], **kw).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, a)


def infer_table(c, model):
    i = httpclient.InferInput("INDEX", [1], "INT64")
    i.set_data_from_numpy(np.array([7], dtype=np.int64))
    assert c.infer(model, [i]).as_numpy("VALUE").tolist() == [0.0]


def index(c):
    return {m["name"]: m for m in c.get_model_repository_index()}


def resident(c):
    return sorted(n for n, m in index(c).items() if m["state"] == "READY")


def metric(t, name, **labels):
    text = urllib.request.urlopen(f"http://{t.metrics_url}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}(\{{.*\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_a_burst_over_many_models_loads_each_once_and_waits(start_tern, tmp_path):
    root = str(tmp_path / "models")
    gen_models.on_demand_repo(root, identities=16)
    t = start_tern(on_demand(root))
    c = httpclient.InferenceServerClient(t.url, concurrency=8)
    assert resident(c) == [] and index(c)["id_3"]["reason"] == "not loaded"
    failures = []

    def burst(k):
        try:
            for i in range(16):
                infer_id(httpclient.InferenceServerClient(t.url), f"id_{(i + k) % 16}")
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=burst, args=(k,)) for k in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert failures == []
    assert resident(c) == sorted(f"id_{i}" for i in range(16))
    # Concurrent requests for the same model shared one load.
    assert metric(t, "tern_model_loads_on_demand_total") == 16
    assert metric(t, "tern_model_resident", model="id_5") == 1
    # gRPC loads on demand too; unknown models stay unknown.
    g = grpcclient.InferenceServerClient(t.grpc_url)
    c.unload_model("id_0")
    a = np.array([[3.0]], dtype=np.float32)
    gi = grpcclient.InferInput("INPUT0", list(a.shape), "FP32")
    gi.set_data_from_numpy(a)
    assert g.infer("id_0", [gi]).as_numpy("OUTPUT0").tolist() == [[3.0]]
    with pytest.raises(InferenceServerException, match="unknown model"):
        infer_id(c, "nope")


def test_a_wait_is_bounded_by_the_request_timeout(start_tern, tmp_path):
    root = str(tmp_path / "models")
    gen_models.on_demand_repo(root, tables=1)
    t = start_tern(on_demand(root))
    c = httpclient.InferenceServerClient(t.url)
    i = httpclient.InferInput("INDEX", [1], "INT64")
    i.set_data_from_numpy(np.array([0], dtype=np.int64))
    with pytest.raises(InferenceServerException, match="loading on demand and was not ready within the request's timeout"):
        c.infer("table_0", [i], timeout=1)
    # The load went on: the model serves.
    wait_for(lambda: "table_0" in resident(c), "table_0 to load")
    infer_table(c, "table_0")
    # Over gRPC the same: the server ends the wait (its own error text, not
    # a client-side deadline) and the load goes on.
    c.unload_model("table_0")
    g = grpcclient.InferenceServerClient(t.grpc_url)
    gi = grpcclient.InferInput("INDEX", [1], "INT64")
    gi.set_data_from_numpy(np.array([0], dtype=np.int64))
    with pytest.raises(InferenceServerException, match="loading on demand and was not ready within the request's timeout") as e:
        g.infer("table_0", [gi], timeout=1, client_timeout=30)
    assert "UNAVAILABLE" in str(e.value.status()), e.value.status()
    wait_for(lambda: "table_0" in resident(c), "table_0 to load")
    assert g.infer("table_0", [gi]).as_numpy("VALUE").tolist() == [0.0]


def test_idle_models_unload_on_time_and_pinned_ones_stay(start_tern, tmp_path):
    root = str(tmp_path / "models")
    gen_models.on_demand_repo(root, identities=4, pinned=("id_3",))
    t = start_tern(on_demand(root, "--model-idle-unload-secs=2", "--load-model=id_2"))
    c = httpclient.InferenceServerClient(t.url)
    started = time.time()
    infer_id(c, "id_0")
    infer_id(c, "id_1")
    infer_id(c, "id_3")
    assert resident(c) == ["id_0", "id_1", "id_2", "id_3"]
    # id_1 stays in use; id_0 goes 2 s after its last request (not before;
    # a loaded machine may take longer).
    while "id_0" in resident(c):
        infer_id(c, "id_1")
        time.sleep(0.2)
        assert time.time() - started < 15, "id_0 was not unloaded within 15 s"
    idle_for = time.time() - started
    assert 2.0 <= idle_for < 15.0, idle_for
    row = index(c)["id_0"]
    assert (row["state"], row["reason"]) == ("UNAVAILABLE", "unloaded: idle for 2 s (--model-idle-unload-secs)")
    assert "id_1" in resident(c), "used all along"
    # --load-model and tern_pinned models are pinned.
    wait_for(lambda: resident(c) == ["id_2", "id_3"], "id_1 to be unloaded and the pinned models to stay", timeout=15)
    assert metric(t, "tern_model_evictions_total", model="id_0", reason="idle") == 1
    assert metric(t, "tern_model_resident", model="id_0") == 0
    assert t.wait_log("unloaded: idle for 2 s")
    # A request brings it back.
    infer_id(c, "id_0")
    assert "id_0" in resident(c)


def budget_server(start_tern, root, models_held):
    """A server whose --memory-budget holds about `models_held` table
    models: measured on a first server (its RSS with one and with two tables
    loaded), then set on a second one."""
    probe = start_tern(on_demand(root))
    c = httpclient.InferenceServerClient(probe.url)
    infer_table(c, "table_0")
    one = rss_kib(probe.proc.pid)
    infer_table(c, "table_1")
    two = rss_kib(probe.proc.pid)
    probe.stop()
    cost = two - one
    assert cost > TABLE_MIB * 1024 * 0.8, f"a table model costs {cost} KiB"
    budget = (one + int(cost * (models_held - 0.5))) * 1024
    t = start_tern(on_demand(root, f"--memory-budget={budget}"))
    return t, budget, cost


def test_many_models_under_a_budget_that_holds_a_few(start_tern, tmp_path):
    root = str(tmp_path / "models")
    gen_models.on_demand_repo(root, tables=8, table_mib=TABLE_MIB)
    t, budget, cost = budget_server(start_tern, root, 3)
    c = httpclient.InferenceServerClient(t.url)
    for rnd in range(2):
        for i in range(8):
            infer_table(c, f"table_{i}")
            held = resident(c)
            assert 1 <= len(held) <= 4, held
            rss = rss_kib(t.proc.pid) * 1024
            assert rss < budget + cost * 1024, f"RSS {rss} over budget {budget}"
    # Then a concurrent burst: loads wait for busy models to be free to evict.
    failures = []

    def burst(k):
        cc = httpclient.InferenceServerClient(t.url)
        try:
            for i in range(8):
                infer_table(cc, f"table_{(i * (k + 1)) % 8}")
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(str(e))

    threads = [threading.Thread(target=burst, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert failures == [], failures[:3]
    assert len(resident(c)) >= 2, "the budget holds a few"
    evicted = [m for m in index(c).values() if m["reason"].startswith("evicted to fit")]
    assert evicted, index(c)
    assert re.fullmatch(r"evicted to fit 'table_\d' under --memory-budget", evicted[0]["reason"])
    assert metric(t, "tern_model_evictions_total", reason="memory_budget") >= 8
    assert t.wait_log("under --memory-budget")


def test_requests_racing_an_eviction_are_never_dropped(start_tern, tmp_path):
    """Clients whose pauses straddle the idle time: the model is unloaded
    between their requests, often just as the next one arrives (which then
    waits for the unload and the load after it); requests that take 50 ms are
    in flight when an unload is decided. None may fail."""
    import random

    root = str(tmp_path / "models")
    delay = 'parameters { key: "execute_delay_ms" value { string_value: "50" } }'
    gen_models.write(f"{root}/slow/config.pbtxt", gen_models.io_config("slow", "TYPE_FP32", [-1], 8, "identity", delay))
    gen_models.write(f"{root}/slow/1/.gitkeep", "")
    t = start_tern(on_demand(root, "--model-idle-unload-secs=1"))
    failures, done, counts = [], threading.Event(), []
    rng = random.Random(7)
    pauses = [[rng.uniform(1.0, 1.5) for _ in range(100)] for _ in range(4)]

    def client(k):
        c = httpclient.InferenceServerClient(t.url)
        n = 0
        for pause in pauses[k]:
            if done.is_set():
                break
            try:
                infer_id(c, "slow")
                n += 1
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(str(e))
            time.sleep(pause if k == 0 else pause / 3)
        counts.append(n)

    # One client alone, then all four: idle gaps first, then overlapping traffic.
    threads = [threading.Thread(target=client, args=(0,))]
    for th in threads:
        th.start()
    time.sleep(10)
    more = [threading.Thread(target=client, args=(k,)) for k in (1, 2, 3)]
    for th in more:
        th.start()
    time.sleep(4)
    done.set()
    for th in threads + more:
        th.join(30)
    assert failures == [], failures[:5]
    assert sum(counts) > 20, counts
    evictions = metric(t, "tern_model_evictions_total", model="slow", reason="idle")
    loads = metric(t, "tern_model_loads_on_demand_total")
    assert evictions >= 2 and loads >= evictions, (evictions, loads)


def test_a_load_that_cannot_fit_is_refused_naming_what_is_loaded(start_tern, tmp_path):
    root = str(tmp_path / "models")
    gen_models.on_demand_repo(root, identities=2, tables=1)
    t = start_tern(on_demand(root, "--memory-budget=1Mi", "--load-model=id_0"))
    c = httpclient.InferenceServerClient(t.url)
    i = httpclient.InferInput("INDEX", [1], "INT64")
    i.set_data_from_numpy(np.array([0], dtype=np.int64))
    with pytest.raises(InferenceServerException) as e:
        c.infer("table_0", [i])
    msg = str(e.value)
    assert "cannot load model 'table_0' on demand: it needs about 32.0 MiB" in msg, msg
    assert "--memory-budget 1.0 MiB" in msg and "loaded: 'id_0' (pinned)" in msg, msg
    assert resident(c) == ["id_0"]


def test_long_requests_and_streams_outlive_the_idle_time(start_tern, tmp_path):
    """A request that runs for 3 s, and a decoupled stream of 6 responses
    0.5 s apart over HTTP generate_stream (whose frontend lets go of the
    version it resolved once the stream starts), on models idle-unloaded
    after 1 s: both models keep serving while the work runs, both complete,
    and each model goes only once it is idle."""
    root = str(tmp_path / "models")
    delay = 'parameters { key: "execute_delay_ms" value { string_value: "3000" } }'
    gen_models.write(f"{root}/slow/config.pbtxt", gen_models.io_config("slow", "TYPE_FP32", [-1], 8, "identity", delay))
    gen_models.write(f"{root}/slow/1/.gitkeep", "")
    wasm = os.path.join(WASM_DIR, "stream_count.wasm")
    if not os.path.exists(wasm):
        pytest.fail("the decoupled test plugins are not built (make plugins)")
    os.makedirs(f"{root}/stream_count/1")
    shutil.copy(wasm, f"{root}/stream_count/1/model.wasm")
    gen_models.write(f"{root}/stream_count/config.pbtxt", gen_models.STREAM_CONFIG.format(name="stream_count", count=1))
    t = start_tern(on_demand(root, "--model-idle-unload-secs=1"))
    results, failures = {}, []

    def slow():
        try:
            started = time.time()
            infer_id(httpclient.InferenceServerClient(t.url, network_timeout=60), "slow")
            results["slow"] = time.time() - started
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(f"{type(e).__name__}: {e}")

    def stream():
        body = json.dumps({"COUNT": 6, "delay_ms": 500}).encode()
        req = urllib.request.Request(f"http://{t.url}/v2/models/stream_count/generate_stream", data=body)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read().decode()
            results["stream"] = [json.loads(e[len("data: ") :]) for e in text.strip("\n").split("\n\n")]
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=slow), threading.Thread(target=stream)]
    for th in threads:
        th.start()
    # Past the idle time (and a sweep) with both still at work, both still serve.
    c = httpclient.InferenceServerClient(t.url)
    wait_for(lambda: {"slow", "stream_count"} <= set(resident(c)), "both models to load")
    time.sleep(1.8)
    held = resident(c)
    working = [th.is_alive() for th in threads]
    for th in threads:
        th.join(60)
    assert failures == [], failures
    assert working == [True, True], "the work outlasts the check"
    assert {"slow", "stream_count"} <= set(held), held
    assert results["slow"] >= 3.0, results
    events = results["stream"]
    assert [e.get("OUT") for e in events if "error" not in e] == list(range(6)), events
    assert not [e for e in events if "error" in e], events
    # Idle pressure was there all along: once the work is done, both go.
    wait_for(lambda: not {"slow", "stream_count"} & set(resident(c)), "both models to be unloaded as idle", timeout=15)
    for m in ("slow", "stream_count"):
        assert metric(t, "tern_model_evictions_total", model=m, reason="idle") == 1, m


def test_a_model_with_an_open_sequence_is_not_idle(start_tern, tmp_path):
    """A sequence started and not ended keeps its model loaded past the idle
    time (its state lives in the model); once it ends, the model goes."""
    root = str(tmp_path / "models")
    gen_models.sequence_onnx(f"{root}/acc/1/model.onnx", gen_models.TensorProto.UINT64)
    gen_models.write(
        f"{root}/acc/config.pbtxt",
        gen_models.SEQUENCE_CONFIG.format(name="acc", corrid="TYPE_UINT64", idle=30000000, strategy="direct { }", initial="zero_data: true"),
    )
    t = start_tern(on_demand(root, "--model-idle-unload-secs=1"))
    c = httpclient.InferenceServerClient(t.url)

    def step(value, **kw):
        i = httpclient.InferInput("INPUT", [1, 1], "INT32")
        i.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
        return c.infer("acc", [i], sequence_id=42, **kw).as_numpy("OUTPUT").reshape(-1)[0]

    assert step(5, sequence_start=True) == 5
    time.sleep(2.5)
    assert "acc" in resident(c), "the open sequence keeps it"
    assert step(2, sequence_end=True) == 7, "the sequence's state survived"
    wait_for(lambda: "acc" not in resident(c), "acc to be unloaded once the sequence ended", timeout=15)
