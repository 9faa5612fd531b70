#!/usr/bin/env bash
# GPU checks (tests/gpu/check.py) on a machine with an NVIDIA driver and the CUDA 13 runtime
# libraries (cuBLAS, cuDNN 9, ...), e.g. the `cuda` image the device tool lends.
#
#   bash tests/gpu/run.sh <ort-gpu dir> <tern binary>
#
# <ort-gpu dir> holds the unpacked `onnxruntime-gpu` wheel (its `onnxruntime/` package): its
# libonnxruntime.so serves Tern and its Python package is the baseline. The CUDA libraries are
# found in the Python environment's `nvidia/*/lib` folders (PyTorch's wheels ship them).
set -euo pipefail
ORT_DIR=${1:?ort-gpu dir}
export TERN_BIN=${2:?tern binary}
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH="$SITE/nvidia/cu13/lib:$SITE/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}"
export ORT_DYLIB_PATH=$(ls "$ORT_DIR"/onnxruntime/capi/libonnxruntime.so.* | head -1)
export PYTHONPATH="$ORT_DIR:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
python3 -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())'
exec python3 "$(dirname "$0")/check.py" /tmp/tern_gpu_repo
