#!/bin/sh
# The `ort-prebuilt` stage of images/jetson/Containerfile: takes an ONNX
# Runtime built elsewhere instead of building one. Looks, in order, at
#   * ORT_WHEEL_URL: an onnxruntime-gpu wheel to download (checked against
#     ORT_WHEEL_SHA256 when given), e.g. from Jetson AI Lab's index once it
#     serves >= 1.31;
#   * the build context's ort-prebuilt/ folder: a wheel (*.whl), or the
#     libraries themselves (libonnxruntime.so.<version> and the
#     libonnxruntime_providers_*.so beside it, as ONNX Runtime's build leaves them).
# Leaves the libraries in $ORT_OUT/lib, the licences in $ORT_OUT/licenses,
# and checks the version with ort-check.sh.
set -eu
IN=${ORT_IN:-/ort-in}
ORT_OUT=${ORT_OUT:-/ort}
mkdir -p "$ORT_OUT/lib" "$ORT_OUT/licenses"

if [ -n "${ORT_WHEEL_URL:-}" ]; then
    wheel=$IN/$(basename "${ORT_WHEEL_URL%%\?*}")
    echo "ort-prebuilt: downloading $ORT_WHEEL_URL"
    if command -v curl >/dev/null; then
        curl -fsSL -o "$wheel" "$ORT_WHEEL_URL"
    elif command -v wget >/dev/null; then
        wget -q -O "$wheel" "$ORT_WHEEL_URL"
    else
        echo "ort-prebuilt: neither curl nor wget in this image to download ORT_WHEEL_URL;" \
            "put the wheel in the context's ort-prebuilt/ instead" >&2
        exit 1
    fi
    if [ -n "${ORT_WHEEL_SHA256:-}" ]; then
        echo "$ORT_WHEEL_SHA256  $wheel" | sha256sum -c -
    fi
else
    wheel=$(ls "$IN"/*.whl 2>/dev/null | head -n1 || true)
fi

if [ -n "$wheel" ]; then
    echo "ort-prebuilt: taking ONNX Runtime from $(basename "$wheel")"
    tmp=$(mktemp -d)
    python3 -m zipfile -e "$wheel" "$tmp"
    lib=$(ls "$tmp"/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n1 || true)
    if [ -z "$lib" ]; then
        echo "ort-prebuilt: $(basename "$wheel") has no onnxruntime/capi/libonnxruntime.so.<version>:" \
            "not an ONNX Runtime wheel" >&2
        exit 1
    fi
    capi=$(dirname "$lib")
    cp -a "$capi"/libonnxruntime.so.* "$ORT_OUT/lib/"
    cp -a "$capi"/libonnxruntime_providers_*.so "$ORT_OUT/lib/" 2>/dev/null || true
    for f in LICENSE ThirdPartyNotices.txt; do
        if [ -f "$tmp/onnxruntime/$f" ]; then cp "$tmp/onnxruntime/$f" "$ORT_OUT/licenses/onnxruntime-$f"; fi
    done
    rm -rf "$tmp"
elif ls "$IN"/libonnxruntime.so.* >/dev/null 2>&1; then
    echo "ort-prebuilt: taking ONNX Runtime libraries from the build context's ort-prebuilt/"
    cp -a "$IN"/libonnxruntime.so* "$ORT_OUT/lib/"
    cp -a "$IN"/libonnxruntime_providers_*.so "$ORT_OUT/lib/" 2>/dev/null || true
    for f in LICENSE ThirdPartyNotices.txt; do
        if [ -f "$IN/$f" ]; then cp "$IN/$f" "$ORT_OUT/licenses/onnxruntime-$f"; fi
    done
else
    echo "ort-prebuilt: ORT_SOURCE=prebuilt, but there is no ONNX Runtime to take: set ORT_WHEEL_URL," \
        "or put a wheel or libonnxruntime.so.<version> with its providers into the context's ort-prebuilt/" \
        "(scripts/jetson_context.py --ort-prebuilt PATH)." >&2
    exit 1
fi
sh "$(dirname "$0")/ort-check.sh" "$ORT_OUT/lib"
