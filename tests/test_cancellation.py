"""Request cancellation, end to end: a request whose client goes away while it
waits in a model's queue never executes and is counted as a CANCELED failure
(Triton's request cancellation). Covered: tritonclient.grpc `async_infer` +
`cancel()`, a client deadline, `grpc.aio` task cancellation, a stream stopped with
`cancel_requests=True`, an HTTP client that closes its connection, and an
ensemble abandoned while its first step is queued.

Each test holds the single instance of `slow` (identity, 600 ms per execution,
one request at a time) with a first request, queues a second behind it and
cancels that one."""

import asyncio
import json
import queue
import re
import socket
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from test_batching import make_repo

DELAY_MS = 600

SLOW = f'''name: "slow"
backend: "identity"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{DELAY_MS}" }} }}
'''

SLOW_CHAIN = '''name: "slow_chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "slow" model_version: -1 input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "mid" } },
    { model_name: "slow" model_version: -1 input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "OUT" } }
  ]
}
'''


@pytest.fixture
def tern(start_tern, tmp_path):
    repo = make_repo(tmp_path, {"slow": SLOW, "slow_chain": SLOW_CHAIN})
    return start_tern([f"--model-repository={repo}", "--log-verbose=1"])


def data(value):
    return np.full((1, 4), value, dtype=np.int32)


def grpc_input(value, name="INPUT0"):
    inp = grpcclient.InferInput(name, [1, 4], "INT32")
    inp.set_data_from_numpy(data(value))
    return inp


def model_stats(t, model):
    with urllib.request.urlopen(f"http://{t.url}/v2/models/{model}/stats") as r:
        s = json.loads(r.read())["model_stats"][0]
    inf = s["inference_stats"]
    return {
        "executions": s["execution_count"],
        "inferences": s["inference_count"],
        "success": inf["success"]["count"],
        "fail": inf["fail"]["count"],
    }


def canceled_metric(t, model):
    with urllib.request.urlopen(f"http://{t.metrics_url}/metrics") as r:
        text = r.read().decode()
    m = re.search(r'nv_inference_request_failure\{[^}]*model="%s"[^}]*reason="CANCELED"[^}]*\} (\d+)' % model, text)
    assert m, f"no CANCELED series for {model}"
    return int(m.group(1))


def pending(t, model="slow"):
    with urllib.request.urlopen(f"http://{t.metrics_url}/metrics") as r:
        text = r.read().decode()
    m = re.search(r'nv_inference_pending_request_count\{[^}]*model="%s"[^}]*\} (\d+)' % model, text)
    return int(m.group(1)) if m else 0


def running(t):
    """Waits until the first request holds the instance."""
    assert t.wait_log("executing model=slow"), t.log()


def queued(t, model="slow"):
    """Waits until the second request is in the queue behind it."""
    assert wait_for(lambda: pending(t, model) == 1), "the second request never queued"


@pytest.fixture
def held(tern):
    """(client, results): the first request (value 1) has been sent and holds
    the instance; its result goes to `results` as ("first", result, error)."""
    c = grpcclient.InferenceServerClient(tern.grpc_url)
    results = queue.Queue()
    c.async_infer("slow", [grpc_input(1)], callback=lambda result, error: results.put(("first", result, error)))
    running(tern)
    yield c, results
    c.close()


def wait_for(check, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def assert_one_cancelled(t, model="slow"):
    """The first request ran; the second was removed from the queue unexecuted."""
    assert wait_for(lambda: model_stats(t, model)["fail"] == 1), model_stats(t, model)
    s = model_stats(t, model)
    assert s == {"executions": 1, "inferences": 1, "success": 1, "fail": 1}, s
    assert canceled_metric(t, model) == 1
    # The statistics are counted before the line reaches the log file.
    assert wait_for(lambda: "request cancelled by its client before it executed" in t.log()), t.log()


def test_grpc_async_infer_cancelled_while_queued(tern, held):
    c, results = held
    ctx = c.async_infer("slow", [grpc_input(2)], callback=lambda result, error: results.put(("second", result, error)))
    queued(tern)
    ctx.cancel()
    got = {}
    for _ in range(2):
        which, r, e = results.get(timeout=10)
        got[which] = (r, e)
    r, e = got["first"]
    assert e is None and (r.as_numpy("OUTPUT0") == data(1)).all()
    r, e = got["second"]
    assert r is None and "CANCELLED" in str(e.status())
    assert_one_cancelled(tern)
    # The server goes on serving the model normally.
    out = c.infer("slow", [grpc_input(3)]).as_numpy("OUTPUT0")
    assert (out == data(3)).all()


def test_grpc_client_deadline_while_queued(tern, held):
    c, results = held
    with pytest.raises(InferenceServerException) as e:
        c.infer("slow", [grpc_input(2)], client_timeout=0.2)
    assert "DEADLINE_EXCEEDED" in str(e.value.status())
    _, r, err = results.get(timeout=10)
    assert err is None
    assert_one_cancelled(tern)


def test_grpc_aio_task_cancelled_while_queued(tern):
    async def run():
        c = grpcaio.InferenceServerClient(tern.grpc_url)
        first = asyncio.create_task(c.infer("slow", [grpc_input(1)]))
        await asyncio.to_thread(running, tern)
        second = asyncio.create_task(c.infer("slow", [grpc_input(2)]))
        await asyncio.to_thread(queued, tern)
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        r = await first
        assert (r.as_numpy("OUTPUT0") == data(1)).all()
        await c.close()

    asyncio.run(run())
    assert_one_cancelled(tern)


def test_stream_stopped_with_cancel_requests(tern):
    c = grpcclient.InferenceServerClient(tern.grpc_url)
    results = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    c.async_stream_infer("slow", [grpc_input(1)], request_id="first")
    running(tern)
    c.async_stream_infer("slow", [grpc_input(2)], request_id="second")
    queued(tern)
    c.stop_stream(cancel_requests=True)
    # Neither response reaches the client (the stream is gone); the first
    # request still ran, the second never did.
    assert wait_for(lambda: model_stats(tern, "slow")["success"] == 1)
    assert_one_cancelled(tern)
    c.close()


def test_http_connection_closed_while_queued(tern, held):
    c, results = held
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "INT32", "data": [2, 2, 2, 2]}]}).encode()
    host, port = tern.url.split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(
        b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    queued(tern)
    s.close()
    _, r, e = results.get(timeout=10)
    assert e is None
    assert_one_cancelled(tern)


def test_ensemble_abandoned_between_steps(tern, held):
    """Cancelled while its first step waits behind another request: no step runs."""
    c, results = held
    ctx = c.async_infer("slow_chain", [grpc_input(2, "IN")], callback=lambda result, error: results.put(("second", result, error)))
    queued(tern)
    ctx.cancel()
    for _ in range(2):
        results.get(timeout=10)
    assert_one_cancelled(tern, "slow")
    assert wait_for(lambda: model_stats(tern, "slow_chain")["fail"] == 1)
    assert model_stats(tern, "slow_chain") == {"executions": 0, "inferences": 0, "success": 0, "fail": 1}
    assert canceled_metric(tern, "slow_chain") == 1
    # A complete ensemble request afterwards runs both steps.
    out = c.infer("slow_chain", [grpc_input(4, "IN")]).as_numpy("OUT")
    assert (out == data(4)).all()


def test_request_not_cancelled_is_unaffected(tern):
    """Many requests queued behind each other all complete when nobody cancels."""
    c = grpcclient.InferenceServerClient(tern.grpc_url)
    results = queue.Queue()
    for i in range(3):
        c.async_infer("slow", [grpc_input(i)], callback=lambda result, error, i=i: results.put((i, result, error)))
    for _ in range(3):
        i, r, e = results.get(timeout=10)
        assert e is None and (r.as_numpy("OUTPUT0") == data(i)).all()
    s = model_stats(tern, "slow")
    assert s["fail"] == 0 and s["success"] == 3
    assert canceled_metric(tern, "slow") == 0
    with pytest.raises(InferenceServerException):
        c.infer("missing", [grpc_input(0)])
    c.close()
