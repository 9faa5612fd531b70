"""Remote model repositories through the built binary: s3:// against an S3
server (moto's server mode, from PyPI), as:// against Azurite (npm) and
gs:// against gcp-storage-emulator (PyPI; tests/gcs_emulator.py), each
started here on a free port with buckets and credentials made here.
Polling picks up new versions, explicit loads fetch on demand, a device
that starts without network serves its verified cache, a tampered or
unsigned update never replaces the version that serves, and `kill -9` at
any moment of an update leaves the last good version."""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern, infer_simple, tern_bin

CREDS = {"AWS_ACCESS_KEY_ID": "tern-test", "AWS_SECRET_ACCESS_KEY": "tern-test-secret", "AWS_DEFAULT_REGION": "us-east-1"}
ONNX = f"{ROOT}/model_repository/simple/1/model.onnx"


def simple_config(name):
    return open(f"{ROOT}/model_repository/simple/config.pbtxt").read().replace('name: "simple"', f'name: "{name}"')


class S3:
    """An S3 server of our own (moto) and a client filling its buckets."""

    def __init__(self):
        import boto3
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"{host}:{port}"
        self.client = boto3.client("s3", endpoint_url=f"http://{self.endpoint}", aws_access_key_id="tern-test",
                                   aws_secret_access_key="tern-test-secret", region_name="us-east-1")

    def put(self, bucket, key, data):
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def put_model(self, bucket, prefix, name, versions=(1,), extra=None):
        self.put(bucket, f"{prefix}/{name}/config.pbtxt", simple_config(name).encode())
        for v in versions:
            self.put(bucket, f"{prefix}/{name}/{v}/model.onnx", open(ONNX, "rb").read())
        for key, data in (extra or {}).items():
            self.put(bucket, f"{prefix}/{name}/{key}", data)

    def stop(self):
        self.server.stop()


@pytest.fixture
def s3():
    server = S3()
    yield server
    server.stop()


def index(t):
    return {(m["name"], m.get("version", "")): m for m in httpclient.InferenceServerClient(t.url).get_model_repository_index()}


def metric(t, name):
    text = urllib.request.urlopen(f"http://{t.metrics_url}/metrics").read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    return values[0] if values else None


def wait_for(check, timeout=30, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_s3_repository_is_polled_mixed_with_a_local_one_and_served_offline(tmp_path, s3, start_tern):
    s3.client.create_bucket(Bucket="fleet")
    s3.put_model("fleet", "edge/models", "remote_simple")
    local = tmp_path / "local"
    (local / "local_simple" / "1").mkdir(parents=True)
    shutil.copy(ONNX, local / "local_simple" / "1" / "model.onnx")
    (local / "local_simple" / "config.pbtxt").write_text(simple_config("local_simple"))
    cache = tmp_path / "cache"
    url = f"s3://{s3.endpoint}/fleet/edge/models"
    args = [f"--model-repository={url}", f"--model-repository={local}", f"--model-cache-dir={cache}",
            "--model-control-mode=poll", "--repository-poll-secs=1"]
    t = start_tern(args, env=CREDS)
    infer_simple(t, "remote_simple")
    infer_simple(t, "local_simple")
    assert metric(t, "tern_model_sync_bytes_total") > 0
    assert metric(t, "tern_model_sync_failures_total") == 0
    assert metric(t, "tern_model_sync_age_seconds") is not None

    # A new version landing in the bucket is served after the next poll.
    s3.put("fleet", "edge/models/remote_simple/2/model.onnx", open(ONNX, "rb").read())
    c = httpclient.InferenceServerClient(t.url)
    wait_for(lambda: c.is_model_ready("remote_simple", "2"), what="version 2 from the bucket")
    infer_simple(t, "remote_simple", "2")
    # A model removed from the bucket is unloaded.
    s3.put_model("fleet", "edge/models", "short_lived")
    wait_for(lambda: c.is_model_ready("short_lived"), what="short_lived")
    for key in ("short_lived/config.pbtxt", "short_lived/1/model.onnx"):
        s3.client.delete_object(Bucket="fleet", Key=f"edge/models/{key}")
    wait_for(lambda: not c.is_model_ready("short_lived"), what="short_lived unloaded")
    t.stop()

    # The store gone (a device booting without network): the cache serves what it verified.
    s3.stop()
    started = time.time()
    t = start_tern(args, env=CREDS)
    assert time.time() - started < 60
    infer_simple(t, "remote_simple", "2")
    infer_simple(t, "local_simple")
    assert metric(t, "tern_model_sync_failures_total") >= 1
    assert metric(t, "tern_model_sync_age_seconds") > 0  # the last sync before the restart
    assert "cannot list it" in t.log()


def test_explicit_loads_fetch_on_demand_with_triton_s_credential_file(tmp_path, s3, start_tern):
    s3.client.create_bucket(Bucket="lazy")
    url = f"s3://{s3.endpoint}/lazy"
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"s3": {"": {"key_id": "wrong", "secret_key": "wrong", "region": "us-east-1"},
                                        url: {"key_id": "tern-test", "secret_key": "tern-test-secret",
                                              "region": "us-east-1"}}}))
    env = {k: None for k in CREDS} | {"TRITON_CLOUD_CREDENTIAL_PATH": str(creds)}
    s3.put("lazy", "early/config.pbtxt", simple_config("early").encode())
    s3.put("lazy", "early/1/model.onnx", open(ONNX, "rb").read())
    t = start_tern([f"--model-repository={url}", f"--model-cache-dir={tmp_path / 'cache'}",
                    "--model-control-mode=explicit"], env=env)
    c = httpclient.InferenceServerClient(t.url)
    # What the bucket has is in the index before anything is fetched.
    assert index(t)[("early", "")] == {"name": "early", "state": "UNAVAILABLE", "reason": "not loaded"}
    assert not list((tmp_path / "cache").glob("*/models/early"))
    c.load_model("early")
    infer_simple(t, "early")
    # Uploaded after the server started; the repository is the bucket's top.
    s3.put("lazy", "late/config.pbtxt", simple_config("late").encode())
    s3.put("lazy", "late/1/model.onnx", open(ONNX, "rb").read())
    s3.put("lazy", "late/1/", b"")  # a folder marker, as consoles create them
    assert not c.is_model_ready("late")
    c.load_model("late")
    infer_simple(t, "late")
    with pytest.raises(InferenceServerException, match="failed to load 'absent'"):
        c.load_model("absent")


def test_an_unverified_update_never_replaces_the_signed_version(tmp_path, s3, start_tern):
    keys = tmp_path / "keys"
    keys.mkdir()
    subprocess.run([tern_bin(), "model", "keygen", "--sign", keys / "k.pem"], check=True, capture_output=True)
    model = tmp_path / "src" / "signed_remote"
    (model / "1").mkdir(parents=True)
    shutil.copy(ONNX, model / "1" / "model.onnx")
    (model / "config.pbtxt").write_text(simple_config("signed_remote"))
    subprocess.run([tern_bin(), "model", "sign", "--key", keys / "k.pem", model], check=True, capture_output=True)
    s3.client.create_bucket(Bucket="signed")
    for f in ("config.pbtxt", "1/model.onnx", "tern-manifest.json", "tern-manifest.sig"):
        s3.put("signed", f"repo/signed_remote/{f}", (model / f).read_bytes())
    cache = tmp_path / "cache"
    t = start_tern([f"--model-repository=s3://{s3.endpoint}/signed/repo", f"--model-cache-dir={cache}",
                    f"--model-trust-key={keys / 'k.pem.pub'}", "--model-control-mode=poll",
                    "--repository-poll-secs=1"], env=CREDS)
    infer_simple(t, "signed_remote")
    # A changed file without a new signature: refused before it reaches the cache's models.
    changed = simple_config("signed_remote") + "\n# changed upstream\n"
    s3.put("signed", "repo/signed_remote/config.pbtxt", changed.encode())
    wait_for(lambda: "does not match the signed manifest" in index(t)[("signed_remote", "1")]["reason"],
             what="the failed update in the index")
    row = index(t)[("signed_remote", "1")]
    assert row["state"] == "READY" and row["reason"].startswith("update from s3://"), row
    assert "file 'config.pbtxt' does not match the signed manifest" in row["reason"], row
    infer_simple(t, "signed_remote")
    served = next((cache).glob("*/models/signed_remote"))
    assert "changed upstream" not in (served / "config.pbtxt").read_text()
    # Signed again: the update is taken.
    (model / "config.pbtxt").write_text(changed)
    subprocess.run([tern_bin(), "model", "sign", "--key", keys / "k.pem", model], check=True, capture_output=True)
    for f in ("tern-manifest.json", "tern-manifest.sig"):
        s3.put("signed", f"repo/signed_remote/{f}", (model / f).read_bytes())
    wait_for(lambda: index(t)[("signed_remote", "1")]["reason"] == "", what="the signed update")
    assert "changed upstream" in (served / "config.pbtxt").read_text()
    infer_simple(t, "signed_remote")


def test_a_full_disk_fails_the_update_keeps_serving_and_frees_the_space(tmp_path, s3, start_tern):
    cache = tmp_path / "cache"
    cache.mkdir()
    # A 4 MB file system for the cache (a tmpfs: needs the right to mount, which root has);
    # where mounting is not allowed, a 4 MB file size limit on the server instead (EFBIG, not ENOSPC).
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(cache)],
                             capture_output=True).returncode == 0
    wrapper = () if mounted else ("bash", "-c", 'trap "" XFSZ; ulimit -f 4096; exec "$@"', "limited")
    why = "the disk is full" if mounted else "the file is larger than this system lets the server write"
    try:
        s3.client.create_bucket(Bucket="tight")
        s3.put_model("tight", "repo", "tight_simple")
        t = start_tern([f"--model-repository=s3://{s3.endpoint}/tight/repo", f"--model-cache-dir={cache}",
                        "--model-control-mode=poll", "--repository-poll-secs=1"], env=CREDS, wrapper=wrapper)
        infer_simple(t, "tight_simple")
        def cache_bytes():
            return sum(f.stat().st_size for f in cache.rglob("*") if f.is_file() and not f.is_symlink())

        used = cache_bytes()
        # A version larger than the disk: the update fails, version 1 serves on.
        s3.put("tight", "repo/tight_simple/2/model.onnx", os.urandom(6 << 20))
        wait_for(lambda: why in index(t)[("tight_simple", "1")]["reason"], what="the full disk in the index")
        row = index(t)[("tight_simple", "1")]
        assert row["state"] == "READY" and row["reason"].startswith("update from s3://"), row
        infer_simple(t, "tight_simple")
        assert metric(t, "tern_model_sync_failures_total") >= 1
        # What the failed update wrote is gone again (each poll retries, and frees it).
        wait_for(lambda: cache_bytes() <= used + (64 << 10), what="the space freed")
        # The store fixed: the update is taken.
        s3.put("tight", "repo/tight_simple/2/model.onnx", open(ONNX, "rb").read())
        c = httpclient.InferenceServerClient(t.url)
        wait_for(lambda: c.is_model_ready("tight_simple", "2"), what="version 2 once it fits")
        infer_simple(t, "tight_simple", "2")
        assert index(t)[("tight_simple", "2")]["reason"] == ""
        t.stop()
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(cache)], check=False)


def test_kill_9_at_any_moment_of_an_update_leaves_the_last_good_version(tmp_path, s3, start_tern):
    """The server killed at random moments while it fetches, verifies, swaps a
    new version in and compiles a plugin into the `.cwasm` cache: every
    restart serves a complete version, and the last one ends on the update."""
    wasm_dir = os.environ.get("TERN_PLUGINS_DIR", os.path.join(ROOT, "target", "wasm32-wasip2", "release"))
    wasm = os.path.join(wasm_dir, "add_sub.wasm")
    if not os.path.exists(wasm):
        pytest.fail(f"{wasm} not found; run `make plugins` (or set TERN_PLUGINS_DIR)")
    s3.client.create_bucket(Bucket="power")
    s3.put_model("power", "repo", "steady")
    args = [f"--model-repository=s3://{s3.endpoint}/power/repo", f"--model-cache-dir={tmp_path / 'cache'}",
            f"--wasm-cache-dir={tmp_path / 'wasm-cache'}", "--model-control-mode=poll", "--repository-poll-secs=1"]
    t = start_tern(args, env=CREDS)
    infer_simple(t, "steady")
    t.stop()
    # The update: a second version with 24 MB of weights beside it, and a plugin to compile.
    weights = os.urandom(24 << 20)
    s3.put("power", "repo/steady/2/model.onnx", open(ONNX, "rb").read())
    s3.put("power", "repo/steady/2/weights.bin", weights)
    config = open(f"{ROOT}/model_repository/add_sub/config.pbtxt").read()
    s3.put("power", "repo/add_sub/config.pbtxt", config.encode())
    s3.put("power", "repo/add_sub/1/model.wasm", open(wasm, "rb").read())
    rng = random.Random(7)
    for _ in range(8):
        t = Tern(args, env=CREDS, wait_ready=False)
        time.sleep(rng.uniform(0.0, 1.5))
        t.proc.send_signal(signal.SIGKILL)
        t.wait()
        # Whatever the moment: each model in the cache links to a complete snapshot.
        for link in (tmp_path / "cache").glob("*/models/*"):
            if link.name.startswith("."):
                continue
            snapshot = link.resolve()
            assert snapshot.is_dir(), link
            listing = json.loads(open(str(snapshot) + ".listing").read())
            for rel, (size, _) in listing.items():
                assert (snapshot / rel).stat().st_size == size, (snapshot, rel)
            files = {str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()}
            assert files == set(listing), (files, listing)
    t = start_tern(args, env=CREDS)
    c = httpclient.InferenceServerClient(t.url)
    wait_for(lambda: c.is_model_ready("steady", "2") and c.is_model_ready("add_sub"), timeout=60,
             what="the update after the kills")
    infer_simple(t, "steady", "2")
    served = next((tmp_path / "cache").glob("*/models/steady"))
    assert (served / "2" / "weights.bin").read_bytes() == weights
    x = np.ones((1, 4), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32"), httpclient.InferInput("INPUT1", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(x)
    assert (c.infer("add_sub", inputs).as_numpy("OUTPUT0") == 2 * x).all()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_azure_blob_repository_served_by_azurite(tmp_path, start_tern):
    azurite = os.environ.get("TERN_AZURITE", os.path.join(ROOT, ".cache", "azurite", "node_modules", ".bin", "azurite-blob"))
    if not os.path.exists(azurite):
        pytest.fail(f"{azurite} not found; run `make {os.path.relpath(azurite, ROOT)}` (make e2e installs it)")
    from azure.storage.blob import BlobServiceClient

    port = free_port()
    proc = subprocess.Popen([azurite, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                             str(tmp_path / "azurite"), "--silent", "--skipApiVersionCheck", "--loose"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Azurite's well-known development account.
        key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
        conn = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={key};"
                f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;")
        service = BlobServiceClient.from_connection_string(conn)
        wait_for(lambda: service.get_service_properties() is not None, what="azurite")
        container = service.create_container("models")
        container.upload_blob("repo/blob_simple/config.pbtxt", simple_config("blob_simple").encode())
        container.upload_blob("repo/blob_simple/1/model.onnx", open(ONNX, "rb").read())
        env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{port}",
               "AZURE_STORAGE_ACCOUNT": "devstoreaccount1", "AZURE_STORAGE_KEY": key}
        t = start_tern([f"--model-repository=as://devstoreaccount1/models/repo",
                        f"--model-cache-dir={tmp_path / 'cache'}", "--model-control-mode=poll",
                        "--repository-poll-secs=1"], env=env)
        infer_simple(t, "blob_simple")
        container.upload_blob("repo/blob_simple/2/model.onnx", open(ONNX, "rb").read())
        c = httpclient.InferenceServerClient(t.url)
        wait_for(lambda: c.is_model_ready("blob_simple", "2"), what="version 2 from Azurite")
        infer_simple(t, "blob_simple", "2")
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_gcs_repository_served_by_the_gcs_emulator(tmp_path, start_tern):
    from gcs_emulator import GCS

    gcs = GCS(tmp_path / "service-account.json")
    try:
        gcs.create_bucket("fleet")
        gcs.put("fleet", "repo/gcs_simple/config.pbtxt", simple_config("gcs_simple").encode())
        gcs.put("fleet", "repo/gcs_simple/1/model.onnx", open(ONNX, "rb").read())
        cache = tmp_path / "cache"
        poll = ["--model-repository=gs://fleet/repo", f"--model-cache-dir={cache}", "--model-control-mode=poll",
                "--repository-poll-secs=1"]
        t = start_tern(poll, env={"GOOGLE_APPLICATION_CREDENTIALS": gcs.key_file})
        infer_simple(t, "gcs_simple")
        c = httpclient.InferenceServerClient(t.url)
        gcs.put("fleet", "repo/gcs_simple/2/model.onnx", open(ONNX, "rb").read())
        wait_for(lambda: c.is_model_ready("gcs_simple", "2"), what="version 2 from the GCS emulator")
        infer_simple(t, "gcs_simple", "2")
        gcs.delete("fleet", "repo/gcs_simple/1/model.onnx")
        wait_for(lambda: not c.is_model_ready("gcs_simple", "1"), what="version 1 gone")
        assert metric(t, "tern_model_sync_failures_total") == 0
        t.stop()

        # Triton's credential file names the key for gs://; explicit mode fetches on load.
        creds = tmp_path / "creds.json"
        creds.write_text(json.dumps({"gs": {"gs://fleet": gcs.key_file}}))
        gcs.put("fleet", "repo/gcs_late/config.pbtxt", simple_config("gcs_late").encode())
        gcs.put("fleet", "repo/gcs_late/1/model.onnx", open(ONNX, "rb").read())
        t = start_tern(["--model-repository=gs://fleet/repo", f"--model-cache-dir={tmp_path / 'cache2'}",
                        "--model-control-mode=explicit"], env={"TRITON_CLOUD_CREDENTIAL_PATH": str(creds)})
        c = httpclient.InferenceServerClient(t.url)
        assert index(t)[("gcs_late", "")]["reason"] == "not loaded"
        c.load_model("gcs_late")
        infer_simple(t, "gcs_late")
        t.stop()
    finally:
        gcs.stop()

    # The emulator gone: the poll-mode cache serves what it verified.
    t = start_tern(poll, env={"GOOGLE_APPLICATION_CREDENTIALS": gcs.key_file})
    infer_simple(t, "gcs_simple", "2")
    assert metric(t, "tern_model_sync_failures_total") >= 1
