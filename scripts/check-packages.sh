#!/usr/bin/env bash
# Checks the packages scripts/dist.py wrote in <dir>: lintian on each .deb,
# then the binary of each .deb and tarball, extracted, must report the ONNX
# Runtime library the package ships and serve the example repository; with the
# Python runner add-on (its .deb, or its tarball unpacked into the Tern
# tarball) a binary of this machine must also serve a Triton Python model
# (tests/python_models/add_sub); under qemu compiling the 39 MB runner takes
# over ten minutes, so an aarch64 package's runner is only checked for being
# where its binary looks (tests/test_images.py serves it natively on amd64).
#   scripts/check-packages.sh <dir> [<aarch64 sysroot for qemu>]
set -euo pipefail
shopt -s nullglob
# The packaged binaries must find the ONNX Runtime they ship, not one the caller points at.
unset ORT_DYLIB_PATH TERN_ONNXRUNTIME_LIBRARY
dir=$(realpath "$1")
qroot=${2:+$(realpath "$2")}
# run <binary> args...: natively, or under qemu for an aarch64 binary. Only
# ever called in a subshell ($(run ...) or run ... &): it execs, so the
# background job's pid is the server's (or qemu's) own, and killing it ends it.
run() {
    if file -L "$1" | grep -q aarch64 && [ "$(uname -m)" != aarch64 ]; then
        exec qemu-aarch64 -R 512G -L "$qroot" "$@"
    else
        exec "$@"
    fi
}
# A check that fails while its server runs must not leave the server behind.
server=
trap '[ -n "$server" ] && kill -TERM "$server" 2>/dev/null; true' EXIT
# serve <binary> <repository> <log> <seconds> <wasm cache dir>: starts a server
# on a free port and waits until it is ready; sets $port and $server.
serve() {
    port=$((20000 + RANDOM % 20000))
    run "$1" --model-repository="$2" --http-port=$port --grpc-port=0 --metrics-port=0 \
        --wasm-cache-dir="$5" >"$3" 2>&1 &
    server=$!
    for _ in $(seq "$4"); do
        curl -sf "localhost:$port/v2/health/ready" >/dev/null && break
        kill -0 $server 2>/dev/null || { cat "$3"; echo "FAIL: server exited"; exit 1; }
        sleep 1
    done
    curl -sf "localhost:$port/v2/health/ready" >/dev/null || { cat "$3"; echo "FAIL: not ready"; exit 1; }
}
# answers <model> <request JSON> <regex of the right data> <log>: one inference, checked.
answers() {
    curl -sf -X POST "localhost:$port/v2/models/$1/infer" -d "$2" | grep -qE "$3" \
        || { cat "$4"; echo "FAIL: wrong answer from $1"; exit 1; }
}
stop() {
    kill -TERM $server && wait $server || true
    server=
}
ADD_SUB_DATA='"data":\[2(\.0)?,3(\.0)?,4(\.0)?,5(\.0)?\]'
check() {  # check <binary> <expected libonnxruntime.so, or "none" for the plugins-only build> <example repository>
    local out
    out=$(run "$1" --version)
    echo "$out"
    if [ "$2" = none ]; then
        grep -q "features: none" <<<"$out" || { echo "FAIL: $1 is not the plugins-only build"; exit 1; }
    else
        grep -qF " at $(realpath "$2") (ORT Build Info" <<<"$out" || { echo "FAIL: $1 does not load $2"; exit 1; }
    fi
    serve "$1" "$3" "$dir/serve.log" 120 none
    if [ "$2" = none ]; then
        answers add_sub '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]},
              {"name":"INPUT1","datatype":"FP32","shape":[1,4],"data":[1,1,1,1]}]}' "$ADD_SUB_DATA" "$dir/serve.log"
    else
        answers simple '{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},
              {"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}' \
            '"data":\[2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17\]' "$dir/serve.log"
    fi
    stop
    echo "ok: $1 serves the example repository"
}
python_repo=$dir/python-models
rm -rf "$python_repo" && mkdir -p "$python_repo"
cp -r "$(dirname "$0")/../tests/python_models/add_sub" "$python_repo/"
check_python() {  # check_python <binary> <runner>: it finds the runner where the add-on put it
    [ -f "$2" ] || { echo "FAIL: the add-on did not put the runner at $2"; exit 1; }
    if file -L "$1" | grep -q aarch64 && [ "$(uname -m)" != aarch64 ]; then
        echo "ok: $2 is where $1 looks (not served under qemu)"
        return
    fi
    serve "$1" "$python_repo" "$dir/serve-python.log" 600 "$dir/wasm-cache"
    answers add_sub '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1,2,3,4]},
          {"name":"INPUT1","datatype":"FP32","shape":[4],"data":[1,1,1,1]}]}' "$ADD_SUB_DATA" "$dir/serve-python.log"
    stop
    echo "ok: $1 serves a Triton Python model with the runner add-on"
}
runner_debs=("$dir"/tern-python-runner_*_all.deb)
runner_tgzs=("$dir"/tern-python-runner-*.tar.gz)
[ ${#runner_debs[@]} -le 1 ] && [ ${#runner_tgzs[@]} -le 1 ] || { echo "FAIL: more than one Python runner add-on in $dir"; exit 1; }
runner_deb=${runner_debs[0]:-}
runner_tgz=${runner_tgzs[0]:-}
for deb in "$dir"/*.deb; do
    echo "== lintian $(basename "$deb")"
    lintian --fail-on error "$deb"
    [ "$deb" = "$runner_deb" ] && continue
    x=$dir/extract-$(basename "$deb" .deb)
    rm -rf "$x" && dpkg-deb -x "$deb" "$x"
    [ -e "$x/usr/lib/tern/python-runner.wasm" ] && { echo "FAIL: $deb carries the Python runner"; exit 1; }
    check "$x/usr/bin/tern" "$x/usr/lib/tern/libonnxruntime.so" "$x/usr/share/tern/examples/model_repository"
    if [ -n "$runner_deb" ]; then
        dpkg-deb -x "$runner_deb" "$x"
        check_python "$x/usr/bin/tern" "$x/usr/lib/tern/python-runner.wasm"
    fi
done
for tgz in "$dir"/*.tar.gz; do
    [ "$tgz" = "$runner_tgz" ] && continue
    x=$dir/extract-$(basename "$tgz" .tar.gz)
    rm -rf "$x" && mkdir -p "$x" && tar -xzf "$tgz" -C "$x"
    top=$(echo "$x"/*)
    case $tgz in
    *musl*)
        readelf -d "$top/bin/tern" | grep -q NEEDED && { echo "FAIL: $top/bin/tern is not static"; exit 1; }
        check "$top/bin/tern" none "$top/share/tern/model_repository" ;;
    *) check "$top/bin/tern" "$top/lib/libonnxruntime.so" "$top/share/tern/model_repository" ;;
    esac
    if [ -n "$runner_tgz" ]; then
        tar -xzf "$runner_tgz" -C "$top"
        check_python "$top/bin/tern" "$top/lib/tern/python-runner.wasm"
    fi
done
