"""A model repository holding `simple` exactly as in `model_repository/`,
but served by the `identity` backend (outputs are copies of the inputs) in
place of ONNX Runtime. The benchmarks run it beside the real `simple` to
split Tern's per-request cost into its own request path and the model
runtime's per-call cost."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make(directory):
    """Writes the repository under `directory` and returns its path."""
    root = os.path.join(directory, "identity-repo")
    os.makedirs(os.path.join(root, "simple", "1"), exist_ok=True)
    with open(os.path.join(ROOT, "model_repository", "simple", "config.pbtxt")) as f:
        config = f.read()
    config, n = re.subn(r'backend:\s*"onnxruntime"', 'backend: "identity"', config)
    if n != 1:
        raise RuntimeError("model_repository/simple/config.pbtxt no longer names the onnxruntime backend")
    with open(os.path.join(root, "simple", "config.pbtxt"), "w") as f:
        f.write(config)
    return root
