#!/bin/sh
# Builds ONNX Runtime from source against the JetPack of this image (the
# `ort-build` stage of images/jetson/Containerfile, ORT_SOURCE=build; the
# default, ORT_SOURCE=prebuilt, takes JetPack's published build instead): CUDA from /usr/local/cuda,
# cuDNN and TensorRT from /usr/lib/aarch64-linux-gnu, as ONNX Runtime's build
# docs give for Jetson. Leaves the libraries in $ORT_OUT/lib and the licences in
# $ORT_OUT/licenses.
#
# Before the hours-long build it checks what current ONNX Runtime (the default
# ORT_VERSION) needs and stops with the reason when the image lacks it:
#   * Python >= 3.10 (ONNX Runtime's build.py uses `match`);
#   * nvcc >= 11.8 and GCC >= 11 (ONNX Runtime's Jetson build docs: "For
#     JetPack 5.x users, CUDA 11.8 and GCC 11 are required");
#   * TensorRT >= 10 for the TensorRT provider (its docs: built and tested with
#     TensorRT 10; JetPack 5 stops at 8.5).
# JetPack 6 (Ubuntu 22.04, CUDA 12.x, GCC 11, TensorRT 10) meets all of them;
# JetPack 5 (Ubuntu 20.04, Python 3.8, CUDA 11.4, GCC 9, TensorRT 8.5) meets
# none, so on JetPack 5 use ORT_SOURCE=prebuilt (see images/jetson/README.md).
# ORT_FORCE=1 skips the checks (an older ORT_VERSION, down to 1.17, may need
# less; which versions build on JetPack 5's own toolchain is not checked here).
set -eu
here=$(cd "$(dirname "$0")" && pwd)

: "${JETPACK:?}" "${ORT_VERSION:?}"
ORT_REPO=${ORT_REPO:-https://github.com/microsoft/onnxruntime}
ORT_OUT=${ORT_OUT:-/ort}
ORT_PARALLEL=${ORT_PARALLEL:-4}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
LIBDIR=/usr/lib/aarch64-linux-gnu
# Orin is compute capability 8.7 (JetPack 6 supports only Orin); Xavier 7.2.
if [ -z "${CUDA_ARCHITECTURES:-}" ]; then
    if [ "$JETPACK" = 5 ]; then CUDA_ARCHITECTURES="72;87"; else CUDA_ARCHITECTURES=87; fi
fi
# The TensorRT provider: on by default where TensorRT >= 10 is present.
ORT_USE_TENSORRT=${ORT_USE_TENSORRT:-auto}

at_least() {  # at_least <have> <need>: version <have> >= <need>
    [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}
fail() {
    echo "ort-build: $*" >&2
    echo "ort-build: take an ONNX Runtime >= 1.17 built elsewhere with --build-arg ORT_SOURCE=prebuilt" \
        "(the default; images/jetson/README.md), or set ORT_FORCE=1 to try anyway." >&2
    exit 1
}

# Build tools the JetPack image may lack; CMake >= 3.28 (Ubuntu 22.04 has 3.22)
# comes from PyPI below, as ONNX Runtime's docs suggest.
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends build-essential ca-certificates git python3-dev python3-pip
rm -rf /var/lib/apt/lists/*

py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 0)
nvcc=$("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p')
gcc=$(gcc -dumpfullversion 2>/dev/null || gcc -dumpversion 2>/dev/null || echo 0)
trt_header=$(ls /usr/include/aarch64-linux-gnu/NvInferVersion.h /usr/include/NvInferVersion.h 2>/dev/null | head -n1 || true)
trt=0
if [ -n "$trt_header" ]; then
    # TensorRT 10.11+ names it TRT_MAJOR_ENTERPRISE; older headers NV_TENSORRT_MAJOR.
    trt=$(sed -n 's/^#define \(NV_TENSORRT_MAJOR\|TRT_MAJOR_ENTERPRISE\) \([0-9][0-9]*\).*/\2/p' "$trt_header" | head -n1)
fi
echo "ort-build: JetPack $JETPACK, Python $py, nvcc ${nvcc:-none}, GCC $gcc, TensorRT major ${trt:-0}," \
    "ONNX Runtime $ORT_VERSION for CUDA architectures $CUDA_ARCHITECTURES"

if [ "$ORT_USE_TENSORRT" = auto ]; then
    if at_least "${trt:-0}" 10; then ORT_USE_TENSORRT=1; else ORT_USE_TENSORRT=0; fi
fi
if [ "${ORT_FORCE:-0}" != 1 ]; then
    at_least "$py" 3.10 || fail "Python $py is older than the 3.10 ONNX Runtime's build.py needs (JetPack 5 has 3.8)"
    [ -n "$nvcc" ] || fail "no nvcc in $CUDA_HOME/bin: this stage needs JetPack's CUDA toolkit (the l4t-jetpack image)"
    at_least "$nvcc" 11.8 || fail "CUDA $nvcc is older than the 11.8 ONNX Runtime's Jetson build needs (JetPack 5 has 11.4)"
    at_least "$gcc" 11 || fail "GCC $gcc is older than the GCC 11 ONNX Runtime's Jetson build needs (JetPack 5 has 9)"
    if [ "$ORT_USE_TENSORRT" = 1 ] && ! at_least "${trt:-0}" 10; then
        fail "TensorRT ${trt:-none} is older than the TensorRT 10 ONNX Runtime's TensorRT provider builds against" \
            "(JetPack 5 has 8.5); set ORT_USE_TENSORRT=0 for the CUDA provider alone"
    fi
fi
python3 -m pip install --no-cache-dir 'cmake>=3.28,<4' packaging setuptools wheel

src=/src/onnxruntime
if [ ! -d "$src" ]; then
    git clone --depth 1 --branch "v$ORT_VERSION" --recurse-submodules --shallow-submodules "$ORT_REPO" "$src"
fi
cd "$src"
set -- --build_dir "$src/build/Linux" --config Release --update --build --build_shared_lib \
    --parallel "$ORT_PARALLEL" --nvcc_threads 1 --skip_tests --skip_submodule_sync \
    --allow_running_as_root --compile_no_warning_as_error \
    --use_cuda --cuda_home "$CUDA_HOME" --cudnn_home "$LIBDIR" \
    --cmake_extra_defines "CMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHITECTURES" onnxruntime_BUILD_UNIT_TESTS=OFF
if [ "$ORT_USE_TENSORRT" = 1 ]; then
    set -- "$@" --use_tensorrt --tensorrt_home "$LIBDIR"
fi
echo "+ ./build.sh $*"
PATH="$CUDA_HOME/bin:$PATH" ./build.sh "$@"

out=$src/build/Linux/Release
mkdir -p "$ORT_OUT/lib" "$ORT_OUT/licenses"
cp -a "$out"/libonnxruntime.so* "$ORT_OUT/lib/"
cp -a "$out"/libonnxruntime_providers_*.so "$ORT_OUT/lib/"
cp LICENSE "$ORT_OUT/licenses/onnxruntime-LICENSE"
cp ThirdPartyNotices.txt "$ORT_OUT/licenses/onnxruntime-ThirdPartyNotices.txt"
sh "$here/ort-check.sh" "$ORT_OUT/lib"
