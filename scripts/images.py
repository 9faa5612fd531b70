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

`images/cuda-manifest.json` records what the cuda image takes from the pinned
wheels: each file's path in the image, size and sha256, and for each library its
SONAME, DT_NEEDED, RUNPATH and the libraries it opens at run time. The full cuda
build (`make images`) fails when the manifest differs from what the wheels give;
`--write-manifest` rewrites it after a change of pins. `--from-manifest` (`make
image-check`) downloads nothing: it builds the same layout and config with the
real tarball and, for each file from the wheels, a placeholder at the manifest's
path (for a library, an ELF stub with the manifest's SONAME, DT_NEEDED and
RUNPATH; ONNX Runtime stays the tarball's CPU build of the same version, so the
image still serves), then checks the manifest against the pins and the image's
search path. Both cuda builds run the same check: every library the manifest
lists is placed, and every DT_NEEDED and run-time-opened library resolves inside
the image (but the host's driver and TensorRT, which the image leaves out).

`cpu` also gets a `-python` variant: the same image plus one layer with the
Python runner add-on (`tern-python-runner-<version>.tar.gz` from the
tarballs folder): /usr/lib/tern/python-runner.wasm and its licences, so
`backend: "python"` models load; the base image stays without it.

    images.py --tarballs dist --out dist                  # after make dist
    images.py --flavour cuda --tarballs dist --out dist   # verifies the manifest
    images.py --flavour cuda --from-manifest --tarballs .cache/package-check --out .cache/image-check --no-archive
"""

import argparse
import glob
import hashlib
import json
import mmap
import os
import shutil
import struct
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


# The manifest of what the cuda image takes from the wheels (see the top).
MANIFEST = os.path.join(ROOT, "images", "cuda-manifest.json")
# What a cuda image may link without shipping: the driver, which the NVIDIA
# container toolkit mounts from the host, and TensorRT (not on PyPI; see the top).
FROM_THE_HOST = {"libcuda.so.1"}
NOT_SHIPPED = {"libnvinfer.so.10", "libnvonnxparser.so.10"}
# Libraries opened at run time by name (dlopen), not through DT_NEEDED: for each
# library of the image, what it opens and the bytes in it that show it does (the
# name where the binary holds it whole, else an entry point it looks up there).
# The full build fails if a marker is gone, so a new wheel is looked at again.
RUNTIME_OPENED = {
    "libonnxruntime_providers_cuda.so": {"libcudnn.so.9": b"cudnnCreate", "libcufft.so.12": b"cufftCreate",
                                         "libnvrtc.so.13": b"libnvrtc.so.13"},
    "libcudnn.so.9": {f"libcudnn_{p}.so.9": f"libcudnn_{p}.so".encode() for p in ("graph", "ops", "cnn", "adv")},
    "libcudnn_graph.so.9": {f"libcudnn_{p}.so.9": f"libcudnn_{p}.so".encode()
                            for p in ("engines_precompiled", "engines_runtime_compiled", "heuristic")},
    "libcublasLt.so.13": {"libnvrtc.so.13": b"libnvrtc.so.13"},
    "libnvrtc.so.13": {"libnvrtc-builtins.so.13.0": b"libnvrtc-builtins.so.13.0"},
}
# The image's loader searches these after LD_LIBRARY_PATH and RUNPATH (Debian's
# glibc; the image has no ld.so.cache).
SYSTEM_DIRS = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib"]
# In a --from-manifest image ONNX Runtime is the tarball's CPU build, not a
# placeholder, so that the image's entrypoint still serves; it must be of the GPU
# build's version (the symbol version of its API, which the binary holds).
KEPT_FROM_THE_TARBALL = {"usr/lib/tern/libonnxruntime.so": f"VERS_{ORT_GPU.split('==')[1]}\0".encode()}
PLACEHOLDER = b"tern image placeholder"


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


def cuda_wanted():
    """The libraries the cuda image takes from the wheels: name in a wheel -> name in /usr/lib/tern."""
    return dict(ORT_GPU_LIBS, **{n: n for n in CUDA_LIBS})


def copy_hashed(src, path):
    h, size = hashlib.sha256(), 0
    with open(path, "wb") as out:
        while chunk := src.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def add_system_cuda_libs(dest):
    for lib in CUDA_EXTRA_LIBS:
        shutil.copy(os.path.realpath(os.path.join(LIB_SOURCE["x86_64"], lib)),
                    os.path.join(dest, LIB_DIR["x86_64"], lib))


def add_cuda(wheels, dest):
    """Puts ONNX Runtime's GPU build and the CUDA libraries into /usr/lib/tern;
    returns, for each wheel, the files taken from it (for the manifest)."""
    wanted = cuda_wanted()
    found = set()
    taken = {}
    for wheel in wheels:
        files = taken.setdefault(wheel, {})
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                name = os.path.basename(info.filename)
                if name.lower() in ("license.txt", "license", "thirdpartynotices.txt"):
                    # The NVIDIA wheels' licence (dist-info) and ORT GPU's own notices.
                    project = os.path.basename(wheel).split("-")[0]
                    target = f"onnxruntime-{name}" if project == "onnxruntime_gpu" else f"{project}-{name}"
                    rel = f"usr/share/licenses/tern/{target}"
                elif name in wanted and name not in found:
                    rel = f"usr/lib/tern/{wanted[name]}"
                    found.add(name)
                else:
                    continue
                with z.open(info) as src:
                    size, digest = copy_hashed(src, os.path.join(dest, rel))
                files[rel] = {"path": rel, "from": info.filename, "size": size, "sha256": digest}
    missing = sorted(set(wanted) - found)
    if missing:
        sys.exit(f"the CUDA wheels lack {', '.join(missing)}: check the pinned versions in {__file__}")
    add_system_cuda_libs(dest)
    return taken


# ELF, read and written with the standard library: only what the loader reads
# to find libraries (program headers, the dynamic segment and its strings).
DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 1, 5, 14, 15, 29
EM_X86_64 = 62


def elf_machine(path):
    """(ELF class, machine) of a file, or None if it is no ELF file."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return head[4], struct.unpack_from("<H" if head[5] == 1 else ">H", head, 18)[0]


def read_dynamic(path):
    """An ELF file's SONAME, DT_NEEDED, RUNPATH (and RPATH when set), as `readelf -d`
    shows them; None if the file is no ELF file."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 52 or head[:4] != b"\x7fELF":
            return None
        wide, e = head[4] == 2, "<" if head[5] == 1 else ">"
        if wide:
            phoff, phentsize, phnum = struct.unpack_from(e + "Q", head, 32)[0], *struct.unpack_from(e + "HH", head, 54)
        else:
            phoff, phentsize, phnum = struct.unpack_from(e + "I", head, 28)[0], *struct.unpack_from(e + "HH", head, 42)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        loads, dynamic = [], None
        for i in range(phnum):
            if wide:
                ptype, _, offset, vaddr, _, filesz = struct.unpack_from(e + "IIQQQQ", table, i * phentsize)
            else:
                ptype, offset, vaddr, _, filesz = struct.unpack_from(e + "IIIII", table, i * phentsize)
            if ptype == 1:
                loads.append((vaddr, offset, filesz))
            elif ptype == 2:
                dynamic = (offset, filesz)
        info = {"soname": None, "needed": [], "runpath": []}
        if dynamic is None:
            return info
        f.seek(dynamic[0])
        raw = f.read(dynamic[1])
        entry = struct.Struct(e + ("qQ" if wide else "iI"))
        tags = []
        for tag, value in entry.iter_unpack(raw[:len(raw) - len(raw) % entry.size]):
            if tag == 0:
                break
            tags.append((tag, value))
        strtab = next((v for t, v in tags if t == DT_STRTAB), None)
        strsz = next((v for t, v in tags if t == 10), 0)
        offset = next((o + strtab - v for v, o, n in loads if v <= strtab < v + n), None)
        if offset is None:
            raise ValueError(f"{path}: DT_STRTAB is outside every PT_LOAD")
        f.seek(offset)
        strings = f.read(strsz)

    def text(i):
        return strings[i:strings.index(b"\0", i)].decode()
    for tag, value in tags:
        if tag == DT_NEEDED:
            info["needed"].append(text(value))
        elif tag == DT_SONAME:
            info["soname"] = text(value)
        elif tag == DT_RUNPATH:
            info["runpath"] = text(value).split(":")
        elif tag == DT_RPATH:
            info["rpath"] = text(value).split(":")
    return info


def elf_stub(soname, needed, runpath, rpath, note):
    """A minimal x86-64 shared object that has only the dynamic section the
    manifest records (SONAME, DT_NEEDED, RUNPATH/RPATH) and `note` among its
    strings: readelf and the image's loader (ld.so --list) read it like the
    library it stands for, and nothing can run it."""
    strings = bytearray(b"\0")

    def add(s):
        strings.extend(s.encode() + b"\0")
        return len(strings) - len(s.encode()) - 1
    dyn = [(DT_NEEDED, add(n)) for n in needed]
    if soname is not None:
        dyn.append((DT_SONAME, add(soname)))
    if runpath:
        dyn.append((DT_RUNPATH, add(":".join(runpath))))
    if rpath:
        dyn.append((DT_RPATH, add(":".join(rpath))))
    add(note)
    phnum = 3
    symtab = 64 + 56 * phnum            # one null symbol
    hashtab = symtab + 24               # nbucket = nchain = 1, all empty
    dynamic = hashtab + 16
    dyn += [(4, hashtab), (6, symtab), (11, 24)]  # DT_HASH, DT_SYMTAB, DT_SYMENT
    strtab = dynamic + 16 * (len(dyn) + 3)
    dyn += [(DT_STRTAB, strtab), (10, len(strings)), (0, 0)]  # DT_STRSZ, DT_NULL
    size = strtab + len(strings)
    out = bytearray(b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8))
    out += struct.pack("<HHIQQQIHHHHHH", 3, EM_X86_64, 1, 0, 64, 0, 0, 64, 56, phnum, 64, 0, 0)
    out += struct.pack("<IIQQQQQQ", 1, 6, 0, 0, 0, size, size, 0x1000)                    # PT_LOAD, RW
    out += struct.pack("<IIQQQQQQ", 2, 6, dynamic, dynamic, dynamic, 16 * len(dyn), 16 * len(dyn), 8)  # PT_DYNAMIC
    out += struct.pack("<IIQQQQQQ", 0x6474E551, 6, 0, 0, 0, 0, 0, 16)                       # PT_GNU_STACK, not executable
    out += bytes(24) + struct.pack("<IIII", 1, 1, 0, 0)
    for tag, value in dyn:
        out += struct.pack("<qQ", tag, value)
    out += strings
    assert len(out) == size
    return bytes(out)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def cuda_manifest(wheels, taken, dest):
    """The manifest of a full cuda build: the pins, each wheel's file and digest,
    and the files taken from it, with each library's dynamic section and the
    libraries it opens at run time (RUNTIME_OPENED, each checked for its marker)."""
    pins = [ORT_GPU, *CUDA_WHEELS]
    out = {"about": "What the cuda image (scripts/images.py --flavour cuda) takes from the pinned wheels. "
                    "Written by `scripts/images.py --flavour cuda --write-manifest`; `make images` fails when it "
                    "differs from the wheels, `make image-check` builds the image from it without them.",
           "pins": pins, "wheels": []}
    for pin, wheel in zip(pins, wheels):
        files = []
        for rel, entry in sorted(taken[wheel].items()):
            entry = dict(entry)
            path = os.path.join(dest, rel)
            dyn = read_dynamic(path)
            if dyn is not None:
                entry.update(dyn)
                opens = RUNTIME_OPENED.get(os.path.basename(rel), {})
                if opens:
                    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                        gone = [f"{lib} ({marker.decode()})" for lib, marker in opens.items() if m.find(marker) < 0]
                    if gone:
                        sys.exit(f"{rel} from {os.path.basename(wheel)} no longer shows that it opens "
                                 f"{', '.join(gone)}: look at what it loads and update RUNTIME_OPENED in {__file__}")
                    entry["opens"] = sorted(opens)
            files.append(entry)
        out["wheels"].append({"pin": pin, "file": os.path.basename(wheel), "size": os.path.getsize(wheel),
                              "sha256": file_sha256(wheel), "files": files})
    return out


def manifest_text(manifest):
    return json.dumps(manifest, indent=1) + "\n"


def sync_manifest(manifest, path, write):
    """--write-manifest writes the manifest; otherwise the committed one must equal it."""
    text = manifest_text(manifest)
    old = open(path).read() if os.path.exists(path) else ""
    if write:
        with open(path, "w") as f:
            f.write(text)
        print(f"{os.path.relpath(path, ROOT)}: {'unchanged' if old == text else 'written'}", file=sys.stderr)
        return
    if old != text:
        import difflib
        diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), "committed", "from the wheels",
                                         lineterm="", n=1))
        sys.exit("\n".join(diff[:60] + (["..."] if len(diff) > 60 else [])) +
                 f"\n{os.path.relpath(path, ROOT)} does not match the pinned wheels: rerun with --write-manifest "
                 "and commit it (make image-check builds the cuda image from it)")


def add_cuda_placeholders(manifest, dest):
    """The cuda image's files without the wheels: at each path of the manifest a
    placeholder (an ELF stub for a library, a note for other files), except where
    the tarball already put the same file (ORT's licences) or ONNX Runtime
    (KEPT_FROM_THE_TARBALL); the system libraries as in the full build."""
    for wheel in manifest["wheels"]:
        for entry in wheel["files"]:
            if os.path.isabs(entry["path"]) or ".." in entry["path"].split("/"):
                sys.exit(f"{entry['path']}: a manifest path must be relative and stay inside the image")
            path = os.path.join(dest, entry["path"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if entry["path"] in KEPT_FROM_THE_TARBALL and os.path.exists(path):
                with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    if m.find(KEPT_FROM_THE_TARBALL[entry["path"]]) < 0:
                        sys.exit(f"the tarball's /{entry['path']} is not ONNX Runtime {ORT_GPU.split('==')[1]} "
                                 f"(no {KEPT_FROM_THE_TARBALL[entry['path']][:-1].decode()})")
                continue
            if os.path.exists(path) and file_sha256(path) == entry["sha256"]:
                continue
            note = (f"{PLACEHOLDER.decode()} for {entry['from']} of {wheel['file']} ({entry['size']} bytes, sha256 "
                    f"{entry['sha256']}): built from {os.path.relpath(MANIFEST, ROOT)}, not for use")
            with open(path, "wb") as f:
                if "needed" in entry:
                    f.write(elf_stub(entry["soname"], entry["needed"], entry["runpath"], entry.get("rpath"), note))
                else:
                    f.write(note.encode() + b"\n")
    add_system_cuda_libs(dest)


def load_manifest(path):
    if not os.path.exists(path):
        sys.exit(f"no {path}: `scripts/images.py --flavour cuda --write-manifest` (downloads the wheels) writes it")
    return json.load(open(path))


def pin_problems(manifest):
    pins = [ORT_GPU, *CUDA_WHEELS]
    if sorted(manifest["pins"]) != sorted(pins) or sorted(w["pin"] for w in manifest["wheels"]) != sorted(pins):
        return [f"the manifest is for {manifest['pins']}, scripts/images.py pins {pins}: "
                "`scripts/images.py --flavour cuda --write-manifest` (downloads the wheels) rewrites it"]
    return []


def check_cuda_image(fs, manifest, env):
    """The cuda image's layout against its manifest and scripts/images.py: the pins,
    the libraries, and the search path. Every ELF object in the image (the
    manifest's libraries with their recorded dynamic sections, the rest read from
    the files) must find each DT_NEEDED, and the manifest's libraries each library
    they open at run time, the way the image's loader looks: RPATH, LD_LIBRARY_PATH,
    RUNPATH (for DT_NEEDED and dlopen of the object itself), the system folders.
    Only FROM_THE_HOST and NOT_SHIPPED may be missing."""
    problems = pin_problems(manifest)
    entries = {f["path"]: f for w in manifest["wheels"] for f in w["files"]}
    libs = {os.path.basename(p) for p in entries if p.startswith("usr/lib/tern/")}
    if libs != set(cuda_wanted().values()):
        problems.append(f"the manifest's libraries differ from ORT_GPU_LIBS and CUDA_LIBS: only in the manifest "
                        f"{sorted(libs - set(cuda_wanted().values()))}, not in it {sorted(set(cuda_wanted().values()) - libs)}")
    for path, entry in entries.items():
        want = sorted(RUNTIME_OPENED.get(os.path.basename(path), {}))
        if entry.get("opens", []) != want and "needed" in entry:
            problems.append(f"{path} opens {entry.get('opens', [])} in the manifest, {want} in RUNTIME_OPENED")
        if not os.path.isfile(os.path.join(fs, path)):
            problems.append(f"{path} (from the manifest) is not in the image")
    ld_library_path = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    loader, loader_name = LOADER["x86_64"]

    def find(name, dirs):
        for d in dirs:
            p = os.path.join(fs, os.path.normpath(d).lstrip("/"), name)
            if os.path.isfile(p) and elf_machine(p) == (2, EM_X86_64):
                return p
        return None
    objects = {rel: entry for rel, entry in entries.items() if "needed" in entry}
    for top in ("usr/bin", "usr/lib/tern", LIB_DIR["x86_64"], os.path.dirname(loader)):
        for d, _, names in os.walk(os.path.join(fs, top)):
            for name in sorted(names):
                rel = os.path.relpath(os.path.join(d, name), fs)
                if rel not in objects and elf_machine(os.path.join(fs, rel)):
                    objects[rel] = read_dynamic(os.path.join(fs, rel))
    for rel, dyn in objects.items():
        origin = "/" + os.path.dirname(rel)
        expand = [p.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for p in dyn["runpath"]]
        rpath = [] if dyn["runpath"] else [p.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
                                           for p in dyn.get("rpath", [])]
        dirs = list(dict.fromkeys(os.path.normpath(d) for d in rpath + ld_library_path + expand + SYSTEM_DIRS))
        for name, how in [(n, "needs") for n in dyn["needed"]] + [(n, "opens") for n in dyn.get("opens", [])]:
            if name == loader_name and os.path.isfile(os.path.join(fs, loader)):
                continue
            if name in FROM_THE_HOST or name in NOT_SHIPPED:
                continue
            if find(name, dirs) is None:
                problems.append(f"/{rel} {how} {name}, which is nowhere in {':'.join(dirs)} of the image")
    if problems:
        sys.exit("the cuda image does not hold together:\n  " + "\n  ".join(problems))
    print(f"cuda image: {len(entries)} files of {len(manifest['wheels'])} wheels placed, "
          f"the DT_NEEDED and run-time opens of {len(objects)} ELF objects resolve in the image", file=sys.stderr)


def rootfs(arch, tarball, dest, add_cuda_files=None):
    """The image's files: /usr/bin/tern, /usr/lib/tern, libraries, a passwd, /models
    (and, through `add_cuda_files(dest)`, the cuda image's)."""
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
    if add_cuda_files:
        add_cuda_files(dest)
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


def image_config(flavour, version):
    """The OCI image config of a flavour (the `config` object), the same for a
    cuda image built from the wheels and one built from the manifest."""
    cuda = flavour == "cuda"
    labels = {
        "org.opencontainers.image.title": "tern",
        "org.opencontainers.image.description": FLAVOURS[flavour],
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": "Apache-2.0 AND MIT" + (" AND LicenseRef-NVIDIA-CUDA" if cuda else ""),
        "org.opencontainers.image.source": "https://github.com/tern-inference/tern",
        "org.opencontainers.image.documentation": "https://github.com/tern-inference/tern/blob/main/docs/deployment.md",
        "io.tern.health": "GET :8000/v2/health/ready (readiness), GET :8000/v2/health/live (liveness)",
    }
    env = ["TERN_WASM_CACHE_DIR=/var/cache/tern/wasm", "TERN_ONNXRUNTIME_LIBRARY=/usr/lib/tern/libonnxruntime.so"]
    if cuda:
        # ORT's providers have no RUNPATH; the NVIDIA container toolkit reads the
        # NVIDIA_* variables to mount the driver and the GPUs.
        env += ["LD_LIBRARY_PATH=/usr/lib/tern", "NVIDIA_VISIBLE_DEVICES=all",
                "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
    return {"User": f"{UID}:{UID}", "ExposedPorts": {p: {} for p in ("8000/tcp", "8001/tcp", "8002/tcp")},
            "Env": env, "Entrypoint": ["/usr/bin/tern"], "Cmd": ["--model-repository=/models"], "WorkingDir": "/",
            "Labels": labels, "StopSignal": "SIGTERM"}


def configure(layout, arch_tag, platform, config):
    """Writes `config` into the image with umoci, then reads it back."""
    cmd = ["umoci", "config", "--image", f"{layout}:{arch_tag}", "--architecture", platform, "--os", "linux",
           "--config.entrypoint", *config["Entrypoint"], "--config.cmd", *config["Cmd"],
           "--config.user", config["User"], "--config.workingdir", config["WorkingDir"],
           "--config.stopsignal", config["StopSignal"]]
    for e in config["Env"]:
        cmd += ["--config.env", e]
    for port in config["ExposedPorts"]:
        cmd += ["--config.exposedports", port]
    for k, v in config["Labels"].items():
        cmd += ["--config.label", f"{k}={v}"]
    run(cmd)
    idx = json.load(open(os.path.join(layout, "index.json")))
    m = next(m for m in idx["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == arch_tag)
    written = json.loads(read_blob(layout, json.loads(read_blob(layout, m["digest"]))["config"]["digest"]))
    if written["config"] != config or written["architecture"] != platform:
        sys.exit(f"umoci wrote the config {json.dumps(written['config'])}, not {json.dumps(config)}")


def python_layer(layout, arch_tag, runner_tarball, version):
    """Adds the tag `<arch_tag>`-python: the image `arch_tag` plus a layer with
    the Python runner add-on. Returns the tag and the layer's compressed size."""
    python_tag = arch_tag.replace("-cpu-", "-cpu-python-")
    with tempfile.TemporaryDirectory() as t:
        with tarfile.open(runner_tarball) as tar:
            tar.extractall(os.path.join(t, "addon"))
        usr = os.path.join(t, "usr")
        os.makedirs(os.path.join(usr, "lib", "tern"))
        shutil.copy(os.path.join(t, "addon", "lib", "tern", "python-runner.wasm"), os.path.join(usr, "lib", "tern"))
        shutil.copytree(os.path.join(t, "addon", "LICENSES", "python-runner"),
                        os.path.join(usr, "share", "licenses", "tern", "python-runner"))
        for d, _, files in os.walk(usr):
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        run(["umoci", "insert", "--image", f"{layout}:{arch_tag}", "--tag", python_tag, "--history.comment",
             f"tern {version}: the Python runner (backend \"python\")", usr, "/usr"])
    return python_tag, sizes(layout, python_tag) - sizes(layout, arch_tag)


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
    ap.add_argument("--manifest", default=MANIFEST, help="the cuda image's manifest (default: %(default)s)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write-manifest", action="store_true",
                      help="cuda: write the manifest from the wheels instead of failing when it differs")
    mode.add_argument("--from-manifest", action="store_true",
                      help="cuda: no wheels; placeholders at the manifest's paths, checked against it "
                           "(a layout to test, never to ship: implies --no-archive)")
    a = ap.parse_args()
    cuda = a.flavour == "cuda"
    if (a.write_manifest or a.from_manifest) and not cuda:
        sys.exit("--write-manifest and --from-manifest are for --flavour cuda")
    version = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=ROOT))["packages"]
    version = next(p["version"] for p in version if p["name"] == "tern")
    archs = a.arch or (list(PLATFORMS) if a.flavour == "cpu" else ["x86_64"])
    if cuda and archs != ["x86_64"]:
        sys.exit("the cuda image is amd64 only: for Jetson use images/jetson/")
    manifest = load_manifest(a.manifest) if a.from_manifest else None
    if manifest and pin_problems(manifest):
        sys.exit(pin_problems(manifest)[0])
    wheels = cuda_wheels(a.cuda_cache) if cuda and not a.from_manifest else None
    layout = os.path.join(a.out, "oci" if a.flavour == "cpu" else f"oci-{a.flavour}")
    shutil.rmtree(layout, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    run(["umoci", "init", "--layout", layout])
    tag = f"{version}-{a.flavour}"
    config = image_config(a.flavour, version)
    per_arch = []
    per_arch_python = []
    report = []
    runner = glob.glob(os.path.join(a.tarballs, f"tern-python-runner-{version}.tar.gz"))
    if a.flavour == "cpu" and not runner:
        sys.exit(f"no tern-python-runner-{version}.tar.gz in {a.tarballs}: run `make dist` (or dist.py) first")
    for arch in archs:
        platform = PLATFORMS[arch]
        tarballs = glob.glob(os.path.join(a.tarballs, f"tern-{version}-{arch}-linux-gnu.tar.gz"))
        if not tarballs:
            sys.exit(f"no tern-{version}-{arch}-linux-gnu.tar.gz in {a.tarballs}: run `make dist` (or dist.py) first")
        arch_tag = f"{tag}-{platform}"
        with tempfile.TemporaryDirectory() as t:
            fs = os.path.join(t, "rootfs")
            if a.from_manifest:
                rootfs(arch, tarballs[0], fs, lambda dest: add_cuda_placeholders(manifest, dest))
                what = f"placeholders for ONNX Runtime GPU and the CUDA runtime libraries ({os.path.relpath(a.manifest, ROOT)})"
            elif cuda:
                taken = {}
                rootfs(arch, tarballs[0], fs, lambda dest: taken.update(add_cuda(wheels, dest)))
                manifest = cuda_manifest(wheels, taken, fs)
                sync_manifest(manifest, a.manifest, a.write_manifest)
                what = "ONNX Runtime GPU, CUDA runtime libraries"
            else:
                rootfs(arch, tarballs[0], fs)
                what = "ONNX Runtime"
            if cuda:
                check_cuda_image(fs, manifest, dict(e.split("=", 1) for e in config["Env"]))
            unpacked = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs_ in os.walk(fs) for f in fs_)
            run(["umoci", "new", "--image", f"{layout}:{arch_tag}"])
            run(["umoci", "insert", "--image", f"{layout}:{arch_tag}", "--history.comment",
                 f"tern {version} ({arch}): binary, {what}, runtime libraries, example models", fs, "/"])
        configure(layout, arch_tag, platform, config)
        per_arch.append((arch_tag, platform))
        report.append((platform, sizes(layout, arch_tag), unpacked))
        if a.flavour == "cpu":
            python_tag, layer = python_layer(layout, arch_tag, runner[0], version)
            per_arch_python.append((python_tag, platform))
            report.append((f"{platform} -python", layer, None))
    index(layout, tag, per_arch)
    if per_arch_python:
        index(layout, f"{tag}-python", per_arch_python)
    run(["umoci", "gc", "--layout", layout])
    kind = "multi-architecture index" if len(per_arch) > 1 else "index"
    if a.from_manifest:
        kind += ", placeholders from the manifest: for tests only"
    tags = [tag] + ([f"{tag}-python"] if per_arch_python else [])
    for t in tags:
        archive = os.path.join(a.out, f"tern-{t}.oci.tar")
        if os.path.exists(archive):
            os.remove(archive)
        if a.no_archive or a.from_manifest:
            print(f"image tern:{t} in {layout} ({kind})")
        else:
            run(["skopeo", "copy", "--all", f"oci:{layout}:{t}", f"oci-archive:{archive}:tern:{t}"])
            print(f"image tern:{t} in {layout} ({kind}) and {archive} ({os.path.getsize(archive) / 1e6:.1f} MB)")
    for platform, compressed, unpacked in report:
        if unpacked is None:
            print(f"  linux/{platform}: + {compressed / 1e6:.1f} MB compressed (the Python runner layer)")
        else:
            print(f"  linux/{platform}: {compressed / 1e6:.1f} MB compressed, {unpacked / 1e6:.1f} MB unpacked")


if __name__ == "__main__":
    main()
