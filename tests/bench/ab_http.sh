#!/bin/bash
# A/B HTTP throughput of two Tern binaries, measured in the same run:
#   tests/bench/ab_http.sh <binary A> <binary B> [rounds]
# Serves `simple` only; each round drives both binaries (the order alternates
# between rounds) with wrk and the JSON body: 2 s warm-up, -c16 for 8 s, then
# -c1 for 6 s. Prints one line per binary and round (requests/s).
set -euo pipefail
cd "$(dirname "$0")/../.."
A=$1 B=$2 ROUNDS=${3:-6}
export ORT_DYLIB_PATH=${ORT_DYLIB_PATH:-$PWD/.cache/onnxruntime/libonnxruntime.so}
LUA=$(mktemp --suffix=.lua)
trap 'rm -f "$LUA"' EXIT
python3 - > "$LUA" <<'PY'
import json
body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                              {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]})
print('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = ' + json.dumps(body))
PY
URL=http://127.0.0.1:18300/v2/models/simple/infer
for round in $(seq "$ROUNDS"); do
  if (( round % 2 )); then order="$A $B"; else order="$B $A"; fi
  for bin in $order; do
    "$bin" --model-repository model_repository --model-control-mode explicit --load-model simple \
      --http-port 18300 --grpc-port 18301 --metrics-port 18302 > /dev/null 2>&1 &
    pid=$!
    for _ in $(seq 100); do curl -sf localhost:18300/v2/health/ready > /dev/null && break; sleep 0.2; done
    wrk -t2 -c16 -d2s -s "$LUA" "$URL" > /dev/null
    c16=$(wrk -t2 -c16 -d8s -s "$LUA" "$URL" | awk '/Requests\/sec/ {print $2}')
    c1=$(wrk -t1 -c1 -d6s -s "$LUA" "$URL" | awk '/Requests\/sec/ {print $2}')
    echo "round $round $bin c16=$c16 c1=$c1"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
