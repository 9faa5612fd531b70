#!/usr/bin/env python3
"""Footprint of a release artifact: cold start to READY and idle RSS, for
an empty repository (the baseline, measured in the same run), one small ONNX
model, and the packaged example repository (ONNX + two Rust plugins) with a
cold and then a warm .cwasm cache; plus the sizes of the files in dist/.

    make dist && python tests/bench/footprint.py dist/tern-<v>-x86_64-linux-gnu.tar.gz
    make images && python tests/bench/footprint.py --image dist/oci:<v>-cpu-amd64 --image dist/oci-cuda:<v>-cuda-amd64

With --image (an OCI layout and a manifest tag; needs root and umoci), the
containerised server instead: the image unpacked with umoci and its entrypoint
run the way a container runtime would (chroot into the root filesystem as the
image's user, the image's command and environment) on the repository the image
ships, with a fresh (cold) and then a warm plugin cache, and on an empty
repository as the baseline.

Start time is from exec to the first 200 from /v2/health/ready (polled every
2 ms); RSS is VmRSS one second after READY. Each figure is the median of
--runs starts. Results go in docs/PERFORMANCE.md.
"""

import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import tarfile
import tempfile
import time

from http_load import free_port, rss_kib


def ready_after(proc, port, started, timeout=60):
    while time.perf_counter() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"tern exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return time.perf_counter() - started
        except OSError:
            pass
        time.sleep(0.002)
    raise RuntimeError("not ready in time")


def start(binary, repo, cache, wrapper=(), env=None):
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*wrapper, binary, f"--model-repository={repo}", f"--http-port={port}", "--grpc-port=0", "--metrics-port=0",
         f"--wasm-cache-dir={cache}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    try:
        secs = ready_after(proc, port, t0)
        time.sleep(1)
        rss = rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    return secs, rss


def images(specs, runs):
    """Start to READY and idle RSS of each image's entrypoint, run from its unpacked root."""
    print("| image | repository | start to READY (ms) | idle RSS (MiB) |")
    print("|---|---|---:|---:|")
    for spec in specs:
        work = tempfile.mkdtemp(prefix="tern-footprint-image-")
        bundle = os.path.join(work, "bundle")
        subprocess.run(["umoci", "unpack", "--image", spec, bundle], check=True, capture_output=True)
        process = json.load(open(os.path.join(bundle, "config.json")))["process"]
        rootfs = os.path.join(bundle, "rootfs")
        env = dict(e.split("=", 1) for e in process["env"])
        user = f"{process['user']['uid']}:{process['user']['gid']}"
        wrapper = ["chroot", f"--userspec={user}", rootfs]
        os.makedirs(os.path.join(rootfs, "empty"))
        cache = "/tmp/cache"  # the cold runs leave it filled for the warm ones
        os.makedirs(rootfs + cache)
        os.chown(rootfs + cache, process["user"]["uid"], process["user"]["gid"])
        cases = [("empty (baseline)", "/empty", True),
                 ("shipped, cold plugin cache", "/models", False),
                 ("shipped, warm plugin cache", "/models", True)]
        for label, repo, warm in cases:
            results = []
            for _ in range(runs):
                if not warm:
                    for f in glob.glob(rootfs + cache + "/*"):
                        os.remove(f)
                results.append(start(process["args"][0], repo, cache, wrapper, env))
            secs = statistics.median(r[0] for r in results)
            rss = statistics.median(r[1] for r in results)
            print(f"| {spec.split(':', 1)[1]} | {label} | {secs * 1000:.0f} | {rss / 1024:.1f} |")
        shutil.rmtree(work)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tarball", nargs="?")
    ap.add_argument("--image", action="append", help="LAYOUT:TAG of one architecture's manifest")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    if a.image:
        return images(a.image, a.runs)
    if not a.tarball:
        ap.error("a tarball or --image")
    work = tempfile.mkdtemp(prefix="tern-footprint-")
    with tarfile.open(a.tarball) as t:
        t.extractall(work)
    top = glob.glob(os.path.join(work, "*"))[0]
    binary = os.path.join(top, "bin", "tern")
    example = os.path.join(top, "share", "tern", "model_repository")
    empty = os.path.join(work, "empty")
    os.makedirs(empty)
    cases = [("empty repository (baseline)", empty, True)]
    if os.path.isdir(os.path.join(example, "simple")):  # not in the plugins-only (musl) build
        small = os.path.join(work, "small")
        shutil.copytree(os.path.join(example, "simple"), os.path.join(small, "simple"))
        cases.append(("one small ONNX model", small, True))
    cases += [
        ("example repository, cold .cwasm cache", example, False),
        ("example repository, warm .cwasm cache", example, True),
    ]
    rows = []
    for label, repo, warm in cases:
        results = []
        cache = os.path.join(work, "cache")
        for _ in range(a.runs):
            if not warm:
                shutil.rmtree(cache, ignore_errors=True)
            results.append(start(binary, repo, cache))
        secs = statistics.median(r[0] for r in results)
        rss = statistics.median(r[1] for r in results)
        rows.append((label, secs * 1000, rss / 1024))
    print(f"binary: {binary} ({os.path.getsize(binary) / 1e6:.1f} MB)")
    print("| repository | start to READY (ms) | idle RSS (MiB) |")
    print("|---|---:|---:|")
    for label, ms, mib in rows:
        print(f"| {label} | {ms:.0f} | {mib:.1f} |")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
