#!/usr/bin/env python3
"""Copies Magika's model files from the installed `magika` wheel (PyPI) into a
model repository:

    python scripts/get_magika.py <repository>

* `<repository>/magika_model/1/model.onnx`: the standard_v3_3 model;
* `<repository>/magika_prep/1/config.min.json`: its feature settings;
* `<repository>/magika_post/1/config.min.json` and
  `content_types_kb.min.json`: its labels, thresholds and text types.
"""

import os
import shutil
import sys

import magika


def main(repo):
    root = os.path.dirname(magika.__file__)
    model_dir = os.path.join(root, "models", magika.Magika._get_default_model_name())
    copies = [
        (os.path.join(model_dir, "model.onnx"), "magika_model"),
        (os.path.join(model_dir, "config.min.json"), "magika_prep"),
        (os.path.join(model_dir, "config.min.json"), "magika_post"),
        (os.path.join(root, "config", "content_types_kb.min.json"), "magika_post"),
    ]
    for src, model in copies:
        dst = os.path.join(repo, model, "1")
        os.makedirs(dst, exist_ok=True)
        shutil.copy(src, dst)
    print(f"copied Magika {magika.__version__} ({os.path.basename(model_dir)}) into {repo}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "model_repository")
