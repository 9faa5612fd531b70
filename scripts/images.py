#!/usr/bin/env python3
"""Tern's container images, built without a Docker daemon.

`cpu`: for each architecture a root filesystem made of the gnu release tarball
(binary, ONNX Runtime, licences, example repository) and the few runtime
libraries they need (glibc, libstdc++, libgcc from Debian's packages for that
architecture), put into an OCI layout with umoci, then one multi-architecture
index over both and an oci-archive that `podman load` and `skopeo copy` accept.

`cuda` (amd64): the same, with ONNX Runtime's GPU build (CUDA and TensorRT
providers, from the `onnxruntime-gpu` wheel) in place of the CPU one and only
the CUDA 13 libraries those providers load, taken from NVIDIA's runtime wheels
on PyPI. The driver (`libcuda.so.1`) comes from the host through the NVIDIA
container toolkit. TensorRT's own libraries are not on PyPI (its wheels there
download from NVIDIA's index at install time), so they are not in the image.

    images.py --tarballs dist --out dist                  # after make dist
    images.py --flavour cuda --tarballs dist --out dist
"""

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UID = 65532  # the image's unprivileged user, `tern`
PLATFORMS = {"x86_64": "amd64", "aarch64": "arm64"}
# Runtime libraries the binary and ONNX Runtime need (readelf NEEDED), and where
# Debian's packages for each architecture put them on this machine: the host's
# libc6/libstdc++6/libgcc-s1 for amd64, the *-arm64-cross packages for arm64.
LIBS = ["libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
        "libstdc++.so.6", "libgcc_s.so.1"]
LIB_SOURCE = {"x86_64": "/lib/x86_64-linux-gnu", "aarch64": "/usr/aarch64-linux-gnu/lib"}
LIB_DIR = {"x86_64": "lib/x86_64-linux-gnu", "aarch64": "lib/aarch64-linux-gnu"}
LOADER = {"x86_64": ("lib64/ld-linux-x86-64.so.2", "ld-linux-x86-64.so.2"),
          "aarch64": ("lib/ld-linux-aarch64.so.1", "ld-linux-aarch64.so.1")}
CROSS_PACKAGES = ["libc6-arm64-cross", "libstdc++6-arm64-cross", "libgcc-s1-arm64-cross"]

# The CUDA image: ONNX Runtime's GPU build and the CUDA 13 runtime wheels whose
# libraries its providers load: the CUDA provider links cudart, cuBLAS(Lt) and
# cuRAND (DT_NEEDED) and opens cuDNN, cuFFT and NVRTC at run time (dlopen); the
# TensorRT provider links cudart, cuBLAS and cuDNN besides TensorRT itself. The
# versions match the LibTorch CUDA set (scripts/get_libtorch.py), so pip's cache
# serves both.
ORT_GPU = "onnxruntime-gpu==1.31.1"
CUDA_WHEELS = ["nvidia-cuda-runtime==13.0.96", "nvidia-cublas==13.1.1.3", "nvidia-curand==10.4.0.35",
               "nvidia-cuda-nvrtc==13.0.88", "nvidia-cudnn-cu13==9.20.0.48", "nvidia-cufft==12.0.0.61"]
CUDA_LIBS = ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libcufft.so.12",
             "libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libcudnn.so.9", "libcudnn_adv.so.9",
             "libcudnn_cnn.so.9", "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9",
             "libcudnn_graph.so.9", "libcudnn_heuristic.so.9", "libcudnn_ops.so.9"]
ORT_GPU_LIBS = {f"libonnxruntime.so.{ORT_GPU.split('==')[1]}": "libonnxruntime.so",
                "libonnxruntime_providers_shared.so": "libonnxruntime_providers_shared.so",
                "libonnxruntime_providers_cuda.so": "libonnxruntime_providers_cuda.so",
                "libonnxruntime_providers_tensorrt.so": "libonnxruntime_providers_tensorrt.so"}
# cuDNN's libraries need zlib.
CUDA_EXTRA_LIBS = ["libz.so.1"]


def run(cmd):
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def cuda_wheels(cache):
    """The pinned ONNX Runtime GPU and CUDA runtime wheels, downloaded into
    `cache` (pip keeps files already there); other wheels in `cache`, say of
    earlier pins, are ignored."""
    os.makedirs(cache, exist_ok=True)
    pins = [ORT_GPU, *CUDA_WHEELS]
    run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
         "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
         "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_12_x86_64", "-d", cache, *pins])
    wheels = []
    for pin in pins:
        name, version = pin.split("==")
        found = glob.glob(os.path.join(cache, f"{name.replace('-', '_')}-{version}-*.whl"))
        if len(found) != 1:
            sys.exit(f"expected one wheel for {pin} in {cache}, found {found or 'none'}")
        wheels.append(found[0])
    return wheels


def add_cuda(wheels, dest):
    """Puts ONNX Runtime's GPU build and the CUDA libraries into /usr/lib/tern."""
    libdir = os.path.join(dest, "usr/lib/tern")
    wanted = dict(ORT_GPU_LIBS, **{n: n for n in CUDA_LIBS})
    found = set()
    licences = os.path.join(dest, "usr/share/licenses/tern")
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                name = os.path.basename(info.filename)
                if name.lower() in ("license.txt", "license", "thirdpartynotices.txt"):
                    # The NVIDIA wheels' licence (dist-info) and ORT GPU's own notices.
                    project = os.path.basename(wheel).split("-")[0]
                    target = f"onnxruntime-{name}" if project == "onnxruntime_gpu" else f"{project}-{name}"
                    with z.open(info) as src, open(os.path.join(licences, target), "wb") as out:
                        shutil.copyfileobj(src, out)
                    continue
                if name in wanted and name not in found:
                    with z.open(info) as src, open(os.path.join(libdir, wanted[name]), "wb") as out:
                        shutil.copyfileobj(src, out)
                    found.add(name)
    missing = sorted(set(wanted) - found)
    if missing:
        sys.exit(f"the CUDA wheels lack {', '.join(missing)}: check the pinned versions in {__file__}")
    for lib in CUDA_EXTRA_LIBS:
        shutil.copy(os.path.realpath(os.path.join(LIB_SOURCE["x86_64"], lib)),
                    os.path.join(dest, LIB_DIR["x86_64"], lib))


def rootfs(arch, tarball, dest, cuda_wheel_files=None):
    """The image's files: /usr/bin/tern, /usr/lib/tern, libraries, a passwd, /models."""
    with tempfile.TemporaryDirectory() as t:
        with tarfile.open(tarball) as tar:
            tar.extractall(t)
        top = glob.glob(os.path.join(t, "*"))[0]
        os.makedirs(os.path.join(dest, "usr/bin"))
        shutil.copy(os.path.join(top, "bin/tern"), os.path.join(dest, "usr/bin/tern"))
        shutil.copytree(os.path.join(top, "lib"), os.path.join(dest, "usr/lib/tern"))
        shutil.copytree(os.path.join(top, "LICENSES"), os.path.join(dest, "usr/share/licenses/tern"))
        shutil.copytree(os.path.join(top, "share/tern/model_repository"), os.path.join(dest, "models"))
    src = LIB_SOURCE[arch]
    if arch == "aarch64" and not os.path.exists(os.path.join(src, "libstdc++.so.6")):
        run(["apt-get", "install", "-y", "-qq"] + CROSS_PACKAGES)
    libdir = os.path.join(dest, LIB_DIR[arch])
    os.makedirs(libdir)
    for lib in LIBS:
        shutil.copy(os.path.realpath(os.path.join(src, lib)), os.path.join(libdir, lib))
    loader, name = LOADER[arch]
    os.makedirs(os.path.join(dest, os.path.dirname(loader)), exist_ok=True)
    shutil.copy(os.path.realpath(os.path.join(src, name)), os.path.join(dest, loader))
    if cuda_wheel_files:
        add_cuda(cuda_wheel_files, dest)
    os.makedirs(os.path.join(dest, "etc"))
    with open(os.path.join(dest, "etc/passwd"), "w") as f:
        f.write(f"root:x:0:0:root:/root:/sbin/nologin\ntern:x:{UID}:{UID}:tern:/models:/sbin/nologin\n")
    with open(os.path.join(dest, "etc/group"), "w") as f:
        f.write(f"root:x:0:\ntern:x:{UID}:\n")
    for d, mode in (("tmp", 0o1777), ("var/cache/tern", 0o755)):
        os.makedirs(os.path.join(dest, d), exist_ok=True)
        os.chmod(os.path.join(dest, d), mode)
    os.chown(os.path.join(dest, "var/cache/tern"), UID, UID)
    for d, _, files in os.walk(dest):
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                os.chmod(p, 0o755 if os.access(p, os.X_OK) or f.endswith(".so") or ".so." in f else 0o644)


def blob(layout, data):
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return f"sha256:{digest}", len(data)


def read_blob(layout, digest):
    with open(os.path.join(layout, "blobs", "sha256", digest.split(":")[1]), "rb") as f:
        return f.read()


def index(layout, tag, per_arch):
    """Adds a multi-architecture image index `tag` over the per-arch manifests."""
    idx_path = os.path.join(layout, "index.json")
    idx = json.load(open(idx_path))
    refs = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in idx["manifests"]}
    manifests = []
    for arch_tag, platform in per_arch:
        m = dict(refs[arch_tag])
        m.pop("annotations", None)
        m["platform"] = {"architecture": platform, "os": "linux"}
        manifests.append(m)
    data = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": manifests}, separators=(",", ":")).encode()
    digest, size = blob(layout, data)
    idx["manifests"] = [m for m in idx["manifests"]
                        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag]
    idx["manifests"].append({"mediaType": "application/vnd.oci.image.index.v1+json", "digest": digest,
                             "size": size, "annotations": {"org.opencontainers.image.ref.name": tag}})
    json.dump(idx, open(idx_path, "w"), separators=(",", ":"))


def sizes(layout, tag):
    """Compressed bytes of one manifest's image: its layers and config."""
    idx = json.load(open(os.path.join(layout, "index.json")))
    m = next(m for m in idx["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag)
    manifest = json.loads(read_blob(layout, m["digest"]))
    compressed = manifest["config"]["size"] + sum(l["size"] for l in manifest["layers"])
    return compressed


FLAVOURS = {
    "cpu": "Triton-compatible inference server with WebAssembly plugins (CPU: ONNX Runtime, plugins)",
    "cuda": "Triton-compatible inference server with WebAssembly plugins (NVIDIA GPUs: ONNX Runtime with "
            "the CUDA and TensorRT providers, CUDA 13 runtime libraries; TensorRT itself not included)",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tarballs", default=os.path.join(ROOT, "dist"), help="folder with the gnu tarballs")
    ap.add_argument("--out", default=os.path.join(ROOT, "dist"))
    ap.add_argument("--flavour", choices=list(FLAVOURS), default="cpu")
    ap.add_argument("--arch", action="append", choices=list(PLATFORMS),
                    help="default: both for cpu, x86_64 for cuda")
    ap.add_argument("--no-archive", action="store_true", help="only the OCI layout, no oci-archive")
    ap.add_argument("--cuda-cache", default=os.path.join(ROOT, ".cache", "image-cuda", "wheels"),
                    help="where the ONNX Runtime GPU and CUDA wheels are downloaded (once)")
    a = ap.parse_args()
    version = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=ROOT))["packages"]
    version = next(p["version"] for p in version if p["name"] == "tern")
    archs = a.arch or (list(PLATFORMS) if a.flavour == "cpu" else ["x86_64"])
    if a.flavour == "cuda" and archs != ["x86_64"]:
        sys.exit("the cuda image is amd64 only: for Jetson use images/jetson/")
    wheels = cuda_wheels(a.cuda_cache) if a.flavour == "cuda" else None
    layout = os.path.join(a.out, "oci" if a.flavour == "cpu" else f"oci-{a.flavour}")
    shutil.rmtree(layout, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    run(["umoci", "init", "--layout", layout])
    tag = f"{version}-{a.flavour}"
    per_arch = []
    report = []
    for arch in archs:
        platform = PLATFORMS[arch]
        tarballs = glob.glob(os.path.join(a.tarballs, f"tern-{version}-{arch}-linux-gnu.tar.gz"))
        if not tarballs:
            sys.exit(f"no tern-{version}-{arch}-linux-gnu.tar.gz in {a.tarballs}: run `make dist` (or dist.py) first")
        arch_tag = f"{tag}-{platform}"
        with tempfile.TemporaryDirectory() as t:
            fs = os.path.join(t, "rootfs")
            rootfs(arch, tarballs[0], fs, wheels)
            unpacked = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs_ in os.walk(fs) for f in fs_)
            run(["umoci", "new", "--image", f"{layout}:{arch_tag}"])
            what = "ONNX Runtime GPU, CUDA runtime libraries" if wheels else "ONNX Runtime"
            run(["umoci", "insert", "--image", f"{layout}:{arch_tag}", "--history.comment",
                 f"tern {version} ({arch}): binary, {what}, runtime libraries, example models", fs, "/"])
        labels = {
            "org.opencontainers.image.title": "tern",
            "org.opencontainers.image.description": FLAVOURS[a.flavour],
            "org.opencontainers.image.version": version,
            "org.opencontainers.image.licenses": "Apache-2.0 AND MIT" + (" AND LicenseRef-NVIDIA-CUDA" if wheels else ""),
            "org.opencontainers.image.source": "https://github.com/tern-inference/tern",
            "org.opencontainers.image.documentation": "https://github.com/tern-inference/tern/blob/main/docs/deployment.md",
            "io.tern.health": "GET :8000/v2/health/ready (readiness), GET :8000/v2/health/live (liveness)",
        }
        env = ["TERN_WASM_CACHE_DIR=/var/cache/tern", "TERN_ONNXRUNTIME_LIBRARY=/usr/lib/tern/libonnxruntime.so"]
        if wheels:
            # ORT's providers have no RUNPATH; the NVIDIA container toolkit reads the
            # NVIDIA_* variables to mount the driver and the GPUs.
            env += ["LD_LIBRARY_PATH=/usr/lib/tern", "NVIDIA_VISIBLE_DEVICES=all",
                    "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
        cmd = ["umoci", "config", "--image", f"{layout}:{arch_tag}", "--architecture", platform, "--os", "linux",
               "--config.entrypoint", "/usr/bin/tern", "--config.cmd", "--model-repository=/models",
               "--config.user", f"{UID}:{UID}", "--config.workingdir", "/", "--config.stopsignal", "SIGTERM"]
        for e in env:
            cmd += ["--config.env", e]
        for port in ("8000/tcp", "8001/tcp", "8002/tcp"):
            cmd += ["--config.exposedports", port]
        for k, v in labels.items():
            cmd += ["--config.label", f"{k}={v}"]
        run(cmd)
        per_arch.append((arch_tag, platform))
        report.append((platform, sizes(layout, arch_tag), unpacked))
    index(layout, tag, per_arch)
    run(["umoci", "gc", "--layout", layout])
    kind = "multi-architecture index" if len(per_arch) > 1 else "index"
    archive = os.path.join(a.out, f"tern-{tag}.oci.tar")
    if os.path.exists(archive):
        os.remove(archive)
    if a.no_archive:
        print(f"image tern:{tag} in {layout} ({kind})")
    else:
        run(["skopeo", "copy", "--all", f"oci:{layout}:{tag}", f"oci-archive:{archive}:tern:{tag}"])
        print(f"image tern:{tag} in {layout} ({kind}) and {archive} ({os.path.getsize(archive) / 1e6:.1f} MB)")
    for platform, compressed, unpacked in report:
        print(f"  linux/{platform}: {compressed / 1e6:.1f} MB compressed, {unpacked / 1e6:.1f} MB unpacked")


if __name__ == "__main__":
    main()
