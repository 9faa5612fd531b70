"""The deployment manifests under deploy/: the Kubernetes ones validate against
Kubernetes' schemas and the KServe ones against KServe's CRDs (unknown fields
rejected, as `kubectl apply --validate=strict` does); the container args start
the real binary and the probe paths answer on the probed port; every metric
the Grafana dashboard and the Prometheus adapter rules read is one Tern
exports. No cluster is involved."""

import glob
import gzip
import json
import os
import re
import shutil
import socket

import jsonschema
import kubernetes_validate
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern, gen_models
from dashboard_plot import dashboard, panels
from test_grpc import simple_inputs
from test_metrics import scrape, value
from test_plugins import add_sub_inputs, mode, plugins_dir
from test_triton_dropin import get

DEPLOY = os.path.join(ROOT, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
KSERVE = os.path.join(DEPLOY, "kserve")

# The oldest Kubernetes the manifests claim (the preStop `sleep` action is
# on by default from 1.30) and the newest kubernetes-validate knows.
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]

# Dashboard families a CPU-only machine does not export, each checked against
# the Rust source instead of a scrape.
NOT_ON_THIS_MACHINE = {
    # NVML readings (host/src/metrics/gpu.rs): only where libnvidia-ml and a GPU exist.
    "nv_gpu_utilization": "no GPU",
    "nv_gpu_memory_total_bytes": "no GPU",
    "nv_gpu_memory_used_bytes": "no GPU",
    "nv_gpu_power_usage": "no GPU",
    "nv_gpu_power_limit": "no GPU",
    # Device memory pools (host/src/metrics/mod.rs): rendered only when CUDA found a GPU.
    "tern_cuda_memory_pool_total_bytes": "no GPU",
    "tern_cuda_memory_pool_used_bytes": "no GPU",
    "tern_cuda_memory_pool_reserved_bytes": "no GPU",
    # Jetson gauges (host/src/metrics/jetson.rs): only where a Jetson sysfs layout exists.
    "tern_jetson_power_rail_watts": "not a Jetson",
    "tern_jetson_temperature_celsius": "not a Jetson",
    "tern_jetson_gpu_frequency_hz": "not a Jetson",
    "tern_jetson_gpu_max_frequency_hz": "not a Jetson",
    "tern_jetson_emc_frequency_hz": "not a Jetson",
}

METRIC_NAME = re.compile(r"\b(?:nv|tern)_[A-Za-z0-9_]*[A-Za-z0-9]")


def load_docs(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def k8s_docs():
    """(file name, document) for every Kubernetes-kind manifest under deploy/k8s."""
    out = []
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        for doc in load_docs(path):
            if not doc["apiVersion"].startswith("kustomize.config.k8s.io/"):
                out.append((os.path.basename(path), doc))
    return out


def one(kind, path):
    docs = [d for d in load_docs(path) if d["kind"] == kind]
    assert len(docs) == 1, f"{path}: expected one {kind}"
    return docs[0]


def deployment():
    return one("Deployment", os.path.join(K8S, "deployment.yaml"))


def serving_runtime():
    return one("ServingRuntime", os.path.join(KSERVE, "servingruntime.yaml"))


def crd_dir():
    """KServe's CRDs: the gzipped copy in deploy/kserve/crds, else shared/ beside the checkout."""
    for d in (os.path.join(KSERVE, "crds"), os.path.join(ROOT, "..", "shared", "kserve-crds")):
        if glob.glob(os.path.join(d, "serving.kserve.io_*.yaml*")):
            return d
    pytest.fail("KServe CRDs not found in deploy/kserve/crds or ../shared/kserve-crds")


def strict(schema):
    """An OpenAPI v3 CRD schema that, like the API server's strict field
    validation, rejects fields it does not declare."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_validator(kind, api_version):
    group, version = api_version.split("/")
    for path in glob.glob(os.path.join(crd_dir(), "*.yaml*")):
        crd = load_docs(path)[0]
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
            for v in crd["spec"]["versions"]:
                if v["name"] == version:
                    assert v["served"], f"{kind} {api_version} is not served"
                    return jsonschema.Draft7Validator(strict(v["schema"]["openAPIV3Schema"]))
    pytest.fail(f"no CRD for {kind} {api_version} in {crd_dir()}")


def crd_errors(doc, kind=None):
    v = crd_validator(kind or doc["kind"], doc["apiVersion"])
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]


# --- schemas -------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_validate(version):
    docs = k8s_docs()
    assert {d["kind"] for _, d in docs} >= {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "ConfigMap",
    }
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{name} ({doc['kind']}) against Kubernetes {version}: {'.'.join(map(str, e.path))}: {e.message}")


def test_kustomization_lists_the_server_manifests():
    k = load_docs(os.path.join(K8S, "kustomization.yaml"))[0]
    assert k["kind"] == "Kustomization"
    files = {os.path.basename(p) for p in glob.glob(os.path.join(K8S, "*.yaml"))}
    # The adapter rules belong to the Prometheus adapter's configuration.
    assert set(k["resources"]) == files - {"kustomization.yaml", "prometheus-adapter-rules.yaml"}


def test_kserve_manifests_validate():
    docs = {os.path.basename(p): load_docs(p) for p in glob.glob(os.path.join(KSERVE, "*.yaml"))}
    kinds = {d["kind"] for ds in docs.values() for d in ds}
    assert kinds == {"ServingRuntime", "InferenceService"}
    for name, ds in docs.items():
        for doc in ds:
            assert crd_errors(doc) == [], name
    # The same spec serves as a ClusterServingRuntime.
    assert crd_errors(serving_runtime(), kind="ClusterServingRuntime") == []


def test_validation_rejects_unknown_fields():
    """The checks above would catch a misspelt field."""
    dep = deployment()
    dep["spec"]["template"]["spec"]["containers"][0]["readinessProb"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSIONS[-1], strict=True)
    sr = serving_runtime()
    sr["spec"]["containers"][0]["readinessProb"] = {}
    sr["spec"]["supportedModelFormat"] = []
    assert len(crd_errors(sr)) == 2


def test_inference_service_uses_the_runtime():
    isvc = one("InferenceService", os.path.join(KSERVE, "inferenceservice.yaml"))
    sr = serving_runtime()
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == sr["metadata"]["name"] == "tern"
    fmt = model["modelFormat"]
    assert {"name": fmt["name"], "version": fmt["version"]} in [
        {"name": f["name"], "version": f["version"]} for f in sr["spec"]["supportedModelFormats"]
    ]
    assert model["protocolVersion"] in sr["spec"]["protocolVersions"]
    assert model["storageUri"].startswith("pvc://")


# --- the args start the binary --------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def localize(args, model_repository, scratch):
    """A container's args for this machine: the model repository path becomes
    `model_repository`, any other absolute path a folder under `scratch`, and
    each fixed port a free one. Returns the args and {flag: (container port,
    local port)}."""
    out, ports = [], {}
    for arg in args:
        flag, eq, value = arg.partition("=")
        m = re.fullmatch(r"--(http|grpc|metrics)-port", flag)
        if eq and m:
            port = free_port()
            ports[m.group(1)] = (int(value), port)
            arg = f"{flag}={port}"
        elif eq and flag == "--model-repository":
            arg = f"{flag}={model_repository}"
        elif eq and value.startswith("/"):
            arg = f"{flag}={os.path.join(scratch, value.strip('/').replace('/', '_'))}"
        out.append(arg)
    return out, ports


def probe_port(container, probe):
    """The container port number a probe targets (by number or by name)."""
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert port in named, f"probe port {port!r} is not a container port"
    return named[port]


@pytest.fixture(scope="module")
def simple_repo(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("deploy-repo") / "models")
    shutil.copytree(os.path.join(ROOT, "model_repository", "simple"), os.path.join(root, "simple"))
    return root


def containers():
    dep = deployment()
    sr = serving_runtime()
    pod = dep["spec"]["template"]
    # (container, pod annotations, scrape annotation prefix, pod securityContext)
    return {
        "deployment": (pod["spec"]["containers"][0], pod["metadata"]["annotations"], "prometheus.io", pod["spec"]["securityContext"]),
        "servingruntime": (sr["spec"]["containers"][0], sr["spec"]["annotations"], "prometheus.kserve.io", {}),
    }


@pytest.mark.parametrize("which", ["deployment", "servingruntime"])
def test_container_args_start_tern(which, simple_repo, tmp_path, start_tern):
    container, annotations, prefix, pod_security = containers()[which]
    assert "command" not in container, "the image's entrypoint (/usr/bin/tern) runs"
    args, ports = localize(container["args"], simple_repo, str(tmp_path))
    assert set(ports) == {"http", "grpc", "metrics"}
    t = start_tern(args)
    # The fixed ports were the ones bound (the fixture's own port flags come first).
    assert t.url.endswith(f":{ports['http'][1]}")
    assert t.grpc_url.endswith(f":{ports['grpc'][1]}")
    assert t.metrics_url.endswith(f":{ports['metrics'][1]}")
    container_to_local = {c: l for c, l in ports.values()}

    probes = [k for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in container]
    assert {"livenessProbe", "readinessProbe"} <= set(probes)
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    for k in probes:
        port = probe_port(container, container[k])
        assert port == ports["http"][0], f"{k} must probe the HTTP port"
        status, _ = get(f"127.0.0.1:{container_to_local[port]}", container[k]["httpGet"]["path"])
        assert status == 200, k

    # Every declared container port is one Tern listens on.
    for p in container.get("ports", []):
        assert p["containerPort"] in container_to_local, p
    # Prometheus scrapes the metrics port.
    assert int(annotations[f"{prefix}/port"]) == ports["metrics"][0]
    status, body = get(t.metrics_url, annotations[f"{prefix}/path"])
    assert status == 200 and b"nv_inference_request_success" in body

    # Read-only root filesystem: every path Tern may write is a mounted volume.
    sc = {**pod_security, **container["securityContext"]}
    assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"]
    assert sc["runAsUser"] == 65532, "the image's non-root user"
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
    for arg in container["args"]:
        flag, _, value = arg.partition("=")
        if value.startswith("/"):
            mount = next((m for p, m in mounts.items() if value == p or value.startswith(p + "/")), None)
            if flag == "--model-repository" and which == "servingruntime":
                assert value == "/mnt/models", "KServe mounts the model at /mnt/models"
            else:
                assert mount is not None, f"{arg}: not on a volume"
                assert mount.get("readOnly", False) == (flag == "--model-repository"), arg
    assert t.stop() == 0


def test_deployment_wiring():
    """Selectors, ports and the shutdown budget agree across the plain manifests."""
    dep = deployment()
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = pod["spec"]["containers"][0]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}

    svc = one("Service", os.path.join(K8S, "service.yaml"))
    assert svc["spec"]["selector"].items() <= labels.items()
    assert {p["name"]: (p["port"], named[p["targetPort"]]) for p in svc["spec"]["ports"]} == {
        "http": (8000, 8000),
        "grpc": (8001, 8001),
        "metrics": (8002, 8002),
    }
    pdb = one("PodDisruptionBudget", os.path.join(K8S, "pdb.yaml"))
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = one("HorizontalPodAutoscaler", os.path.join(K8S, "hpa.yaml"))
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", dep["metadata"]["name"])
    # The PDB leaves a replica serving at the HPA's floor.
    assert hpa["spec"]["minReplicas"] - pdb["spec"]["maxUnavailable"] >= 1

    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    assert {m["name"] for m in container["volumeMounts"]} == volumes
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {one("PersistentVolumeClaim", os.path.join(K8S, "pvc.yaml"))["metadata"]["name"]}

    # Drain budget: preStop sleep + --exit-timeout-secs (Tern's default 30) within the grace period.
    exit_timeout = 30
    for arg in container["args"]:
        if arg.startswith("--exit-timeout-secs="):
            exit_timeout = int(arg.split("=", 1)[1])
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert pod["spec"]["terminationGracePeriodSeconds"] > pre_stop + exit_timeout


# --- metrics ------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{family: type} from the `# TYPE` lines of /metrics of a Tern serving the
    ONNX model `simple` and WebAssembly plugins, after successful and failed
    inferences (the exact names, which prometheus_client's parser would strip
    of `_total`)."""
    root = str(tmp_path_factory.mktemp("deploy-plugins") / "models")
    gen_models.plugin_repo(root, plugins_dir())
    cache = str(tmp_path_factory.mktemp("deploy-wasm-cache"))
    t = Tern([f"--model-repository={root}", f"--wasm-cache-dir={cache}"])
    try:
        hc = httpclient.InferenceServerClient(t.url)
        gc = grpcclient.InferenceServerClient(t.grpc_url)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for mod, c in ((httpclient, hc), (grpcclient, gc)):
            for _ in range(3):
                r = c.infer("simple", simple_inputs(a, a, mod))
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + a)
        x = np.ones((1, 4), dtype=np.float32)
        np.testing.assert_array_equal(hc.infer("add_sub", add_sub_inputs(x, x)).as_numpy("OUTPUT0"), x + x)
        # A trapping plugin: a BACKEND failure, a trap and a restart.
        with pytest.raises(InferenceServerException):
            mode(hc, "panic")
        fams = scrape(t)
        status, text = get(t.metrics_url, "/metrics")
        assert status == 200
    finally:
        t.stop()
    # Traffic reached the families the dashboard's main panels read.
    assert value(fams, "nv_inference_request_success", model="simple") == 6
    assert value(fams, "nv_inference_request_failure", model="misbehave", reason="BACKEND") == 1
    assert value(fams, "tern_plugin_traps_total", model="misbehave") == 1
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text.decode(), re.M))


def is_exported(name, families):
    if name in families:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and families.get(base) in ("histogram", "summary"):
            return True
    return False


def in_rust_source(name):
    # The server's families and those their owners render (pools, plugin telemetry).
    paths = glob.glob(os.path.join(ROOT, "host", "src", "**", "*.rs"), recursive=True)
    paths += glob.glob(os.path.join(ROOT, "crates", "*", "src", "**", "*.rs"), recursive=True)
    for path in paths:
        with open(path) as f:
            if f'"{name}"' in f.read():
                return True
    return False


def check_exported(names, families, where):
    missing = []
    for name in sorted(names):
        if is_exported(name, families):
            continue
        if name in NOT_ON_THIS_MACHINE:
            assert in_rust_source(name), f"{where}: {name} is not a metric Tern defines"
            continue
        missing.append(name)
    assert not missing, f"{where} reads metrics Tern does not export: {missing}"


def dashboard_exprs(d):
    exprs = [t["expr"] for p in panels(d) for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        q = v.get("query")
        if v["type"] == "query":
            exprs.append(q["query"] if isinstance(q, dict) else q)
    return exprs


def test_dashboard_shape():
    d = dashboard()
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert variables["model"]["query"]["query"] == "label_values(nv_inference_request_success, model)"
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    for p in panels(d):
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
            assert p["targets"], p["title"]


def test_dashboard_metrics_are_exported(exported):
    d = dashboard()
    names = {n for e in dashboard_exprs(d) for n in METRIC_NAME.findall(e)}
    # Every allow-listed family is one the dashboard reads (the list stays minimal).
    assert set(NOT_ON_THIS_MACHINE) <= names
    check_exported(names, exported, "deploy/grafana/tern.json")
    # The panels the issue asks for are there.
    for family in (
        "nv_inference_request_failure",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_exec_count",
        "nv_inference_count",
        "nv_inference_pending_request_count",
        "tern_plugin_traps_total",
        "tern_plugin_timeouts_total",
        "tern_plugin_memory_cap_hits_total",
        "tern_plugin_restarts_total",
        "tern_wasm_cache_hits_total",
        "tern_wasm_cache_misses_total",
        "tern_host_memory_pool_used_bytes",
        "nv_pinned_memory_pool_used_bytes",
        "tern_model_load_failures_total",
        "nv_model_load_duration_secs",
        "nv_cpu_utilization",
        "nv_cpu_memory_used_bytes",
        "nv_gpu_utilization",
    ):
        assert family in names, family


def adapter_rules():
    cm = one("ConfigMap", os.path.join(K8S, "prometheus-adapter-rules.yaml"))
    return yaml.safe_load(cm["data"]["config.yaml"])["rules"]


def rule_metric_name(rule):
    series = METRIC_NAME.match(rule["seriesQuery"].strip().strip("'\""))
    assert series, rule["seriesQuery"]
    name = rule.get("name", {})
    if "as" in name:
        return name["as"]
    return series.group(0)


def test_hpa_metric_has_an_adapter_rule(exported):
    hpa = one("HorizontalPodAutoscaler", os.path.join(K8S, "hpa.yaml"))
    wanted = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert wanted, "the HPA scales on a per-pod custom metric"
    rules = {rule_metric_name(r): r for r in adapter_rules()}
    for name in wanted:
        assert name in rules, f"HPA metric {name} has no rule in prometheus-adapter-rules.yaml"
    for name, rule in rules.items():
        series = METRIC_NAME.match(rule["seriesQuery"].strip()).group(0)
        assert re.fullmatch(rule["name"]["matches"], series), rule
        assert "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
        assert {"namespace", "pod"} <= set(rule["resources"]["overrides"])
        used = {series} | set(METRIC_NAME.findall(rule["metricsQuery"]))
        check_exported(used, exported, f"adapter rule {name}")
