"""The container images (`make images`, or `make image-check` in CI): each
architecture of the image's index is unpacked with umoci and its entrypoint
run from the unpacked root filesystem the way a container runtime would (its
configured command, user and environment; amd64 in a chroot as the image's
user, arm64 under qemu-aarch64 with the root filesystem as prefix), then
served the example repository it ships to tritonclient over HTTP and gRPC.
TERN_IMAGE_LAYOUT names the OCI layout, TERN_IMAGE_TAG the index: `-cpu`
(amd64 and arm64) or `-cuda` (amd64, ONNX Runtime's GPU build; without a GPU
here it serves on the CPU, and its libraries are checked to resolve inside
the image). A cuda image built with `images.py --from-manifest` (`make
image-check`) holds, for each file of the CUDA wheels, a placeholder at its
path: ELF stubs with the dynamic sections images/cuda-manifest.json records,
and the tarball's CPU build of ONNX Runtime (same version) in place of the GPU
build, so the same tests run on it; only what needs the real bytes of the
wheels' libraries reads the manifest instead."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import Tern

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QEMU_CPUINFO = os.path.join(ROOT, ".cache", "qemu-aarch64", "root", "proc", "cpuinfo")
CUDA_MANIFEST = os.path.join(ROOT, "images", "cuda-manifest.json")


def layout():
    path = os.environ.get("TERN_IMAGE_LAYOUT")
    if not path:
        pytest.skip("TERN_IMAGE_LAYOUT is not set: `make image-check` builds and tests the image")
    tag = os.environ.get("TERN_IMAGE_TAG")
    if not tag:
        pytest.fail("TERN_IMAGE_TAG must name the image's index in TERN_IMAGE_LAYOUT, e.g. 0.1.0-cpu")
    return path, tag


def index_manifests():
    path, tag = layout()
    idx = json.load(open(os.path.join(path, "index.json")))
    top = next(m for m in idx["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag)
    assert top["mediaType"] == "application/vnd.oci.image.index.v1+json"
    with open(os.path.join(path, "blobs", "sha256", top["digest"].split(":")[1])) as f:
        return json.load(f)["manifests"]


def flavour():
    """`cpu` or `cuda` (the `-python` variant of cpu is cpu)."""
    return layout()[1].removesuffix("-python").rsplit("-", 1)[1]


def python_variant():
    """The `-cpu-python` image: the cpu image plus the Python runner layer."""
    return layout()[1].endswith("-python")


def test_the_index_holds_the_flavours_architectures():
    platforms = sorted(m["platform"]["architecture"] for m in index_manifests())
    assert platforms == (["amd64", "arm64"] if flavour() == "cpu" else ["amd64"]), platforms


@pytest.fixture(autouse=True)
def drop_bundle(tmp_path):
    """Unpacked images are large (1.7 GB for cuda): none outlives its test."""
    yield
    shutil.rmtree(tmp_path / "bundle", ignore_errors=True)


def unpack(tmp_path, platform):
    path, tag = layout()
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{path}:{tag}-{platform}", str(bundle)],
                   check=True, capture_output=True)
    spec = json.load(open(bundle / "config.json"))
    return str(bundle / "rootfs"), spec["process"]


@pytest.fixture(params=["amd64", "arm64"])
def unpacked(request, tmp_path):
    if request.param == "arm64" and flavour() != "cpu":
        pytest.skip(f"the {flavour()} image is amd64 only")
    return (request.param, *unpack(tmp_path, request.param))


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
    runner = os.path.join(rootfs, "usr", "lib", "tern", "python-runner.wasm")
    assert os.path.isfile(runner) == python_variant(), "only the -python image carries the Python runner"
    # A Triton Python model beside the examples, served natively (compiling
    # the runner under qemu takes over ten minutes).
    serve_python = python_variant() and platform == "amd64"
    if serve_python:
        dest = os.path.join(rootfs, "models", "add_sub_python")
        shutil.copytree(os.path.join(ROOT, "tests", "python_models", "add_sub"), dest)
        with open(os.path.join(dest, "config.pbtxt")) as f:
            text = f.read().replace('name: "add_sub"', 'name: "add_sub_python"')
        with open(os.path.join(dest, "config.pbtxt"), "w") as f:
            f.write(text)
    t = Tern(args, env=env, binary=binary, wrapper=wrapper)
    try:
        if serve_python:
            x = np.arange(4, dtype=np.float32)
            for mod, url in ((httpclient, t.url), (grpcclient, t.grpc_url)):
                ins = [mod.InferInput("INPUT0", [4], "FP32"), mod.InferInput("INPUT1", [4], "FP32")]
                ins[0].set_data_from_numpy(x)
                ins[1].set_data_from_numpy(x)
                r = mod.InferenceServerClient(url).infer("add_sub_python", ins)
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x + x)
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
    rootfs, process = unpack(tmp_path, "amd64")
    env = dict(e.split("=", 1) for e in process["env"])
    env.update(ORT_DYLIB_PATH=None, TERN_ONNXRUNTIME_LIBRARY=None)
    t = Tern([*process["args"][1:], "--exit-on-error=false"], env=env, binary=process["args"][0],
             wrapper=["chroot", "--userspec=65532:65532", rootfs])
    try:
        c = httpclient.InferenceServerClient(t.url)
        index = {m["name"]: m for m in c.get_model_repository_index()}
        assert index["simple"]["state"] == "UNAVAILABLE", index
        assert "/proc/self/exe" in index["simple"]["reason"], index["simple"]
        assert c.is_model_ready("add_sub")
        assert "panicked" not in t.log(), t.log()
    finally:
        assert t.stop() == 0, t.log()


# Libraries a GPU host provides (the NVIDIA container toolkit mounts the driver)
# or that the cuda image leaves out on purpose (TensorRT is not on PyPI).
FROM_THE_HOST = {"libcuda.so.1"}
NOT_SHIPPED = {"libnvinfer.so.10", "libnvonnxparser.so.10"}


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def placeholder(path):
    """Whether a file is a --from-manifest image's stand-in for a file of the CUDA wheels."""
    with open(path, "rb") as f:
        return b"tern image placeholder" in f.read(65536) and os.path.getsize(path) < 65536


def assert_no_cuda_libraries(tmp_path):
    """The CPU image (these tests run once per flavour) carries none of the CUDA image's libraries."""
    rootfs, _ = unpack(tmp_path, "amd64")
    libdir = os.path.join(rootfs, "usr/lib/tern")
    cuda = [f for f in os.listdir(libdir) if "cuda" in f or "tensorrt" in f or f.startswith(("libcublas", "libcudnn"))]
    assert not cuda, cuda


def manifest_entries():
    with open(CUDA_MANIFEST) as f:
        return {e["path"]: e for w in json.load(f)["wheels"] for e in w["files"]}


def test_cuda_image_libraries_resolve_inside_the_image(tmp_path):
    """Every shared library the binary, ONNX Runtime's GPU build and its providers
    link against is in the image's search path (LD_LIBRARY_PATH, then the
    loader's default folders), except the driver and TensorRT."""
    if flavour() != "cuda":
        return assert_no_cuda_libraries(tmp_path)
    rootfs, process = unpack(tmp_path, "amd64")
    env = dict(e.split("=", 1) for e in process["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "compute" in env["NVIDIA_DRIVER_CAPABILITIES"], env
    search = [d for d in env["LD_LIBRARY_PATH"].split(":")] + ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64"]
    libdir = os.path.join(rootfs, "usr/lib/tern")
    elves = [os.path.join(rootfs, "usr/bin/tern")] + [os.path.join(libdir, f) for f in os.listdir(libdir)]
    providers = {os.path.basename(p) for p in elves}
    # The CUDA provider opens cuDNN, cuFFT and NVRTC at run time (dlopen), by these names.
    opened = {"libcudnn.so.9", "libcufft.so.12", "libnvrtc.so.13"}
    assert {"libonnxruntime_providers_cuda.so", "libonnxruntime_providers_tensorrt.so",
            "libonnxruntime_providers_shared.so", "libcublasLt.so.13"} | opened <= providers, providers
    cuda_provider = os.path.join(libdir, "libonnxruntime_providers_cuda.so")
    if placeholder(cuda_provider):
        # The stubs carry the manifest's dynamic sections (readelf below reads them); what the
        # provider opens by name, the full build found in the real library and recorded.
        entries = manifest_entries()
        assert opened <= set(entries["usr/lib/tern/libonnxruntime_providers_cuda.so"]["opens"])
        for path, entry in entries.items():
            if "needed" in entry and placeholder(os.path.join(rootfs, path)):
                assert needed(os.path.join(rootfs, path)) == entry["needed"], path
    else:
        strings = open(cuda_provider, "rb").read()
        assert b"cudnnCreate" in strings and b"cufftCreate" in strings and b"libnvrtc.so.13" in strings
    missing = {}
    for elf in elves:
        for lib in needed(elf):
            if lib in FROM_THE_HOST or lib in NOT_SHIPPED:
                continue
            if not any(os.path.exists(os.path.join(rootfs, d.lstrip("/"), lib)) for d in search):
                missing.setdefault(os.path.basename(elf), []).append(lib)
    assert not missing, missing
    assert "libcuda.so.1" in needed(os.path.join(libdir, "libonnxruntime_providers_cuda.so"))
    assert set(needed(os.path.join(libdir, "libonnxruntime_providers_tensorrt.so"))) & NOT_SHIPPED


def test_the_image_loader_finds_the_cuda_libraries(tmp_path):
    """The image's own loader, in the unpacked root filesystem as the image's user
    with its environment, traces the binary and every library in /usr/lib/tern:
    nothing is missing but the driver and TensorRT, and no symbol version is (the
    real libraries against the image's glibc and libstdc++; a --from-manifest
    image's stubs have none, so there it checks the recorded DT_NEEDED entries
    against the real loader's search)."""
    if flavour() != "cuda":
        return assert_no_cuda_libraries(tmp_path)
    rootfs, process = unpack(tmp_path, "amd64")
    env = dict(e.split("=", 1) for e in process["env"])
    env["LD_TRACE_LOADED_OBJECTS"] = "1"
    uid, gid = process["user"]["uid"], process["user"]["gid"]

    def enter():
        os.chroot(rootfs)
        os.chdir("/")
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    objects = ["/usr/bin/tern"] + [f"/usr/lib/tern/{f}" for f in sorted(os.listdir(os.path.join(rootfs, "usr/lib/tern")))]
    problems = {}
    for obj in objects:
        out = subprocess.run(["/lib64/ld-linux-x86-64.so.2", obj], env=env, preexec_fn=enter,
                             capture_output=True, text=True)
        assert out.returncode == 0, (obj, out.stdout, out.stderr)
        lines = (out.stdout + out.stderr).splitlines()
        missing = {line.split("=>")[0].strip() for line in lines if "=> not found" in line}
        bad = sorted(missing - FROM_THE_HOST - NOT_SHIPPED) + [line.strip() for line in lines if "version `" in line]
        if bad:
            problems[obj] = bad
    assert not problems, problems


def test_cuda_image_without_a_gpu_refuses_gpu_instances_and_serves_the_rest(tmp_path):
    """On a machine without the NVIDIA driver the cuda image starts, serves CPU
    instances with ONNX Runtime's GPU build (its CPU build in a --from-manifest
    image), and fails a KIND_GPU model's load with the reason."""
    if flavour() != "cuda":
        pytest.skip("the cuda image without a GPU")
    rootfs, process = unpack(tmp_path, "amd64")
    gpu = os.path.join(rootfs, "models", "simple_gpu")
    shutil.copytree(os.path.join(rootfs, "models", "simple"), gpu)
    cfg = open(os.path.join(gpu, "config.pbtxt")).read().replace('name: "simple"', 'name: "simple_gpu"')
    open(os.path.join(gpu, "config.pbtxt"), "w").write(cfg + "\ninstance_group [{ kind: KIND_GPU count: 1 }]\n")
    env = dict(e.split("=", 1) for e in process["env"])
    env["ORT_DYLIB_PATH"] = None
    t = Tern([*process["args"][1:], "--exit-on-error=false"], env=env, binary=process["args"][0],
             wrapper=["chroot", "--userspec=65532:65532", rootfs])
    try:
        c = httpclient.InferenceServerClient(t.url)
        index = {m["name"]: m for m in c.get_model_repository_index()}
        assert index["simple_gpu"]["state"] == "UNAVAILABLE", index
        assert "GPU" in index["simple_gpu"]["reason"] or "CUDA" in index["simple_gpu"]["reason"], index["simple_gpu"]
        assert c.is_model_ready("simple") and c.is_model_ready("add_sub")
        assert "panicked" not in t.log(), t.log()
    finally:
        assert t.stop() == 0, t.log()
    version = subprocess.run(["chroot", "--userspec=65532:65532", rootfs, "/usr/bin/tern", "--version"],
                             capture_output=True, text=True, env={k: v for k, v in env.items() if v}, check=True).stdout
    assert "features: onnx, cuda" in version and "/usr/lib/tern/libonnxruntime.so (ORT Build Info" in version, version
