#!/usr/bin/env bash
# Installs Triton's perf_analyzer (the C++ load generator from the `perf-analyzer` PyPI wheel)
# under <dir> for the end-to-end tests, and writes <dir>/perf_analyzer, a wrapper to run it.
#
#   scripts/get_perf_analyzer.sh <dir> <python>
#
# The wheel's binary needs glibc 2.38 and GCC 13's libstdc++, newer than Debian 12 ships. So
# the glibc, libstdc++ and libgcc of Debian 13 (trixie) are fetched with apt from the Debian
# archive (signatures checked against the system keyring, nothing installed system-wide) and
# unpacked next to it; the wrapper starts the binary with that glibc's loader and libraries,
# falling back to the system's for everything else (libssl, libz). The CUDA runtime library
# its shared-memory code loads comes from NVIDIA's `nvidia-cuda-runtime-cu12` wheel. Only the
# package registries are used (PyPI, Debian).
set -euo pipefail
DIR=${1:?target dir}
DIR=${DIR%/}
PY=${2:?python}
VERSION=2.60.0
case "$(uname -m)" in
x86_64) PLAT=manylinux_2_38_x86_64 TRIPLE=x86_64-linux-gnu LOADER=ld-linux-x86-64.so.2 ;;
aarch64) PLAT=manylinux_2_38_aarch64 TRIPLE=aarch64-linux-gnu LOADER=ld-linux-aarch64.so.1 ;;
*) echo "perf_analyzer: no wheel for $(uname -m)" >&2; exit 1 ;;
esac
rm -rf "$DIR.tmp" && mkdir -p "$DIR.tmp"/{wheel,root,apt/lists/partial,apt/cache/archives/partial,debs}
TMP=$(cd "$DIR.tmp" && pwd)

"$PY" -m pip download -q --no-deps --only-binary=:all: --platform "$PLAT" \
    "perf-analyzer==$VERSION" -d "$TMP/wheel"
"$PY" -m zipfile -e "$TMP"/wheel/perf_analyzer-*.whl "$TMP/wheel/x"
# Its shared-memory support loads the CUDA runtime even for system shared memory (no GPU
# needed for that): libcudart from NVIDIA's PyPI wheel.
"$PY" -m pip download -q --no-deps --only-binary=:all: "nvidia-cuda-runtime-cu12==12.9.79" -d "$TMP/cudart"
"$PY" -m zipfile -e "$TMP"/cudart/nvidia_cuda_runtime_cu12-*.whl "$TMP/cudart/x"

echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" > "$TMP/apt/sources.list"
APT=(-o "Dir::Etc::SourceList=$TMP/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$TMP/apt/lists" -o "Dir::Cache=$TMP/apt/cache"
    -o APT::Sandbox::User=root -o Debug::NoLocking=1)
apt-get "${APT[@]}" -qq update
(cd "$TMP/debs" && apt-get "${APT[@]}" -qq download libc6 libstdc++6 libgcc-s1)
for deb in "$TMP"/debs/*.deb; do dpkg-deb -x "$deb" "$TMP/root"; done

mkdir -p "$TMP/out/bin"
cp "$TMP/wheel/x/perf_analyzer/bin/perf_analyzer" "$TMP/out/bin/"
chmod +x "$TMP/out/bin/perf_analyzer"
mv "$TMP/root/usr/lib/$TRIPLE" "$TMP/out/lib"
cp "$TMP"/cudart/x/nvidia/cuda_runtime/lib/libcudart.so.12 "$TMP/out/lib/libcudart.so"
cat > "$TMP/out/perf_analyzer" <<EOF
#!/bin/sh
# perf_analyzer $VERSION with Debian 13's glibc/libstdc++ (scripts/get_perf_analyzer.sh).
HERE=\$(cd "\$(dirname "\$0")" && pwd)
exec "\$HERE/lib/$LOADER" --library-path "\$HERE/lib:/lib/$TRIPLE:/usr/lib/$TRIPLE" "\$HERE/bin/perf_analyzer" "\$@"
EOF
chmod +x "$TMP/out/perf_analyzer"
VERSION_LINE=$("$TMP/out/perf_analyzer" --version 2>&1) || true
[[ $VERSION_LINE == *"Perf Analyzer"* ]] || { echo "perf_analyzer does not start: $VERSION_LINE" >&2; exit 1; }
rm -rf "$DIR" && mv "$TMP/out" "$DIR" && rm -rf "$TMP"
echo "perf_analyzer $VERSION in $DIR"
