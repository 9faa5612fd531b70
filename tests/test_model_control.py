"""Model control: poll mode following repository changes under constant
traffic, explicit mode through tritonclient (HTTP and gRPC: loads with a
config override and with files, unloads, dependents, the index), loads
under heavy concurrent traffic, and memory returned after unloads."""

import json
import os
import shutil
import sys
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern, gen_models

sys.path.insert(0, os.path.join(ROOT, "tests", "bench"))
from http_load import rss_kib  # noqa: E402


def identity_inputs(values, client=httpclient):
    a = np.array([values], dtype=np.float32)
    i = client.InferInput("INPUT0", list(a.shape), "FP32")
    i.set_data_from_numpy(a)
    return i, a


def index(c):
    return {(m["name"], m.get("version", "")): m for m in c.get_model_repository_index()}


def wait_for(check, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Traffic:
    """A client thread sending requests to `model` the whole time, checking every answer."""

    def __init__(self, url, model):
        self.c = httpclient.InferenceServerClient(url)
        self.model = model
        self.stop = threading.Event()
        self.ok = 0
        self.failures = []
        self.versions = set()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            inp, a = identity_inputs([n, n + 1])
            try:
                r = self.c.infer(self.model, [inp])
                out = r.as_numpy("OUTPUT0")
                if out is None or not np.array_equal(out, a):
                    self.failures.append(f"wrong answer {out} for {a}")
                self.versions.add(r.get_response()["model_version"])
                self.ok += 1
            except Exception as e:  # noqa: BLE001 - every failure is recorded
                self.failures.append(str(e))

    def finish(self):
        self.stop.set()
        self.thread.join(30)
        self.c.close()


def poll_repo(root):
    os.makedirs(root)
    for name in ("m", "doomed"):
        gen_models.write(f"{root}/{name}/config.pbtxt", gen_models.io_config(name, "TYPE_FP32", [-1], 8, "identity"))
        os.makedirs(f"{root}/{name}/1")


def test_poll_mode_with_poll_secs_0_reads_the_repository_once(tmp_path):
    """As tritonserver: --repository-poll-secs=0 in poll mode is accepted; the
    models found at startup load, the API stays refused, and a folder added
    later is not loaded."""
    root = str(tmp_path / "models")
    poll_repo(root)
    t = Tern([f"--model-repository={root}", "--model-control-mode=poll", "--repository-poll-secs=0"])
    try:
        c = httpclient.InferenceServerClient(t.url)
        assert c.is_model_ready("m")
        with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed"):
            c.load_model("m")
        gen_models.write(f"{root}/late/config.pbtxt", gen_models.io_config("late", "TYPE_FP32", [-1], 8, "identity"))
        os.makedirs(f"{root}/late/1")
        time.sleep(2)
        assert not c.is_model_ready("late")
        assert t.wait_log("not polled after startup")
    finally:
        t.stop()


def test_poll_mode_follows_the_repository_under_traffic(tmp_path):
    root = str(tmp_path / "models")
    poll_repo(root)
    t = Tern([f"--model-repository={root}", "--model-control-mode=poll", "--repository-poll-secs=1"])
    c = httpclient.InferenceServerClient(t.url)
    traffic = Traffic(t.url, "m")
    try:
        # API loads are refused in poll mode, as Triton does.
        with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed"):
            c.load_model("m")
        # A new version folder (made elsewhere, then moved in): served once ready.
        os.makedirs(f"{root}/.v2")
        os.rename(f"{root}/.v2", f"{root}/m/2")
        wait_for(lambda: index(c).get(("m", "2"), {}).get("state") == "READY", "version 2 READY")
        wait_for(lambda: "2" in traffic.versions, "traffic answered by version 2")
        assert ("m", "1") not in index(c), "latest policy: version 1 replaced"
        # A config change: serve every version.
        cfg = gen_models.io_config("m", "TYPE_FP32", [-1], 8, "identity", "version_policy: { all: {} }")
        gen_models.write(f"{root}/m/config.pbtxt", cfg)
        wait_for(lambda: index(c).get(("m", "1"), {}).get("state") == "READY", "version 1 back with policy all")
        assert c.is_model_ready("m", "1") and c.is_model_ready("m", "2")
        # Broken config: the loaded versions keep serving and the index says why.
        gen_models.write(f"{root}/m/config.pbtxt", 'name: "m"\nmax_batch_sise: 4\n')
        row = wait_for(lambda: "latest load failed" in index(c)[("m", "2")]["reason"] and index(c)[("m", "2")], "failure reason")
        assert row["state"] == "READY" and "max_batch_sise" in row["reason"], row
        served = traffic.ok
        wait_for(lambda: traffic.ok > served + 20, "traffic still served while the new config is broken")
        assert "failed to load" in t.log() or "reload failed" in t.log()
        # The fix is picked up (Triton keeps the failure until restarted).
        gen_models.write(f"{root}/m/config.pbtxt", gen_models.io_config("m", "TYPE_FP32", [-1], 4, "identity"))
        wait_for(lambda: c.get_model_config("m")["max_batch_size"] == 4, "fixed config served")
        assert index(c)[("m", "2")]["reason"] == ""
        # A deleted model is unloaded; the others keep serving.
        assert c.is_model_ready("doomed")
        shutil.rmtree(f"{root}/doomed")
        wait_for(lambda: index(c).get(("doomed", "1"), {}).get("state") == "UNAVAILABLE", "doomed unloaded")
        assert not c.is_model_ready("doomed")
        with pytest.raises(InferenceServerException):
            c.infer("doomed", [identity_inputs([1.0])[0]])
        # A brand-new model appears.
        gen_models.write(f"{root}/fresh/config.pbtxt", gen_models.io_config("fresh", "TYPE_FP32", [-1], 8, "identity"))
        os.makedirs(f"{root}/fresh/1")
        wait_for(lambda: c.is_model_ready("fresh"), "fresh model loaded")
    finally:
        traffic.finish()
        t.stop()
    assert traffic.failures == [], traffic.failures[:5]
    assert traffic.ok > 100 and {"1", "2"} <= traffic.versions


@pytest.fixture(scope="module")
def explicit_repo(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("explicit") / "models")
    gen_models.test(root)
    gen_models.ensemble(
        root,
        "ens",
        [gen_models.tensor("IN", "TYPE_FP32", "-1")],
        [gen_models.tensor("OUT", "TYPE_FP32", "-1")],
        [gen_models.step("identity_fp32", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})],
    )
    return root


@pytest.fixture(scope="module")
def xsrv(explicit_repo):
    t = Tern([f"--model-repository={explicit_repo}", "--model-control-mode=explicit", "--load-model=simple"])
    yield t
    t.stop()


def test_explicit_load_unload_http(xsrv, explicit_repo):
    c = httpclient.InferenceServerClient(xsrv.url)
    assert c.is_model_ready("simple")
    assert not c.is_model_ready("identity_fp32"), "only --load-model models load at startup"
    # The index lists what could be loaded, as Triton's does.
    row = index(c)[("identity_fp32", "")]
    assert (row["state"], row["reason"]) == ("UNAVAILABLE", "not loaded")
    assert c.is_server_ready(), "models that are not loaded do not make the server unready"
    c.load_model("identity_fp32")
    assert c.is_model_ready("identity_fp32")
    inp, a = identity_inputs([1.5, 2.5])
    np.testing.assert_array_equal(c.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), a)
    assert index(c)[("identity_fp32", "1")]["state"] == "READY"
    # A config override (JSON) replaces the file's config.
    cfg = c.get_model_config("identity_fp32")
    cfg["max_batch_size"] = 2
    c.load_model("identity_fp32", config=json.dumps(cfg))
    assert c.get_model_config("identity_fp32")["max_batch_size"] == 2
    # A bad override fails and changes nothing.
    with pytest.raises(InferenceServerException, match="load failed for model 'identity_fp32'"):
        c.load_model("identity_fp32", config='{"max_batch_size": "many"}')
    assert c.get_model_config("identity_fp32")["max_batch_size"] == 2
    np.testing.assert_array_equal(c.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), a)
    # A placement this machine cannot serve is a bad argument too (as in Triton), not a 500.
    gpu = dict(cfg, instance_group=[{"kind": "KIND_GPU", "count": 1}])
    with pytest.raises(InferenceServerException, match="KIND_GPU but no GPU") as e:
        c.load_model("identity_fp32", config=json.dumps(gpu))
    assert e.value.status() == "400"
    # A config from a client cannot make the server read its other files (labels are
    # returned to clients by classification).
    leak = json.loads(json.dumps(cfg))
    leak["output"][0]["label_filename"] = "/etc/passwd"
    with pytest.raises(InferenceServerException, match="label_filename '/etc/passwd' must be a relative path inside the model's folder") as e:
        c.load_model("identity_fp32", config=json.dumps(leak))
    assert e.value.status() == "400"
    assert c.get_model_config("identity_fp32")["max_batch_size"] == 2
    with pytest.raises(InferenceServerException, match="failed to load .no_such_model., failed to poll from model repository"):
        c.load_model("no_such_model")
    c.unload_model("identity_fp32")
    assert not c.is_model_ready("identity_fp32")
    row = index(c)[("identity_fp32", "1")]
    assert (row["state"], row["reason"]) == ("UNAVAILABLE", "unloaded")
    assert c.is_server_ready(), "an unloaded model does not make the server unready"
    with pytest.raises(InferenceServerException):
        c.infer("identity_fp32", [inp])


@pytest.mark.parametrize("name", ["..%2F..%2F..%2Ftmp%2Ftern_escape_probe", "%2Ftmp%2Ftern_escape_probe", ".."])
def test_load_refuses_names_that_leave_the_folder(xsrv, name):
    """Files given with a load are written under <tmp>/<model name>/: the name must not escape it."""
    import base64
    import urllib.parse

    from test_http import raw

    probe = "/tmp/tern_escape_probe"
    shutil.rmtree(probe, ignore_errors=True)
    cfg = {"backend": "identity", "max_batch_size": 0, "input": [{"name": "I", "data_type": "TYPE_FP32", "dims": [1]}], "output": [{"name": "O", "data_type": "TYPE_FP32", "dims": [1]}]}
    body = {"parameters": {"config": json.dumps(cfg), "file:1/hello.txt": base64.b64encode(b"escaped").decode()}}
    status, _, data = raw(xsrv, "POST", f"/v2/repository/models/{name}/load", json.dumps(body).encode())
    if name != "..":  # ".." is resolved by the URL router before it reaches the handler
        assert status == 400, data
        assert "must be a single folder name" in json.loads(data)["error"]
        assert urllib.parse.unquote(name) in json.loads(data)["error"]
    assert status in (400, 404, 405), data
    assert not os.path.exists(probe), "a file was written outside the server's private folder"
    # The same through gRPC.
    with pytest.raises(InferenceServerException, match="must be a single folder name"):
        grpcclient.InferenceServerClient(xsrv.grpc_url).load_model("../../../tmp/tern_escape_probe", config=json.dumps(cfg), files={"file:1/hello.txt": b"escaped"})
    assert not os.path.exists(probe)


def test_explicit_load_with_files_grpc(xsrv, explicit_repo):
    c = grpcclient.InferenceServerClient(xsrv.grpc_url)
    with open(f"{explicit_repo}/onnx_identity_fp32/1/model.onnx", "rb") as f:
        onnx_bytes = f.read()
    cfg = {
        "name": "uploaded",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    c.load_model("uploaded", config=json.dumps(cfg), files={"file:1/model.onnx": onnx_bytes})
    assert c.is_model_ready("uploaded")
    inp, a = identity_inputs([3.0, 4.0, 5.0], grpcclient)
    np.testing.assert_array_equal(c.infer("uploaded", [inp]).as_numpy("OUTPUT0"), a)
    with pytest.raises(InferenceServerException, match="relative path"):
        c.load_model("evil", config=json.dumps(cfg), files={"file:../evil/1/model.onnx": onnx_bytes})
    rows = {(m.name, m.version): m for m in c.get_model_repository_index().models}
    assert rows[("uploaded", "1")].state == "READY"
    c.unload_model("uploaded")
    assert not c.is_model_ready("uploaded")


def test_ensembles_load_their_models_and_unload_dependents(xsrv):
    """Triton's unload semantics: an ensemble's composing models load with it;
    unloading the ensemble with unload_dependents also unloads the composing
    models that were loaded only for it; unloading a composing model unloads
    the ensembles that call it, which load again by themselves once it is
    back; a model loaded by name stays."""
    c = httpclient.InferenceServerClient(xsrv.url)
    c.load_model("ens")
    assert c.is_model_ready("ens") and c.is_model_ready("identity_fp32"), "composing models load with the ensemble"
    a = np.array([[7.0, 8.0]], dtype=np.float32)
    inp = httpclient.InferInput("IN", [1, 2], "FP32")
    inp.set_data_from_numpy(a)
    np.testing.assert_array_equal(c.infer("ens", [inp]).as_numpy("OUT"), a)
    c.unload_model("ens", unload_dependents=True)
    assert not c.is_model_ready("ens") and not c.is_model_ready("identity_fp32"), "loaded only for the ensemble"
    # Without unload_dependents the composing model stays.
    c.load_model("ens")
    c.unload_model("ens")
    assert not c.is_model_ready("ens") and c.is_model_ready("identity_fp32")
    # A composing model unloaded: the ensemble goes too, and comes back with it.
    c.load_model("ens")
    c.unload_model("identity_fp32")
    assert not c.is_model_ready("identity_fp32") and not c.is_model_ready("ens")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'ens'"):
        c.infer("ens", [inp])
    c.load_model("identity_fp32")
    assert c.is_model_ready("ens"), "the ensemble loads again once its model serves"
    np.testing.assert_array_equal(c.infer("ens", [inp]).as_numpy("OUT"), a)
    # identity_fp32 is now loaded by name: unload_dependents of the ensemble keeps it.
    c.unload_model("ens", unload_dependents=True)
    assert not c.is_model_ready("ens") and c.is_model_ready("identity_fp32")
    with pytest.raises(InferenceServerException, match="failed to load 'nosuch', failed to poll from model repository"):
        c.load_model("nosuch")
    c.unload_model("identity_fp32")


def test_none_mode_refuses_load_and_unload(server):
    c = httpclient.InferenceServerClient(server.url)
    for call in (lambda: c.load_model("simple"), lambda: c.unload_model("simple")):
        with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed"):
            call()
    g = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed"):
        g.unload_model("simple")
    assert c.is_model_ready("simple")


def test_reload_under_heavy_traffic(xsrv):
    """64 requests in flight at all times while the model is reloaded again and again."""
    c = httpclient.InferenceServerClient(xsrv.url, concurrency=64)
    c.load_model("identity_fp32")
    cfg = c.get_model_config("identity_fp32")
    failures, answered, reloads = [], 0, 0
    traffic_done = threading.Event()

    def reloader():
        nonlocal reloads
        rc = httpclient.InferenceServerClient(xsrv.url)
        while not traffic_done.is_set():
            # Every other reload changes only the instance count (adjusted in place), the rest reload fully.
            cfg["instance_group"] = [{"kind": "KIND_CPU", "count": 1 + reloads % 3}]
            cfg["max_batch_size"] = 4 if (reloads // 2) % 2 else 8
            rc.load_model("identity_fp32", config=json.dumps(cfg))
            reloads += 1
            time.sleep(0.05)

    th = threading.Thread(target=reloader)
    th.start()
    deadline = time.time() + 4
    while time.time() < deadline:
        batch = []
        for i in range(64):
            inp, a = identity_inputs([float(i)])
            batch.append((c.async_infer("identity_fp32", [inp]), a))
        for req, a in batch:
            try:
                out = req.get_result().as_numpy("OUTPUT0")
                if not np.array_equal(out, a):
                    failures.append(f"wrong answer {out}")
                answered += 1
            except InferenceServerException as e:
                failures.append(str(e))
    traffic_done.set()
    th.join(60)
    assert failures == [], failures[:5]
    assert reloads >= 5 and answered >= 256, (reloads, answered)


def test_instance_only_change_adjusts_in_place(xsrv):
    c = httpclient.InferenceServerClient(xsrv.url)
    c.load_model("identity_int32")
    inp = httpclient.InferInput("INPUT0", [1, 3], "INT32")
    inp.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.int32))
    c.infer("identity_int32", [inp])
    cfg = c.get_model_config("identity_int32")
    cfg["instance_group"][0]["count"] = 3
    before = xsrv.log().count("instances adjusted in place")
    c.load_model("identity_int32", config=json.dumps(cfg))
    assert c.get_model_config("identity_int32")["instance_group"][0]["count"] == 3
    wait_for(lambda: xsrv.log().count("instances adjusted in place") == before + 1, "in-place log line")
    # Same model object: its statistics carry on (a reload would start them from zero).
    c.infer("identity_int32", [inp])
    stats = c.get_inference_statistics("identity_int32")["model_stats"][0]
    assert stats["inference_count"] == 2, stats
    # Anything else changed means a full reload: statistics start again.
    cfg["max_batch_size"] = 4
    c.load_model("identity_int32", config=json.dumps(cfg))
    assert c.get_inference_statistics("identity_int32")["model_stats"][0]["inference_count"] == 0
    assert xsrv.log().count("instances adjusted in place") == before + 1
    c.unload_model("identity_int32")


def test_unload_returns_memory(xsrv):
    """100 load/unload cycles of an ONNX model: RSS ends near where it started."""
    c = httpclient.InferenceServerClient(xsrv.url)
    pid = xsrv.proc.pid
    inp, _ = identity_inputs([1.0])
    for _ in range(3):  # warm up allocator pools and ORT's global state
        c.load_model("onnx_identity_fp32")
        c.infer("onnx_identity_fp32", [inp])
        c.unload_model("onnx_identity_fp32")
    before = rss_kib(pid)
    for _ in range(100):
        c.load_model("onnx_identity_fp32")
        c.infer("onnx_identity_fp32", [inp])
        c.unload_model("onnx_identity_fp32")
    after = rss_kib(pid)
    print(f"RSS before {before} KiB, after 100 load/unload cycles {after} KiB")
    assert after - before < 20 * 1024, f"RSS grew from {before} to {after} KiB"


def test_model_config_name(tmp_path):
    root = str(tmp_path / "models")
    poll_repo(root)
    small = gen_models.io_config("m", "TYPE_FP32", [-1], 2, "identity")
    gen_models.write(f"{root}/m/configs/small.pbtxt", small)
    t = Tern([f"--model-repository={root}", "--model-config-name=small"])
    try:
        c = httpclient.InferenceServerClient(t.url)
        assert c.get_model_config("m")["max_batch_size"] == 2, "configs/small.pbtxt is used"
        assert c.get_model_config("doomed")["max_batch_size"] == 8, "no configs/small.pbtxt: config.pbtxt"
    finally:
        t.stop()


def test_poll_mode_ignores_plugin_sources(tmp_path):
    """Saving a plugin's sources in its model folder (and the editor's swap
    files) is not a new model; rebuilding its component is."""
    root = tmp_path / "models"
    shutil.copytree(os.path.join(ROOT, "model_repository", "add_sub"), root / "add_sub")
    plugin = root / "add_sub"
    (plugin / "Cargo.toml").write_text('[package]\nname = "add_sub"\n')
    (plugin / "src").mkdir()
    (plugin / "src" / "lib.rs").write_text("// v1\n")
    t = Tern([f"--model-repository={root}", "--model-control-mode=poll", "--repository-poll-secs=1"])
    try:
        time.sleep(1.5)
        (plugin / "src" / "lib.rs").write_text("// v2, edited\n")
        (plugin / ".lib.rs.swp").write_text("swap")
        (plugin / "Cargo.toml").write_text('[package]\nname = "add_sub"\nversion = "0.2.0"\n')
        time.sleep(3)
        assert "model folder changed" not in t.log(), t.log()
        wasm = plugin / "1" / "model.wasm"
        wasm.write_bytes(wasm.read_bytes())
        assert t.wait_log("model folder changed: loading"), t.log()
    finally:
        t.stop()


def test_named_repository_routes_answer_as_tritonserver(tmp_path):
    """Triton's named-repository forms: the HTTP index ignores the name; a load
    or unload naming a repository (HTTP route, gRPC repository_name) is
    refused with 501 / UNIMPLEMENTED "'repository_name' specification is not supported"."""
    import urllib.error
    import urllib.request

    root = str(tmp_path / "models")
    poll_repo(root)
    t = Tern([f"--model-repository={root}", "--model-control-mode=explicit", "--load-model=m"])
    try:
        def post(path):
            req = urllib.request.Request(f"http://{t.url}{path}", data=b"{}", method="POST")
            try:
                with urllib.request.urlopen(req) as r:
                    return r.status, json.loads(r.read() or b"null")
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, rows = post("/v2/repository/anything/index")
        assert status == 200 and {r["name"] for r in rows} == {"m", "doomed"}
        text = "'repository_name' specification is not supported"
        assert post("/v2/repository/anything/models/m/unload") == (501, {"error": text})
        assert post("/v2/repository/anything/models/m/load") == (501, {"error": text})
        from tritonclient.grpc import service_pb2
        g = grpcclient.InferenceServerClient(t.grpc_url)
        for call, request in (
            (g._client_stub.RepositoryIndex, service_pb2.RepositoryIndexRequest(repository_name="r")),
            (g._client_stub.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(repository_name="r", model_name="m")),
            (g._client_stub.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(repository_name="r", model_name="m")),
        ):
            with pytest.raises(Exception) as e:
                call(request)
            assert e.value.code().name == "UNIMPLEMENTED" and e.value.details() == text
        assert httpclient.InferenceServerClient(t.url).is_model_ready("m"), "nothing was unloaded"
    finally:
        t.stop()
