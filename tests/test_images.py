"""The CPU container image (`make images`, or `make image-check` in CI): each
architecture of the multi-architecture index is unpacked with umoci and its
entrypoint run from the unpacked root filesystem the way a container runtime
would (its configured command, user and environment; amd64 in a chroot as the
image's user, arm64 under qemu-aarch64 with the root filesystem as prefix),
then served the example repository it ships to tritonclient over HTTP and
gRPC. TERN_IMAGE_LAYOUT names the OCI layout, TERN_IMAGE_TAG the index."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import Tern

QEMU_CPUINFO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            ".cache", "qemu-aarch64", "root", "proc", "cpuinfo")


def layout():
    path = os.environ.get("TERN_IMAGE_LAYOUT")
    if not path:
        pytest.skip("TERN_IMAGE_LAYOUT is not set: `make image-check` builds and tests the image")
    return path, os.environ["TERN_IMAGE_TAG"]


def index_manifests():
    path, tag = layout()
    idx = json.load(open(os.path.join(path, "index.json")))
    top = next(m for m in idx["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag)
    assert top["mediaType"] == "application/vnd.oci.image.index.v1+json"
    with open(os.path.join(path, "blobs", "sha256", top["digest"].split(":")[1])) as f:
        return json.load(f)["manifests"]


def test_the_index_holds_amd64_and_arm64():
    platforms = sorted(m["platform"]["architecture"] for m in index_manifests())
    assert platforms == ["amd64", "arm64"], platforms


@pytest.fixture(params=["amd64", "arm64"])
def unpacked(request, tmp_path):
    path, tag = layout()
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{path}:{tag}-{request.param}", str(bundle)],
                   check=True, capture_output=True)
    spec = json.load(open(bundle / "config.json"))
    return request.param, str(bundle / "rootfs"), spec["process"]


def test_the_entrypoint_serves_the_shipped_repository(unpacked):
    platform, rootfs, process = unpacked
    assert process["args"][0] == "/usr/bin/tern" and "--model-repository=/models" in process["args"]
    assert process["user"]["uid"] == 65532, process["user"]
    env = dict(e.split("=", 1) for e in process["env"])
    env["ORT_DYLIB_PATH"] = None  # the test suite's own library must not leak in
    args = process["args"][1:]
    if platform == "amd64":
        wrapper = ["chroot", f"--userspec={process['user']['uid']}:{process['user']['gid']}", rootfs]
        binary = process["args"][0]
    else:
        # No binfmt here: qemu-user runs the arm64 binary with the root filesystem as its
        # prefix (as root). Its prefix covers the libraries but not every file call, so the
        # image's own paths (/models, /var/cache/tern, ONNX Runtime) are given inside the
        # unpacked root; ONNX Runtime's CPU detection needs an arm64 /proc/cpuinfo.
        os.makedirs(os.path.join(rootfs, "proc"), exist_ok=True)
        shutil.copy(QEMU_CPUINFO, os.path.join(rootfs, "proc", "cpuinfo"))
        wrapper = ["qemu-aarch64", "-R", "512G", "-L", rootfs]
        binary = rootfs + process["args"][0]
        args = [a.replace("=/", f"={rootfs}/", 1) if a.startswith("--model-repository=") else a for a in args]
        for k in ("TERN_WASM_CACHE_DIR", "TERN_ONNXRUNTIME_LIBRARY"):
            env[k] = rootfs + env[k]
    t = Tern(args, env=env, binary=binary, wrapper=wrapper)
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.int32)
        for mod, url in ((httpclient, t.url), (grpcclient, t.grpc_url)):
            c = mod.InferenceServerClient(url)
            assert c.is_server_ready()
            ins = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
            ins[0].set_data_from_numpy(a)
            ins[1].set_data_from_numpy(b)
            np.testing.assert_array_equal(c.infer("simple", ins).as_numpy("OUTPUT0"), a + b)
            x = np.arange(8, dtype=np.float32).reshape(2, 4)
            ins = [mod.InferInput("INPUT0", [2, 4], "FP32"), mod.InferInput("INPUT1", [2, 4], "FP32")]
            ins[0].set_data_from_numpy(x)
            ins[1].set_data_from_numpy(x)
            np.testing.assert_array_equal(c.infer("add_sub", ins).as_numpy("OUTPUT0"), x + x)
        # The plugin cache is written where the image says, by the image's user.
        cache = os.path.join(rootfs, env["TERN_WASM_CACHE_DIR"].removeprefix(rootfs).lstrip("/"))
        assert any(f.endswith(".cwasm") for f in os.listdir(cache)), t.log()
    finally:
        assert t.stop() == 0, t.log()


def test_without_proc_onnx_models_fail_cleanly_and_the_rest_serves(tmp_path):
    """In a root filesystem without /proc the binary cannot find its own folder:
    with the image's ONNX Runtime setting removed, the ONNX model fails its load
    with the reason, and nothing panics."""
    path, tag = layout()
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{path}:{tag}-amd64", str(bundle)], check=True, capture_output=True)
    process = json.load(open(bundle / "config.json"))["process"]
    env = dict(e.split("=", 1) for e in process["env"])
    env.update(ORT_DYLIB_PATH=None, TERN_ONNXRUNTIME_LIBRARY=None)
    t = Tern([*process["args"][1:], "--exit-on-error=false"], env=env, binary=process["args"][0],
             wrapper=["chroot", "--userspec=65532:65532", str(bundle / "rootfs")])
    try:
        c = httpclient.InferenceServerClient(t.url)
        index = {m["name"]: m for m in c.get_model_repository_index()}
        assert index["simple"]["state"] == "UNAVAILABLE", index
        assert "/proc/self/exe" in index["simple"]["reason"], index["simple"]
        assert c.is_model_ready("add_sub")
        assert "panicked" not in t.log(), t.log()
    finally:
        assert t.stop() == 0, t.log()
