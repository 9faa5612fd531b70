#!/bin/sh
# ort-check.sh <dir>: the ONNX Runtime in <dir> is one Tern can use. Tern needs
# ONNX Runtime >= 1.17 (C API level 17) and refuses an older library at run
# time; this stops the image build instead. The version comes from the
# library's file name (libonnxruntime.so.<version>, as ONNX Runtime's build
# and its wheels name it). Makes <dir>/libonnxruntime.so point at it and lists
# the execution providers found beside it.
set -eu
MIN_ORT=${MIN_ORT:-1.17}
dir=${1:?usage: ort-check.sh <dir>}

versioned=$(ls "$dir" | sed -n 's/^libonnxruntime\.so\.\([0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*\)$/\1/p' | sort -V | tail -n1)
if [ -z "$versioned" ]; then
    echo "ort-check: no libonnxruntime.so.<version> in $dir (found: $(ls "$dir" | tr '\n' ' '))." >&2
    echo "ort-check: give the library under its versioned name, e.g. libonnxruntime.so.1.23.0, or the wheel." >&2
    exit 1
fi
if [ "$(printf '%s\n%s\n' "$MIN_ORT" "$versioned" | sort -V | head -n1)" != "$MIN_ORT" ]; then
    echo "ort-check: ONNX Runtime $versioned is older than $MIN_ORT: Tern uses ONNX Runtime's C API level 17" \
        "and refuses older libraries (docs/deployment.md, \"ONNX Runtime versions\"). Take $MIN_ORT or newer." >&2
    exit 1
fi
if [ ! -e "$dir/libonnxruntime.so" ]; then
    ln -s "libonnxruntime.so.$versioned" "$dir/libonnxruntime.so"
fi
providers=$(ls "$dir" | sed -n 's/^libonnxruntime_providers_\(.*\)\.so$/\1/p' | grep -v '^shared$' | tr '\n' ' ')
echo "ort-check: ONNX Runtime $versioned (>= $MIN_ORT) in $dir; execution providers beside it: ${providers:-none (CPU only)}"
