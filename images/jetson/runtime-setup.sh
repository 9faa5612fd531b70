#!/bin/sh
# The final stage of images/jetson/Containerfile, run as root before USER:
#   1. every CUDA, cuDNN and TensorRT library the ONNX Runtime providers in
#      /usr/lib/tern link against must be in this image. Since L4T r34.1
#      (JetPack 5) the NVIDIA container runtime mounts only the board's driver
#      libraries (l4t.csv, drivers.csv, devices.csv), not CUDA, cuDNN or
#      TensorRT, so they come from the base image; a base that lacks one fails
#      the build here with its name instead of the first GPU model's load on the
#      device. libcuda.so.1 and the other Tegra driver libraries are mounted at
#      run time and are not checked.
#   2. the unprivileged user `tern` (65532:65532, as in the CPU image), in the
#      `video` group where the base has one (Jetson's GPU device nodes belong to it);
#   3. the writable plugin cache folder /var/cache/tern.
# `runtime-setup.sh --check-only` does the first step alone (on TERN_LIB,
# default /usr/lib/tern): tests/test_jetson_recipe.py runs it on stand-ins.
set -eu
TERN_UID=65532
TERN_LIB=${TERN_LIB:-/usr/lib/tern}
LIBS='^lib(cudart|cublas|cublasLt|cufft|curand|cudnn[a-z_]*|nvinfer[a-z_]*|nvonnxparser|nvrtc[a-z0-9_-]*)\.so'

providers=
for p in "$TERN_LIB"/libonnxruntime_providers_*.so; do
    case $p in *providers_shared.so|*'*'*) ;; *) providers="$providers $p" ;; esac
done
providers=${providers# }
if [ -n "$providers" ]; then
    # shellcheck disable=SC2086
    missing=$(LD_LIBRARY_PATH="$TERN_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd $providers \
        | awk '/not found/ {print $1}' | sort -u | grep -E "$LIBS" || true)
    if [ -n "$missing" ]; then
        echo "runtime-setup: the ONNX Runtime providers need libraries this base image does not have:" >&2
        echo "$missing" | sed 's/^/  /' >&2
        echo "runtime-setup: JetPack's container runtime does not mount CUDA, cuDNN or TensorRT from the board;" \
            "use a base that has them, e.g. --build-arg JP6_RUNTIME_IMAGE=nvcr.io/nvidia/l4t-jetpack:r36.4.0" >&2
        exit 1
    fi
    echo "runtime-setup: every CUDA/cuDNN/TensorRT library of $(echo "$providers" | xargs -n1 basename | tr '\n' ' ')is in the image"
else
    echo "runtime-setup: no execution provider libraries beside ONNX Runtime: ONNX models run on the CPU"
fi

if [ "${1:-}" = --check-only ]; then
    exit 0
fi
groupadd --system --gid "$TERN_UID" tern
useradd --system --uid "$TERN_UID" --gid "$TERN_UID" --home-dir /models --no-create-home \
    --shell /usr/sbin/nologin tern
if getent group video >/dev/null; then
    usermod -a -G video tern
fi
mkdir -p /var/cache/tern
chown "$TERN_UID:$TERN_UID" /var/cache/tern
chmod 0755 /var/cache/tern
