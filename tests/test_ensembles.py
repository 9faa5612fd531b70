"""Ensembles end to end through tritonclient (HTTP and gRPC): a DAG over a
WASM plugin and the identity backend with a parallel branch, an ensemble of
an ensemble, step errors prefixed as Triton's (`in ensemble 'E', ...`), broken DAGs reported at load while
everything else serves, statistics, and dynamic batching of step requests."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import Tern

import gen_models
from test_plugins import plugins_dir


@pytest.fixture(scope="module")
def esrv(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ensembles") / "models")
    gen_models.ensemble_repo(root, plugins_dir())
    t = Tern([f"--model-repository={root}", "--exit-on-error=false"])
    yield t
    t.stop()


def inputs(client, names, arrays):
    out = []
    for name, a in zip(names, arrays):
        i = client.InferInput(name, list(a.shape), "FP32")
        i.set_data_from_numpy(a)
        out.append(i)
    return out


def ab(batch=1):
    a = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
    b = np.full((batch, 4), 0.5, dtype=np.float32)
    return a, b


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_chain_with_parallel_branch(esrv, proto):
    client = httpclient if proto == "http" else grpcclient
    c = client.InferenceServerClient(esrv.url if proto == "http" else esrv.grpc_url)
    a, b = ab(3)
    r = c.infer("ens_chain", inputs(client, ["A", "B"], [a, b]), request_id="req-7")
    np.testing.assert_allclose(r.as_numpy("TWICE_A"), 2 * a)
    np.testing.assert_allclose(r.as_numpy("TWICE_B"), 2 * b)
    np.testing.assert_allclose(r.as_numpy("SUM"), a + b)
    resp = r.get_response()
    assert (resp["id"] if proto == "http" else resp.id) == "req-7"
    # Only the requested output comes back.
    r = c.infer("ens_chain", inputs(client, ["A", "B"], [a, b]), outputs=[client.InferRequestedOutput("SUM")])
    assert r.as_numpy("TWICE_A") is None
    np.testing.assert_allclose(r.as_numpy("SUM"), a + b)


def test_ensemble_of_an_ensemble(esrv):
    c = grpcclient.InferenceServerClient(esrv.grpc_url)
    a, b = ab(2)
    r = c.infer("ens_nested", inputs(grpcclient, ["X", "Y"], [a, b]))
    np.testing.assert_allclose(r.as_numpy("OUT"), 2 * a)


def test_metadata_and_config(esrv):
    c = httpclient.InferenceServerClient(esrv.url)
    md = c.get_model_metadata("ens_chain")
    assert md["platform"] == "ensemble"
    assert [i["name"] for i in md["inputs"]] == ["A", "B"]
    cfg = c.get_model_config("ens_chain")
    steps = cfg["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["add_sub", "identity_fp32", "add_sub"]
    assert not cfg.get("instance_group")


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_step_failure_names_the_ensemble_and_server_keeps_serving(esrv, proto):
    client = httpclient if proto == "http" else grpcclient
    c = client.InferenceServerClient(esrv.url if proto == "http" else esrv.grpc_url)
    for mode, text in (("error", "misbehave: asked for an error"), ("panic", "trapped")):
        m = client.InferInput("MODE", [1], "BYTES")
        m.set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
        with pytest.raises(InferenceServerException) as e:
            c.infer("ens_fail", [m])
        assert "in ensemble 'ens_fail', " in str(e.value)
        assert text in str(e.value)
    m = client.InferInput("MODE", [1], "BYTES")
    m.set_data_from_numpy(np.array([b"ok"], dtype=np.object_))
    assert c.infer("ens_fail", [m]).as_numpy("OUT")[0] == b"ok"
    a, b = ab()
    np.testing.assert_allclose(c.infer("ens_chain", inputs(client, ["A", "B"], [a, b])).as_numpy("SUM"), a + b)


def test_bad_request_is_refused_before_any_step(esrv):
    c = httpclient.InferenceServerClient(esrv.url)
    before = c.get_inference_statistics("add_sub")["model_stats"][0]["inference_stats"]["success"]["count"]
    bad = np.zeros((1, 5), dtype=np.float32)
    with pytest.raises(InferenceServerException) as e:
        c.infer("ens_chain", inputs(httpclient, ["A", "B"], [bad, bad]))
    assert "ens_chain" in str(e.value) and "[1,5]" in str(e.value).replace(" ", "")
    after = c.get_inference_statistics("add_sub")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after == before


def test_broken_ensembles_are_reported_with_reasons(esrv):
    c = httpclient.InferenceServerClient(esrv.url)
    index = {m["name"]: m for m in c.get_model_repository_index()}
    expect = {
        "ens_bad_dtype": "input 'MODE' expects TYPE_STRING, but tensor 'A' from ensemble input 'A' is TYPE_FP32",
        "ens_missing_model": "composing model 'no_such_model' is not available",
        "ens_cycle_a": "cycle of ensembles",
        "ens_cycle_b": "cycle of ensembles",
        "ens_with_instances": "instance_group does not apply to ensembles",
    }
    for name, reason in expect.items():
        assert index[name]["state"] == "UNAVAILABLE", index[name]
        assert reason in index[name]["reason"], index[name]
        assert not c.is_model_ready(name)
    for name in ("ens_chain", "ens_nested", "ens_fail", "add_sub"):
        assert index[name]["state"] == "READY"


def test_statistics_and_batching_of_step_requests(esrv):
    c = httpclient.InferenceServerClient(esrv.url, concurrency=8)

    def stats(model):
        s = c.get_inference_statistics(model)["model_stats"][0]
        return s["inference_stats"]["success"]["count"], s["execution_count"], s["inference_count"]

    e0, s0 = stats("ens_chain"), stats("add_sub")
    a, b = ab()
    n = 8
    pending = [c.async_infer("ens_chain", inputs(httpclient, ["A", "B"], [a, b])) for _ in range(n)]
    for p in pending:
        np.testing.assert_allclose(p.get_result().as_numpy("TWICE_A"), 2 * a)
    e1, s1 = stats("ens_chain"), stats("add_sub")
    assert e1[0] - e0[0] == n  # ensemble successes
    assert e1[2] - e0[2] == n  # ensemble inference_count
    assert s1[0] - s0[0] == 2 * n  # two add_sub steps per request
    # The step requests of concurrent ensemble requests were batched together.
    assert s1[1] - s0[1] < 2 * n, (s0, s1)


PRUNE_STEP = '''name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
'''

PRUNE_ENSEMBLE = '''name: "pruned"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "A" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "first" model_version: -1 input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "T" } },
  { model_name: "for_a" model_version: -1 input_map { key: "INPUT0" value: "T" } output_map { key: "OUTPUT0" value: "A" } },
  { model_name: "for_b" model_version: -1 input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "B" } }
] }
'''

DANGLING_ENSEMBLE = PRUNE_ENSEMBLE.replace('name: "pruned"', 'name: "dangling_ens"').replace(
    'value: "B" } }\n', 'value: "B" } },\n  { model_name: "dangling" model_version: -1 input_map { key: "INPUT0" value: "X" } '
    'output_map { key: "OUTPUT0" value: "UNUSED" } }\n')


def test_steps_whose_outputs_are_not_needed_do_not_run(tmp_path, start_tern):
    """As Triton prunes an ensemble request: only the steps a requested output
    depends on run. A step whose output nothing reads fails the ensemble's
    load with Triton's text."""
    root = tmp_path / "models"
    for name, cfg in [*((n, PRUNE_STEP.format(name=n)) for n in ("first", "for_a", "for_b", "dangling")),
                      ("pruned", PRUNE_ENSEMBLE), ("dangling_ens", DANGLING_ENSEMBLE)]:
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(cfg)
    t = start_tern([f"--model-repository={root}", "--exit-on-error=false"])
    index = {m["name"]: m for m in httpclient.InferenceServerClient(t.url).get_model_repository_index()}
    assert "ensemble tensor 'UNUSED' is unused in ensemble 'dangling_ens'" in index["dangling_ens"]["reason"]
    for proto, client, url in (("http", httpclient, t.url), ("grpc", grpcclient, t.grpc_url)):
        c = client.InferenceServerClient(url)
        x = np.arange(4, dtype=np.int32)
        i = client.InferInput("X", [4], "INT32")
        i.set_data_from_numpy(x)
        r = c.infer("pruned", [i], outputs=[client.InferRequestedOutput("A")])
        np.testing.assert_array_equal(r.as_numpy("A"), x)
        assert r.as_numpy("B") is None
        r = c.infer("pruned", [i])
        np.testing.assert_array_equal(r.as_numpy("B"), x)
        # Every ensemble response carries the sequence parameters, as Triton's.
        if proto == "http":
            assert r.get_response()["parameters"] == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
        else:
            p = r.get_response().parameters
            assert (p["sequence_id"].int64_param, p["sequence_start"].bool_param, p["sequence_end"].bool_param) == (0, False, False)
    c = httpclient.InferenceServerClient(t.url)
    runs = {m: int(c.get_inference_statistics(m)["model_stats"][0]["execution_count"])
            for m in ("first", "for_a", "for_b", "dangling")}
    assert runs == {"first": 4, "for_a": 4, "for_b": 2, "dangling": 0}, runs
