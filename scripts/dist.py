#!/usr/bin/env python3
"""Release artifacts for one target: the binary cross-built with cargo-zigbuild
(glibc 2.31 for the gnu flavour, fully static for musl), a tarball with ONNX
Runtime for that architecture (from the `onnxruntime` PyPI wheel), the
licences of everything bundled, the systemd unit and an example repository,
and for gnu a Debian package. `make dist` runs it for every target.

The Python runner (`backend: "python"`, ~39 MB of WebAssembly with CPython and
its standard library) is an add-on, not in those: one architecture-independent
tarball, `tern-python-runner-<version>.tar.gz`, unpacked into an unpacked Tern
tarball (it holds `lib/tern/python-runner.wasm`, where the binary looks), and
for gnu a `tern-python-runner_<version>_all.deb` that puts it in
/usr/lib/tern. `--no-python-runner` leaves it out.

    dist.py --arch aarch64 --flavour gnu --profile dist --out dist
"""

import argparse
import glob
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLIBC = "2.31"  # JetPack 5 (Ubuntu 20.04); JetPack 6 and newer systems have a later one.
ORT_VERSION = "1.31.1"
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
EXAMPLE_MODELS = ["simple", "add_sub", "simple_identity"]


def run(cmd, **kw):
    # Commands are echoed on stderr: stdout carries the paths --build-only and
    # --onnxruntime-only print for the Makefile.
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


def version():
    meta = json.loads(
        subprocess.check_output(["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=ROOT)
    )
    return next(p["version"] for p in meta["packages"] if p["name"] == "tern")


def triple(arch, flavour):
    return f"{arch}-unknown-linux-{flavour}"


def build(arch, flavour, profile, features=None):
    """Cross-builds the binary; the gnu flavour links against glibc <= GLIBC."""
    t = triple(arch, flavour)
    target = f"{t}.{GLIBC}" if flavour == "gnu" else t
    cmd = ["cargo", "zigbuild", "-p", "tern", "--bin", "tern", "--profile", profile, "--target", target]
    if flavour == "musl":
        cmd.append("--no-default-features")
    if features:
        cmd += ["--features", features]
    run(cmd, cwd=ROOT)
    out_dir = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(out_dir, t, "debug" if profile == "dev" else profile, "tern")


def readelf(binary, flag):
    return subprocess.check_output(["readelf", flag, "--wide", binary], text=True)


def check_binary(binary, flavour):
    """The gnu binary needs no glibc symbol newer than GLIBC; the musl one needs no library at all."""
    if flavour == "gnu":
        versions = set(re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", readelf(binary, "-V")))
        newest = max(versions, key=lambda v: tuple(int(x) for x in v.split(".")))
        if tuple(int(x) for x in newest.split(".")) > tuple(int(x) for x in GLIBC.split(".")):
            sys.exit(f"{binary} needs GLIBC_{newest}, newer than {GLIBC}")
        print(f"{binary}: newest glibc symbol version GLIBC_{newest} (<= {GLIBC})")
    else:
        dynamic = readelf(binary, "-d")
        if "NEEDED" in dynamic:
            sys.exit(f"{binary} is not static:\n{dynamic}")
        print(f"{binary}: static, no shared libraries needed")


# ONNX Runtime's PyPI wheels carry libonnxruntime.so from 1.19 on (before, the
# runtime is linked into the Python module); the npm package onnxruntime-node
# carries it for older versions, for linux x64 and arm64.
NPM_ARCH = {"x86_64": "x64", "aarch64": "arm64"}


def onnxruntime(arch, cache, version=ORT_VERSION):
    """libonnxruntime.so and its licence files for `arch` at `version`: from the
    PyPI wheel, or (versions before 1.19) from the onnxruntime-node npm package."""
    suffix = "" if version == ORT_VERSION else f"-{version}"
    out = os.path.join(cache, f"onnxruntime-{arch}{suffix}")
    if os.path.exists(os.path.join(out, "libonnxruntime.so")):
        return out
    os.makedirs(out, exist_ok=True)
    if tuple(int(p) for p in version.split(".")[:2]) < (1, 19):
        return onnxruntime_npm(arch, cache, version, out)
    wheels = os.path.join(cache, "wheels")
    pattern = os.path.join(wheels, f"onnxruntime-{version}-*_{arch}.whl")
    if not glob.glob(pattern):
        platforms = [a for p in ("manylinux_2_28", "manylinux_2_27", "manylinux_2_17", "manylinux2014")
                     for a in ("--platform", f"{p}_{arch}")]
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             *platforms, "--python-version", "3.11", f"onnxruntime=={version}", "-d", wheels])
    with zipfile.ZipFile(glob.glob(pattern)[0]) as z:
        for name in z.namelist():
            base = os.path.basename(name)
            if name == f"onnxruntime/capi/libonnxruntime.so.{version}":
                target = "libonnxruntime.so"
            elif name in ("onnxruntime/LICENSE", "onnxruntime/ThirdPartyNotices.txt"):
                target = base
            else:
                continue
            with z.open(name) as src, open(os.path.join(out, target), "wb") as dst:
                shutil.copyfileobj(src, dst)
    return out


def onnxruntime_npm(arch, cache, version, out):
    """libonnxruntime.so from the onnxruntime-node npm package (`npm pack`)."""
    packs = os.path.join(cache, "npm")
    tgz = os.path.join(packs, f"onnxruntime-node-{version}.tgz")
    if not os.path.exists(tgz):
        os.makedirs(packs, exist_ok=True)
        run(["npm", "pack", "--silent", f"onnxruntime-node@{version}", "--pack-destination", packs],
            stdout=subprocess.DEVNULL)
    want = {f"package/bin/napi-v3/linux/{NPM_ARCH[arch]}/libonnxruntime.so.{version}": "libonnxruntime.so"}
    with tarfile.open(tgz) as t:
        for m in t.getmembers():
            if m.name in want:
                with t.extractfile(m) as src, open(os.path.join(out, want[m.name]), "wb") as dst:
                    shutil.copyfileobj(src, dst)
    if not os.path.exists(os.path.join(out, "libonnxruntime.so")):
        sys.exit(f"onnxruntime-node {version} has no libonnxruntime.so for linux/{NPM_ARCH[arch]}")
    return out


def rust_licences(arch, flavour, path):
    """Every crate linked into the binary, its licence, and its licence files."""
    t = triple(arch, flavour)
    cmd = ["cargo", "tree", "-p", "tern", "-e", "normal,build", "--target", t, "--prefix", "none",
           "--format", "{p}\t{l}"]
    if flavour == "musl":
        cmd.append("--no-default-features")
    lines = sorted(set(subprocess.check_output(cmd, cwd=ROOT, text=True).splitlines()))
    registry = glob.glob(os.path.expanduser("~/.cargo/registry/src/*/"))
    with open(path, "w") as out:
        out.write("Rust crates compiled into this binary, with their licences.\n\n")
        for line in lines:
            if "\t" not in line or line.endswith("(*)"):
                continue
            pkg, licence = line.split("\t", 1)
            name, ver = pkg.split()[:2]
            out.write(f"{'=' * 72}\n{name} {ver}: {licence or 'see the crate'}\n")
            if "(" in pkg:  # a path dependency: Tern's own crates
                continue
            for reg in registry:
                src = os.path.join(reg, f"{name}-{ver.lstrip('v')}")
                files = sorted(glob.glob(os.path.join(src, "LICEN[CS]E*")) + glob.glob(os.path.join(src, "COPYING*"))
                               + glob.glob(os.path.join(src, "NOTICE*")))
                for f in files:
                    if os.path.isfile(f):
                        out.write(f"--- {os.path.basename(f)}\n")
                        out.write(open(f, errors="replace").read().strip() + "\n")
                if files:
                    break


def example_repository(dest, wasm_dir, onnx=True):
    for m in EXAMPLE_MODELS if onnx else [m for m in EXAMPLE_MODELS if m != "simple"]:
        src = os.path.join(ROOT, "model_repository", m)
        shutil.copytree(src, os.path.join(dest, m), ignore=shutil.ignore_patterns(".gitkeep"))
        if not os.path.exists(os.path.join(dest, m, "1")):
            os.makedirs(os.path.join(dest, m, "1"))
    wasm = os.path.join(wasm_dir, "add_sub.wasm")
    shutil.copy(wasm, os.path.join(dest, "add_sub", "1", "model.wasm"))


def tarball(name, stage, out):
    path = os.path.join(out, f"{name}.tar.gz")
    with tarfile.open(path, "w:gz", compresslevel=9) as tar:
        tar.add(stage, arcname=name, filter=lambda ti: (setattr(ti, "uname", "root"), setattr(ti, "gname", "root"), ti)[2])
    return path


def deb(arch, ver, binary, ort, licences, wasm_dir, out, work):
    """The Debian package: /usr/bin/tern, ONNX Runtime under /usr/lib/tern/, the service, /etc/default/tern."""
    root = os.path.join(work, "deb")
    shutil.rmtree(root, ignore_errors=True)
    def put(src, rel, mode=0o644):
        dst = os.path.join(root, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy(src, dst)
        os.chmod(dst, mode)
    put(binary, "usr/bin/tern", 0o755)
    put(os.path.join(ort, "libonnxruntime.so"), "usr/lib/tern/libonnxruntime.so")
    put(os.path.join(ROOT, "packaging", "tern.service"), "usr/lib/systemd/system/tern.service")
    put(os.path.join(ROOT, "packaging", "default"), "etc/default/tern")
    doc = os.path.join(root, "usr/share/doc/tern")
    os.makedirs(doc)
    with open(os.path.join(doc, "copyright"), "w") as f:
        f.write(debian_copyright(ort))
    put(licences, "usr/share/doc/tern/rust-crates.txt")
    put(os.path.join(ort, "ThirdPartyNotices.txt"), "usr/share/doc/tern/onnxruntime-ThirdPartyNotices.txt")
    put(os.path.join(ROOT, "packaging", "debian", "lintian-overrides"), "usr/share/lintian/overrides/tern")
    with gzip.GzipFile(os.path.join(doc, "changelog.gz"), "wb", mtime=0) as f:
        f.write(f"tern ({ver}) stable; urgency=medium\n\n  * Release {ver}.\n\n"
                f" -- Tern maintainers <maintainers@tern.invalid>  Tue, 24 Nov 2026 00:00:00 +0000\n".encode())
    example_repository(os.path.join(root, "usr/share/tern/examples/model_repository"), wasm_dir)
    os.makedirs(os.path.join(root, "var/lib/tern/models"))
    control = os.path.join(root, "DEBIAN")
    os.makedirs(control)
    size_kb = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs) // 1024
    with open(os.path.join(control, "control"), "w") as f:
        f.write(f"""Package: tern
Version: {ver}
Architecture: {DEB_ARCH[arch]}
Maintainer: Tern maintainers <maintainers@tern.invalid>
Installed-Size: {size_kb}
Depends: libc6 (>= {GLIBC}), libstdc++6, adduser
Section: net
Priority: optional
Homepage: https://github.com/tern-inference/tern
Description: Triton-compatible inference server with WebAssembly plugins
 Tern speaks NVIDIA Triton Inference Server's KServe v2 protocol over HTTP
 and gRPC, reads Triton model repositories unchanged, serves ONNX models
 through ONNX Runtime and runs pre/post-processing as sandboxed WebAssembly
 components. Models go in /var/lib/tern/models; settings in /etc/default/tern.
""")
    with open(os.path.join(control, "conffiles"), "w") as f:
        f.write("/etc/default/tern\n")
    for script in ("postinst", "postrm"):
        put(os.path.join(ROOT, "packaging", "debian", script), f"DEBIAN/{script}", 0o755)
    path = os.path.join(out, f"tern_{ver}_{DEB_ARCH[arch]}.deb")
    run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", root, path])
    return path


def python_runner(wasm_dir):
    path = os.path.join(wasm_dir, "python-runner.wasm")
    if not os.path.isfile(path):
        sys.exit(f"{path} is missing: run `make python-runner` first (or pass --no-python-runner)")
    return path


def python_runner_licences(dest):
    """The licences of what the runner bundles: CPython and its standard
    library (PSF), componentize-py's runtime (Apache-2.0), Tern's SDK."""
    os.makedirs(dest, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "LICENSE"), os.path.join(dest, "tern-LICENSE"))
    import sysconfig
    cpython = os.path.join(sysconfig.get_paths()["stdlib"], "LICENSE.txt")
    if not os.path.isfile(cpython):
        sys.exit(f"CPython's licence text is not at {cpython}")
    shutil.copy(cpython, os.path.join(dest, "cpython-LICENSE.txt"))
    venv_site = glob.glob(os.path.join(ROOT, ".venv", "lib", "python3*", "site-packages", "componentize_py-*.dist-info"))
    found = [os.path.join(d, "licenses", "LICENSE") for d in venv_site if os.path.isfile(os.path.join(d, "licenses", "LICENSE"))]
    if not found:
        sys.exit("componentize-py's licence is not in .venv: run `make setup`")
    shutil.copy(found[0], os.path.join(dest, "componentize-py-LICENSE"))
    return dest


def python_runner_addon(ver, wasm_dir, out, work, make_deb):
    """The add-on tarball (`lib/tern/python-runner.wasm` and its licences,
    to unpack into an unpacked Tern tarball) and, with `make_deb`, its .deb."""
    runner = python_runner(wasm_dir)
    stage = os.path.join(work, "python-runner")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(os.path.join(stage, "lib", "tern"))
    shutil.copy(runner, os.path.join(stage, "lib", "tern", "python-runner.wasm"))
    python_runner_licences(os.path.join(stage, "LICENSES", "python-runner"))
    path = os.path.join(out, f"tern-python-runner-{ver}.tar.gz")
    with tarfile.open(path, "w:gz", compresslevel=9) as tar:
        for entry in ("lib", "LICENSES"):
            tar.add(os.path.join(stage, entry), arcname=entry,
                    filter=lambda ti: (setattr(ti, "uname", "root"), setattr(ti, "gname", "root"), ti)[2])
    made = [path]
    if make_deb:
        root = os.path.join(work, "deb-python-runner")
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(os.path.join(root, "usr/lib/tern"))
        shutil.copy(runner, os.path.join(root, "usr/lib/tern/python-runner.wasm"))
        os.chmod(os.path.join(root, "usr/lib/tern/python-runner.wasm"), 0o644)
        doc = os.path.join(root, "usr/share/doc/tern-python-runner")
        os.makedirs(doc)
        licences = python_runner_licences(os.path.join(work, "python-runner-licences"))
        psf = "".join(f" {l}\n" if l.strip() else " .\n"
                      for l in open(os.path.join(licences, "cpython-LICENSE.txt")).read().splitlines())
        with open(os.path.join(doc, "copyright"), "w") as f:
            f.write("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
                    "Upstream-Name: tern\n\n"
                    "Files: *\nCopyright: Tern authors\nLicense: Apache-2.0\n\n"
                    "Files: usr/lib/tern/python-runner.wasm\n"
                    "Copyright: Tern authors; Fermyon, Inc. and contributors (componentize-py);\n"
                    " Python Software Foundation (CPython and its standard library)\n"
                    "License: Apache-2.0 and PSF-2.0\n"
                    "Comment: a WebAssembly component built with componentize-py, embedding CPython\n"
                    " and its standard library.\n\n"
                    "License: Apache-2.0\n On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.\n\n"
                    "License: PSF-2.0\n" + psf)
        with gzip.GzipFile(os.path.join(doc, "changelog.gz"), "wb", mtime=0) as f:
            f.write(f"tern-python-runner ({ver}) stable; urgency=medium\n\n  * Release {ver}.\n\n"
                    f" -- Tern maintainers <maintainers@tern.invalid>  Tue, 24 Nov 2026 00:00:00 +0000\n".encode())
        control = os.path.join(root, "DEBIAN")
        os.makedirs(control)
        size_kb = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs) // 1024
        with open(os.path.join(control, "control"), "w") as f:
            f.write(f"""Package: tern-python-runner
Version: {ver}
Architecture: all
Maintainer: Tern maintainers <maintainers@tern.invalid>
Installed-Size: {size_kb}
Depends: tern (= {ver})
Section: net
Priority: optional
Homepage: https://github.com/tern-inference/tern
Description: Python runner for the Tern inference server
 Lets Tern serve Triton Python-backend models (backend: "python",
 <version>/model.py) as they are: CPython and its standard library compiled
 to one WebAssembly component, with triton_python_backend_utils and a numpy
 subset, run in Tern's sandbox instead of a stub process per model.
""")
        deb_path = os.path.join(out, f"tern-python-runner_{ver}_all.deb")
        run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", root, deb_path])
        made.append(deb_path)
    return made


def debian_copyright(ort):
    """Tern's licence, ONNX Runtime's; the crates' licence texts and ORT's
    third-party notices are files beside it (named here)."""
    mit = "".join(f" {l}\n" if l.strip() else " .\n" for l in open(os.path.join(ort, "LICENSE")).read().splitlines())
    return (
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        "Upstream-Name: tern\n\n"
        "Files: *\nCopyright: Tern authors\nLicense: Apache-2.0\n"
        "Comment: The Rust crates compiled into /usr/bin/tern and their licence texts are listed in\n"
        " /usr/share/doc/tern/rust-crates.txt.\n\n"
        "Files: usr/lib/tern/libonnxruntime.so\nCopyright: Microsoft Corporation\nLicense: MIT\n"
        "Comment: ONNX Runtime's third-party notices are in\n"
        " /usr/share/doc/tern/onnxruntime-ThirdPartyNotices.txt.\n\n"
        "License: Apache-2.0\n On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.\n\n"
        "License: MIT\n" + mit
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["x86_64", "aarch64"], required=True)
    ap.add_argument("--flavour", choices=["gnu", "musl"], default="gnu")
    ap.add_argument("--profile", default=None,
                    help="cargo profile (default: dist for gnu, dist-static for musl)")
    ap.add_argument("--out", default=os.path.join(ROOT, "dist"))
    ap.add_argument("--wasm-dir", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")),
                                                       "wasm32-wasip2", "release"))
    ap.add_argument("--features", help="cargo features added to the flavour's (e.g. cross-compile for musl)")
    ap.add_argument("--no-deb", action="store_true")
    ap.add_argument("--no-python-runner", action="store_true",
                    help="do not package the Python runner add-on")
    ap.add_argument("--build-only", action="store_true",
                    help="build and check the binary, print its path; no packages")
    ap.add_argument("--binary", metavar="PATH",
                    help="package this already built binary for --arch (the gnu flavour; CI's image "
                         "check packages the debug build) instead of cross-building one; it is "
                         "stripped into the package and its glibc needs are not checked")
    ap.add_argument("--onnxruntime-only", action="store_true",
                    help="fetch ONNX Runtime for --arch and print the library's path")
    ap.add_argument("--onnxruntime-version", default=ORT_VERSION,
                    help="with --onnxruntime-only: this ONNX Runtime version (1.17 or newer)")
    a = ap.parse_args()
    if a.onnxruntime_only:
        cache = os.path.join(ROOT, ".cache", "dist")
        print(os.path.join(onnxruntime(a.arch, cache, a.onnxruntime_version), "libonnxruntime.so"))
        return
    ver = version()
    cache = os.path.join(ROOT, ".cache", "dist")
    work = os.path.join(cache, f"work-{a.arch}-{a.flavour}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    if a.binary:
        if a.flavour != "gnu" or a.build_only:
            sys.exit("--binary packages a gnu build and builds nothing")
        if a.arch != os.uname().machine:
            sys.exit(f"--binary packages a binary of this machine ({os.uname().machine}), not {a.arch}")
        binary = os.path.join(work, "tern")
        os.makedirs(work, exist_ok=True)
        run(["strip", "-o", binary, a.binary])
        print(f"{a.binary}: packaged as it is (glibc symbol versions not checked)")
    else:
        profile = a.profile or ("dist-static" if a.flavour == "musl" else "dist")
        binary = build(a.arch, a.flavour, profile, a.features)
        check_binary(binary, a.flavour)
    if a.build_only:
        print(binary)
        return
    name = f"tern-{ver}-{triple(a.arch, a.flavour).replace('-unknown', '')}"
    stage = os.path.join(work, name)
    os.makedirs(os.path.join(stage, "bin"))
    shutil.copy(binary, os.path.join(stage, "bin", "tern"))
    licences_dir = os.path.join(stage, "LICENSES")
    os.makedirs(licences_dir)
    shutil.copy(os.path.join(ROOT, "LICENSE"), os.path.join(licences_dir, "tern-LICENSE"))
    rust_licences(a.arch, a.flavour, os.path.join(licences_dir, "rust-crates.txt"))
    ort = None
    if a.flavour == "gnu":
        ort = onnxruntime(a.arch, cache)
        os.makedirs(os.path.join(stage, "lib"))
        shutil.copy(os.path.join(ort, "libonnxruntime.so"), os.path.join(stage, "lib"))
        for f in ("LICENSE", "ThirdPartyNotices.txt"):
            shutil.copy(os.path.join(ort, f), os.path.join(licences_dir, f"onnxruntime-{f}"))
    share = os.path.join(stage, "share", "tern")
    os.makedirs(share)
    shutil.copy(os.path.join(ROOT, "packaging", "tern.service"), share)
    shutil.copy(os.path.join(ROOT, "packaging", "default"), os.path.join(share, "tern.default"))
    example_repository(os.path.join(share, "model_repository"), a.wasm_dir, onnx=a.flavour == "gnu")
    made = [tarball(name, stage, a.out)]
    if a.flavour == "gnu" and not a.no_deb:
        made.append(deb(a.arch, ver, binary, ort, os.path.join(licences_dir, "rust-crates.txt"),
                        a.wasm_dir, a.out, work))
    if not a.no_python_runner:
        made += python_runner_addon(ver, a.wasm_dir, a.out, work, a.flavour == "gnu" and not a.no_deb)
    for p in [binary] + made:
        print(f"{os.path.getsize(p) / 1e6:8.1f} MB  {p}")


if __name__ == "__main__":
    main()
