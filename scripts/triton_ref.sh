#!/usr/bin/env bash
# Triton Inference Server 2.51 itself, as the reference `make test-vs-triton` compares Tern with
# (tests/test_vs_triton.py), from the `nvidia-pytriton` PyPI wheel, which ships a complete
# CPU-capable tritonserver with its Python backend (tests/README.md, "Against Triton").
#
#   scripts/triton_ref.sh <dir> <python>
#
# Makes, under <dir>:
#   wheel/nvidia_pytriton-0.7.0-*.whl   the wheel (~55 MB, downloaded once with pip)
#   pytriton/, nvidia_pytriton.libs/    the wheel unpacked: tritonserver in
#                                       pytriton/tritonserver/bin, backends in .../backends
#   venv/                               <python>'s venv with numpy < 2, to be first on PATH for
#                                       Triton's stub (with numpy 2 the 0.7.0 stub corrupts inputs)
#   .stamp                              written last (make's target); every step below checks
#                                       what is there first, so a second run takes ~0.2 s
# The stub for <python>'s version (python_backend_stubs/3.x/) is copied into backends/python/,
# where the Python backend looks for it. Only PyPI is used.
set -euo pipefail
DIR=${1:?target dir}
DIR=${DIR%/}
PY=${2:?python}
VERSION=0.7.0
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
TS=$DIR/pytriton/tritonserver
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# 1. The wheel.
WHEEL=$(ls "$DIR"/wheel/nvidia_pytriton-"$VERSION"-*.whl 2>/dev/null | head -1 || true)
if [[ -z $WHEEL ]]; then
    rm -rf "$DIR/wheel.tmp"
    "$PY" -m pip download -q --no-deps --only-binary=:all: "nvidia-pytriton==$VERSION" -d "$DIR/wheel.tmp"
    rm -rf "$DIR/wheel" && mv "$DIR/wheel.tmp" "$DIR/wheel"
    WHEEL=$(ls "$DIR"/wheel/nvidia_pytriton-"$VERSION"-*.whl | head -1)
fi

# 2. Unpacked (unzip keeps the executable bits of tritonserver and the stubs).
if [[ ! -x $TS/bin/tritonserver || ! -f $DIR/.unpacked || $(cat "$DIR/.unpacked") != "$(basename "$WHEEL")" ]]; then
    rm -rf "$DIR/unpack.tmp" "$DIR/pytriton" "$DIR/nvidia_pytriton.libs" "$DIR/.unpacked"
    unzip -q "$WHEEL" -d "$DIR/unpack.tmp"
    mv "$DIR/unpack.tmp/pytriton" "$DIR/unpack.tmp/nvidia_pytriton.libs" "$DIR/"
    rm -rf "$DIR/unpack.tmp"
    basename "$WHEEL" > "$DIR/.unpacked"
fi

# 3. The stub for this Python, where the Python backend looks for it.
STUB=$TS/python_backend_stubs/$PYVER/triton_python_backend_stub
[[ -f $STUB ]] || { echo "triton_ref: the wheel has no stub for Python $PYVER" >&2; ls "$TS/python_backend_stubs" >&2; exit 1; }
cp "$STUB" "$TS/backends/python/triton_python_backend_stub"
chmod +x "$TS/backends/python/triton_python_backend_stub" "$TS/bin/tritonserver"

# 4. numpy < 2 for the stub (it imports numpy from the first python3 on PATH).
if ! "$DIR/venv/bin/python" -c 'import sys, numpy; sys.exit(not numpy.__version__.startswith("1."))' 2>/dev/null; then
    rm -rf "$DIR/venv"
    "$PY" -m venv "$DIR/venv"
    "$DIR/venv/bin/pip" install -q "numpy<2"
fi

# The server and its libraries resolve (it refuses an unknown flag only after loading them all).
if LD_LIBRARY_PATH=$DIR/nvidia_pytriton.libs ldd "$TS/bin/tritonserver" | grep -q "not found"; then
    echo "triton_ref: tritonserver misses libraries:" >&2
    LD_LIBRARY_PATH=$DIR/nvidia_pytriton.libs ldd "$TS/bin/tritonserver" | grep "not found" >&2
    exit 1
fi
echo "nvidia-pytriton $VERSION python $PYVER" > "$DIR/.stamp"
echo "tritonserver 2.51 (nvidia-pytriton $VERSION) in $DIR"
