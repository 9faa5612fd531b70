"""The rate limiter (Triton's --rate-limit=execution_count,
--rate-limit-resource and instance_group rate_limiter) through the built
binary: instances of different models that share a resource never run at
the same time while the limiter is on and do without it; enough copies let
them run together; priorities weight the turns; a model asking for more than
a declared total fails to load with Triton's text; bad flags stop the server."""

import concurrent.futures
import subprocess
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import tern_bin
from test_response_cache import repo


def model(name, delay_ms, resources, priority=1, count=1):
    res = ", ".join(f'{{ name: "{n}" count: {c} {"global: true" if g else ""} }}' for n, c, g in resources)
    return f'''name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: {count} rate_limiter {{ resources [ {res} ] priority: {priority} }} }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
'''


def infer(url, name, value=1):
    c = httpclient.InferenceServerClient(url, network_timeout=60)
    i = httpclient.InferInput("INPUT0", [1], "INT32")
    i.set_data_from_numpy(np.array([value], dtype=np.int32))
    return c.infer(name, [i]).as_numpy("OUTPUT0")[0]


def burst(url, names, per_model):
    """`per_model` requests to each model at once; the wall time."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(names) * per_model) as pool:
        futures = [pool.submit(infer, url, n, k) for n in names for k in range(per_model)]
        for f in futures:
            f.result()
    return time.perf_counter() - start


def executions(url, name):
    return httpclient.InferenceServerClient(url).get_inference_statistics(name)["model_stats"][0]["execution_count"]


TWO = lambda count=1, glob=False: {"a": model("a", 300, [("R", count, glob)]), "b": model("b", 300, [("R", count, glob)])}


@pytest.mark.parametrize("glob", [False, True], ids=["per-device", "global"])
def test_instances_sharing_a_resource_take_turns(tmp_path, start_tern, glob):
    r = repo(tmp_path, TWO(glob=glob))
    on = start_tern([f"--model-repository={r}", "--rate-limit=execution_count"])
    infer(on.url, "a"), infer(on.url, "b")
    # 3 requests to each of two one-instance models of 300 ms: in turns 1.8 s,
    # side by side 0.9 s.
    took = burst(on.url, ["a", "b"], 3)
    assert took >= 1.7, f"{took:.2f} s: a and b ran at the same time"
    on.stop()
    off = start_tern([f"--model-repository={r}"])
    took = burst(off.url, ["a", "b"], 3)
    assert took < 1.5, f"{took:.2f} s without the limiter"


def test_enough_copies_let_them_run_together(tmp_path, start_tern):
    r = repo(tmp_path, TWO())
    t = start_tern([f"--model-repository={r}", "--rate-limit=execution_count", "--rate-limit-resource=R:2"])
    took = burst(t.url, ["a", "b"], 3)
    assert took < 1.5, f"{took:.2f} s with two copies of R"


def test_priorities_weight_the_turns(tmp_path, start_tern):
    # Two instances of each: whenever R frees, instances of both priorities wait for it.
    r = repo(tmp_path, {"one": model("one", 20, [("R", 1, False)], priority=1, count=2),
                        "two": model("two", 20, [("R", 1, False)], priority=2, count=2)})
    t = start_tern([f"--model-repository={r}", "--rate-limit=execution_count"])
    stop = time.monotonic() + 4
    def flood(name):
        while time.monotonic() < stop:
            infer(t.url, name)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(flood, n) for n in ("one", "two") for _ in range(4)]:
            f.result()
    one, two = executions(t.url, "one"), executions(t.url, "two")
    assert two > 10, (one, two)
    assert 1.5 <= one / two <= 2.7, f"priority 1 ran {one} times, priority 2 {two}"


def test_a_need_above_a_declared_total_fails_the_load(tmp_path, start_tern):
    r = repo(tmp_path, {"big": model("big", 0, [("R", 3, False)]), "small": model("small", 0, [("R", 2, False)])})
    t = start_tern([f"--model-repository={r}", "--rate-limit=execution_count", "--rate-limit-resource=R:2",
                    "--exit-on-error=false"])
    index = {m["name"]: m for m in httpclient.InferenceServerClient(t.url).get_model_repository_index()}
    assert index["small"]["state"] == "READY"
    assert index["big"]["state"] == "UNAVAILABLE"
    assert ('Resource count for "R" is limited to 2 which will prevent scheduling of one or more model '
            'instances, the minimum required count is 3') in index["big"]["reason"]
    assert infer(t.url, "small", 5) == 5


@pytest.mark.parametrize("flag", ["--rate-limit=sometimes", "--rate-limit-resource=R", "--rate-limit-resource=R:x",
                                  "--rate-limit-resource=R:1:gpu"])
def test_bad_rate_limit_flags_stop_the_server(tmp_path, flag):
    r = repo(tmp_path, TWO())
    p = subprocess.run([tern_bin(), f"--model-repository={r}", "--http-port=0", "--grpc-port=0", "--metrics-port=0", flag],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "rate-limit" in p.stdout + p.stderr
