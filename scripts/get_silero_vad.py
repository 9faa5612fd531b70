#!/usr/bin/env python3
"""Copies Silero VAD's ONNX model from the installed `silero-vad` wheel (PyPI,
installed without its torch dependency) into a model repository:

    python scripts/get_silero_vad.py <repository>

writes `<repository>/silero_vad/1/model.onnx` (the config is committed).
"""

import importlib.util
import os
import shutil
import sys
from importlib.metadata import version


def main(repo):
    # find_spec locates the package without importing it (its __init__ imports torch).
    spec = importlib.util.find_spec("silero_vad")
    src = os.path.join(spec.submodule_search_locations[0], "data", "silero_vad.onnx")
    dst = os.path.join(repo, "silero_vad", "1")
    os.makedirs(dst, exist_ok=True)
    shutil.copy(src, os.path.join(dst, "model.onnx"))
    print(f"copied Silero VAD {version('silero-vad')} into {dst}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "model_repository")
