#!/usr/bin/env python3
"""Assemble LibTorch for building and running Tern's `pytorch` backend (the
`torch` cargo feature) from PyPI wheels, without installing PyTorch.

    get_libtorch.py OUT_DIR [--cuda]

OUT_DIR gets `include/` (the C++ headers), `lib/` (the shared libraries) and
`build-version` (read by torch-sys). The `torch` wheel is downloaded with
`--no-deps`; of NVIDIA's runtime wheels only what `libtorch_cpu.so` links
(the CUDA runtime and CUPTI) is taken for the CPU set (~440 MB). With `--cuda`
the directory also gets `libtorch_cuda.so` and every CUDA library it loads
(cuBLAS, cuDNN, ...: several GB), for a build whose binary uses the GPU.

When the running Python already has these exact wheels installed (the test
venv's PyTorch), their files are hard-linked from there instead: nothing is
downloaded and the CUDA set takes no extra disk.

`tch` 0.26 needs PyTorch 2.13.0 exactly (../shared/TOOLCHAINS.md).
"""

import argparse
import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

TORCH = "torch==2.13.0"
# What libtorch_cpu.so links besides libc10 and libgomp (from torch's own metadata).
CPU_RUNTIME = ["nvidia-cuda-runtime==13.0.96", "nvidia-cuda-cupti==13.0.85"]
CPU_LIBS = {"libc10.so", "libtorch_cpu.so", "libtorch.so", "libgomp.so.1", "libcudart.so.13", "libcupti.so.13"}
# libtorch_cuda.so and the CUDA 13 libraries it needs (DT_NEEDED of the 2.13.0 wheel).
CUDA_RUNTIME = [
    "nvidia-cublas==13.1.1.3",
    "nvidia-cuda-nvrtc==13.0.88",
    "nvidia-cudnn-cu13==9.20.0.48",
    "nvidia-cufft==12.0.0.61",
    "nvidia-cufile==1.15.1.6",
    "nvidia-curand==10.4.0.35",
    "nvidia-cusolver==12.0.4.66",
    "nvidia-cusparse==12.6.3.3",
    "nvidia-cusparselt-cu13==0.8.1",
    "nvidia-nccl-cu13==2.29.7",
    "nvidia-nvjitlink==13.5.37",
    "nvidia-nvshmem-cu13==3.4.5",
]
CUDA_LIBS = {"libtorch_cuda.so", "libc10_cuda.so", "libtorch_nvshmem.so", "libtorch_cuda_linalg.so"}


def download(specs, dest):
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), *specs],
        check=True,
    )


def installed(specs):
    """{file name as in the wheel: path} of every `name==version` in `specs`,
    or None unless all of them are installed with exactly that version."""
    files = {}
    for spec in specs:
        name, version = spec.split("==")
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return None
        if dist.version != version:
            return None
        for f in dist.files or []:
            files[str(f)] = pathlib.Path(dist.locate_file(f))
    return files


def wheel_members(specs, tmp):
    """{file name: zip member} of the downloaded wheels of `specs`."""
    download(specs, tmp)
    members = {}
    for wheel in sorted(tmp.glob("*.whl")):
        z = zipfile.ZipFile(wheel)
        for info in z.infolist():
            if not info.is_dir():
                members[info.filename] = (z, info)
    return members


def place(source, target):
    """Hard-links an installed file (copies across file systems) or extracts a zip member."""
    if isinstance(source, pathlib.Path):
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
        return
    z, info = source
    with z.open(info) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--cuda", action="store_true", help="also the CUDA libraries (several GB)")
    args = ap.parse_args()
    out = args.out
    tmp_out = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp_out, ignore_errors=True)
    (tmp_out / "lib").mkdir(parents=True)
    wanted = CPU_LIBS | (CUDA_LIBS if args.cuda else set())
    specs = [TORCH, *CPU_RUNTIME, *(CUDA_RUNTIME if args.cuda else [])]
    with tempfile.TemporaryDirectory() as tmp:
        files = installed(specs)
        if files is None:
            files = wheel_members(specs, pathlib.Path(tmp))
        else:
            print("LibTorch: linking the installed PyTorch wheels", file=sys.stderr)
        for name, source in files.items():
            if name.startswith("torch/include/"):
                target = tmp_out / "include" / name[len("torch/include/"):]
            elif name.startswith("torch/lib/") and name.split("/")[-1] in wanted:
                target = tmp_out / "lib" / name.split("/")[-1]
            elif name.startswith("nvidia/") and "/lib/" in name and ".so" in name and (
                args.cuda or name.split("/")[-1] in wanted
            ):
                target = tmp_out / "lib" / name.split("/")[-1]
            else:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            place(source, target)
    (tmp_out / "build-version").write_text("2.13.0\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp_out.rename(out)
    size = sum(f.stat().st_size for f in (out / "lib").iterdir())
    print(f"LibTorch 2.13.0 in {out}: {len(list((out / 'lib').iterdir()))} libraries, {size / 1e6:.0f} MB",
          file=sys.stderr)


if __name__ == "__main__":
    main()
