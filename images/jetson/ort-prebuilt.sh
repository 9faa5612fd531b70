#!/bin/sh
# The `ort-prebuilt` stage of images/jetson/Containerfile (the default): takes
# an ONNX Runtime built elsewhere instead of building one. Looks, in order, at
#   * ORT_WHEEL_URL: an onnxruntime-gpu wheel to download (checked against
#     ORT_WHEEL_SHA256 when given);
#   * the build context's ort-prebuilt/ folder: a wheel (*.whl), or the
#     libraries themselves (libonnxruntime.so.<version> and the
#     libonnxruntime_providers_*.so beside it, as ONNX Runtime's
#     `build.sh --build_shared_lib` leaves them);
#   * JP<JETPACK>_ORT_WHEEL_URL (+ JP<JETPACK>_ORT_WHEEL_SHA256): the default
#     wheel for this JetPack. JetPack 6's is the onnxruntime-gpu wheel from
#     Jetson AI Lab's pip index; JetPack 5 has none (see images/jetson/README.md).
# Leaves the libraries in $ORT_OUT/lib, the licences in $ORT_OUT/licenses,
# and checks the version with ort-check.sh.
#
# A wheel must hold onnxruntime/capi/libonnxruntime.so.<version>. ONNX
# Runtime's wheels do from 1.19 on; before, the runtime is linked into the
# Python module (onnxruntime_pybind11_state.so), which exports only Python's
# entry point, so Tern cannot load it.
set -eu
IN=${ORT_IN:-/ort-in}
ORT_OUT=${ORT_OUT:-/ort}
mkdir -p "$IN" "$ORT_OUT/lib" "$ORT_OUT/licenses"

# The JetPack's default wheel, used only when nothing else is given.
default_url=
default_sha=
case ${JETPACK:-} in
    5) default_url=${JP5_ORT_WHEEL_URL:-}; default_sha=${JP5_ORT_WHEEL_SHA256:-} ;;
    6) default_url=${JP6_ORT_WHEEL_URL:-}; default_sha=${JP6_ORT_WHEEL_SHA256:-} ;;
esac

download() {  # download <url> <sha256 or empty>: prints the downloaded file's path
    dest=$IN/$(basename "${1%%\?*}")
    echo "ort-prebuilt: downloading $1" >&2
    if command -v curl >/dev/null; then
        curl -fsSL -o "$dest" "$1"
    elif command -v wget >/dev/null; then
        wget -q -O "$dest" "$1"
    else
        echo "ort-prebuilt: neither curl nor wget in this image to download $1;" \
            "put the wheel in the context's ort-prebuilt/ instead (scripts/jetson_context.py --ort-prebuilt PATH)" >&2
        exit 1
    fi
    if [ -n "$2" ]; then
        echo "$2  $dest" | sha256sum -c - >&2
    fi
    echo "$dest"
}

wheel=
libs=
if [ -n "${ORT_WHEEL_URL:-}" ]; then
    wheel=$(download "$ORT_WHEEL_URL" "${ORT_WHEEL_SHA256:-}")
elif ls "$IN"/*.whl >/dev/null 2>&1; then
    wheel=$(ls "$IN"/*.whl | head -n1)
elif ls "$IN"/libonnxruntime.so.* >/dev/null 2>&1; then
    libs=$IN
elif [ -n "$default_url" ]; then
    echo "ort-prebuilt: JetPack $JETPACK's default ONNX Runtime (JP${JETPACK}_ORT_WHEEL_URL)"
    wheel=$(download "$default_url" "$default_sha")
else
    echo "ort-prebuilt: there is no ONNX Runtime to take: set ORT_WHEEL_URL, or put a wheel or" \
        "libonnxruntime.so.<version> with its providers into the context's ort-prebuilt/" \
        "(scripts/jetson_context.py --ort-prebuilt PATH), or build it with ORT_SOURCE=build." >&2
    if [ "${JETPACK:-}" = 5 ]; then
        echo "ort-prebuilt: JetPack 5 has no default: its published onnxruntime-gpu wheels (Jetson Zoo) are" \
            "older than 1.19 and hold no libonnxruntime.so; give the libraries of a --build_shared_lib build" \
            "(1.17 or newer) for JetPack 5's CUDA 11 and cuDNN 8 (images/jetson/README.md)." >&2
    fi
    exit 1
fi

if [ -n "$wheel" ]; then
    echo "ort-prebuilt: taking ONNX Runtime from $(basename "$wheel")"
    tmp=$(mktemp -d)
    python3 -m zipfile -e "$wheel" "$tmp"
    lib=$(ls "$tmp"/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n1 || true)
    if [ -z "$lib" ]; then
        if ls "$tmp"/onnxruntime/capi/onnxruntime_pybind11_state*.so >/dev/null 2>&1; then
            echo "ort-prebuilt: $(basename "$wheel") has no onnxruntime/capi/libonnxruntime.so.<version>:" \
                "ONNX Runtime's wheels before 1.19 link the runtime into the Python module, which Tern" \
                "cannot load. Take a wheel of 1.19 or newer, or the libraries of a --build_shared_lib build" \
                "(libonnxruntime.so.<version> and its providers) in the context's ort-prebuilt/." >&2
        else
            echo "ort-prebuilt: $(basename "$wheel") has no onnxruntime/capi/libonnxruntime.so.<version>:" \
                "not an ONNX Runtime wheel" >&2
        fi
        exit 1
    fi
    capi=$(dirname "$lib")
    cp -a "$capi"/libonnxruntime.so.* "$ORT_OUT/lib/"
    cp -a "$capi"/libonnxruntime_providers_*.so "$ORT_OUT/lib/" 2>/dev/null || true
    for f in LICENSE ThirdPartyNotices.txt; do
        if [ -f "$tmp/onnxruntime/$f" ]; then cp "$tmp/onnxruntime/$f" "$ORT_OUT/licenses/onnxruntime-$f"; fi
    done
    rm -rf "$tmp"
else
    echo "ort-prebuilt: taking ONNX Runtime libraries from the build context's ort-prebuilt/"
    cp -a "$libs"/libonnxruntime.so* "$ORT_OUT/lib/"
    cp -a "$libs"/libonnxruntime_providers_*.so "$ORT_OUT/lib/" 2>/dev/null || true
    for f in LICENSE ThirdPartyNotices.txt; do
        if [ -f "$libs/$f" ]; then cp "$libs/$f" "$ORT_OUT/licenses/onnxruntime-$f"; fi
    done
fi
sh "$(dirname "$0")/ort-check.sh" "$ORT_OUT/lib"
