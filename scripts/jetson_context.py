#!/usr/bin/env python3
"""The build context of the Jetson image (images/jetson/Containerfile): the
aarch64 gnu release tarball's binary, licences and example repository, its
plugins precompiled for aarch64 by the x86 host's `tern plugin compile` (both
memory layouts, so a Jetson whose kernel cannot reserve the pooling allocator
loads them as well as one that can), and the recipe itself.

    jetson_context.py --tarball tern-0.1.0-aarch64-linux-gnu.tar.gz --tern-host target/debug/tern --out DIR

DIR is replaced. Its layout (the Containerfile's COPY sources):

    Containerfile, README.md, *.sh   images/jetson/
    bin/tern                         the aarch64 binary
    licenses/                        Tern's and its crates' licences (ONNX Runtime's come with the ONNX Runtime built in the image)
    models/                          the example repository
    cwasm/                           its plugins, precompiled for aarch64 (pooling and on-demand)
    cwasm.key                        the key those entries are sealed with (the server loads no entry it cannot verify)
    ort-prebuilt/                    empty unless --ort-prebuilt: for ORT_SOURCE=prebuilt (the default), it
                                     wins over the JetPack's published build the image takes otherwise

The output is deterministic: the same inputs give the same bytes, names,
modes and modification times (SOURCE_DATE_EPOCH, else the tarball's binary's),
except cwasm.key, a fresh random key for each context, and the cwasm/*.seal
files, each entry's digest under that key.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "images", "jetson")
TARGET = "aarch64-unknown-linux-gnu"
TARBALL_NAME = re.compile(r"tern-(?P<version>[^-]+)-aarch64-linux-gnu\.tar\.gz$")


def fail(msg):
    sys.exit(f"jetson_context.py: {msg}")


def unpack(tarball, dest):
    """The tarball's single top folder, unpacked into dest; refuses members outside it."""
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        tops = {n.split("/", 1)[0] for n in names}
        if len(tops) != 1:
            fail(f"{tarball}: expected one top folder, found {sorted(tops)}")
        for m in tar.getmembers():
            if m.name.startswith("/") or ".." in m.name.split("/") or not (m.isfile() or m.isdir()):
                fail(f"{tarball}: unexpected member {m.name!r}")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)
    return os.path.join(dest, tops.pop())


def compile_plugins(tern_host, models, cache):
    """Precompiles every plugin of `models` for aarch64 in both memory layouts."""
    counts = []
    for layout in ([], ["--on-demand"]):
        cmd = [tern_host, "plugin", "compile", models, f"--target={TARGET}", f"--cache-dir={cache}", *layout]
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"`{' '.join(cmd)}` failed:\n{out.stderr}")
        m = re.search(r"(\d+) plugin\(s\) compiled for " + re.escape(TARGET), out.stderr)
        if not m:
            fail(f"`{' '.join(cmd)}` did not report what it compiled:\n{out.stderr}")
        counts.append(int(m.group(1)))
    return counts


def normalise(top, mtime):
    """Fixed modes (0755 for programs and folders, 0644 for the rest) and times."""
    for d, dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            executable = f.endswith(".sh") or os.path.relpath(p, top) == os.path.join("bin", "tern")
            os.chmod(p, 0o755 if executable else 0o644)
            os.utime(p, (mtime, mtime))
        os.chmod(d, 0o755)
    for d, dirs, _ in sorted(os.walk(top), reverse=True):
        os.utime(d, (mtime, mtime))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tarball", required=True, help="tern-<version>-aarch64-linux-gnu.tar.gz (make dist or make package-check)")
    ap.add_argument("--tern-host", required=True, help="a tern binary for this machine, to precompile the plugins")
    ap.add_argument("--out", required=True, help="the context folder to write (replaced)")
    ap.add_argument("--ort-prebuilt", help="for ORT_SOURCE=prebuilt (the default): an onnxruntime-gpu wheel "
                    "(1.19 or newer: older wheels hold no libonnxruntime.so), or a folder with "
                    "libonnxruntime.so.<version> (>= 1.17) and its providers, copied into ort-prebuilt/; "
                    "without it the image takes the JetPack's published build (JetPack 6) or stops (JetPack 5)")
    a = ap.parse_args()

    if not os.path.isfile(a.tarball):
        fail(f"no tarball at {a.tarball}: run `make package-check` (cheap `cross` build) or `make dist`")
    m = TARBALL_NAME.search(os.path.basename(a.tarball))
    if not m:
        fail(f"{a.tarball} is not an aarch64 gnu tarball (tern-<version>-aarch64-linux-gnu.tar.gz): "
             "the Jetson image needs the glibc build, not musl or x86_64")
    version = m.group("version")
    if not (os.path.isfile(a.tern_host) and os.access(a.tern_host, os.X_OK)):
        fail(f"no tern binary at {a.tern_host}: build it with `cargo build -p tern` (it runs here to precompile plugins)")
    if not os.path.isfile(os.path.join(RECIPE, "Containerfile")):
        fail(f"no Containerfile in {RECIPE}")
    if a.ort_prebuilt and not os.path.exists(a.ort_prebuilt):
        fail(f"no ONNX Runtime at {a.ort_prebuilt}")
    out = os.path.abspath(a.out)
    if out in (ROOT, "/") or ROOT.startswith(out + os.sep):
        fail(f"refusing to replace {out}")

    with tempfile.TemporaryDirectory() as t:
        top = unpack(a.tarball, t)
        binary = os.path.join(top, "bin", "tern")
        models = os.path.join(top, "share", "tern", "model_repository")
        for need in (binary, models, os.path.join(top, "LICENSES")):
            if not os.path.exists(need):
                fail(f"{a.tarball} has no {os.path.relpath(need, t)}")
        mtime = int(os.environ.get("SOURCE_DATE_EPOCH", os.stat(binary).st_mtime))

        stage = out + ".tmp"
        shutil.rmtree(stage, ignore_errors=True)
        os.makedirs(os.path.join(stage, "bin"))
        shutil.copy(binary, os.path.join(stage, "bin", "tern"))
        # ONNX Runtime's licences are those of the ONNX Runtime built in the image, not the tarball's CPU build.
        shutil.copytree(os.path.join(top, "LICENSES"), os.path.join(stage, "licenses"),
                        ignore=shutil.ignore_patterns("onnxruntime-*"))
        shutil.copytree(models, os.path.join(stage, "models"))
        for f in sorted(os.listdir(RECIPE)):
            if f == "Containerfile" or f == "README.md" or f.endswith(".sh"):
                shutil.copy(os.path.join(RECIPE, f), os.path.join(stage, f))
        # The image's version label: the tarball's version.
        cf = os.path.join(stage, "Containerfile")
        text, n = re.subn(r"^ARG TERN_VERSION=.*$", f"ARG TERN_VERSION={version}", open(cf).read(), flags=re.M)
        if n != 1:
            fail("images/jetson/Containerfile has no `ARG TERN_VERSION=` line")
        open(cf, "w").write(text)

        cache = os.path.join(stage, "cwasm")
        os.makedirs(cache)
        counts = compile_plugins(a.tern_host, os.path.join(stage, "models"), cache)

        ort = os.path.join(stage, "ort-prebuilt")
        os.makedirs(ort)
        if a.ort_prebuilt:
            if os.path.isdir(a.ort_prebuilt):
                for f in sorted(os.listdir(a.ort_prebuilt)):
                    if f.startswith("libonnxruntime") or f in ("LICENSE", "ThirdPartyNotices.txt"):
                        shutil.copy(os.path.join(a.ort_prebuilt, f), ort, follow_symlinks=True)
            else:
                shutil.copy(a.ort_prebuilt, ort)
        else:
            # Keeps the folder in the context (an empty folder is not always carried by every tool).
            with open(os.path.join(ort, "README"), "w") as f:
                f.write("ORT_SOURCE=prebuilt (the default) takes ONNX Runtime >= 1.17 from here: an onnxruntime-gpu\n"
                        "wheel (1.19 or newer), or libonnxruntime.so.<version> with its libonnxruntime_providers_*.so.\n"
                        "With nothing here, it takes the JetPack's published build (JP<n>_ORT_WHEEL_URL).\n"
                        "See README.md (scripts/jetson_context.py --ort-prebuilt PATH).\n")
        normalise(stage, mtime)
        shutil.rmtree(out, ignore_errors=True)
        os.rename(stage, out)

    entries = sorted(os.listdir(os.path.join(out, "cwasm")))
    print(f"Jetson build context for tern {version} in {out}: bin/tern, models/ "
          f"({len(os.listdir(os.path.join(out, 'models')))} models), cwasm/ ({len(entries)} entries: "
          f"{counts[0]} plugin(s) x pooling and on-demand), Containerfile")
    print(f"build on a Jetson: podman build --build-arg JETPACK=6 -t tern:{version}-jetson {out}")


if __name__ == "__main__":
    main()
