#!/usr/bin/env python3
"""TorchScript models and Triton configs for the pytorch backend's tests and
benchmark, generated with torch (the models are not committed).

    gen_torch_models.py OUT_DIR [--wasm-dir DIR]

Each model is a folder `OUT_DIR/<name>/` with `config.pbtxt` and
`1/model.pt`, written the way Triton users write them. `MODELS` lists the
name, the module and the config of each; `reference(name)` loads a model
with `torch.jit.load` for comparisons.
"""

import argparse
import os
import shutil
from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn


class SmallCnn(nn.Module):
    """An image classifier: conv, pool, conv, global pool, linear, softmax."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(x, 2)
        x = torch.relu(self.conv2(x))
        x = x.mean(dim=(2, 3))
        return torch.softmax(self.fc(x), dim=1)


class TupleOut(nn.Module):
    """Two named arguments in, a tuple of three tensors (FP32, FP32, INT64) out."""

    def forward(self, a: Tensor, b: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        return a + b, a * b, torch.argmax(a - b, dim=1)


class SeqEncoder(nn.Module):
    """Token ids of any length to a normalised embedding (dynamic sequence length)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 12)
        self.gru = nn.GRU(12, 8, batch_first=True)

    def forward(self, ids: Tensor) -> Tensor:
        out, _ = self.gru(self.emb(ids.remainder(100)))
        return torch.nn.functional.normalize(out.mean(dim=1), dim=1)


class Strings(nn.Module):
    """Strings in, strings and their lengths out (List[str] both ways)."""

    def forward(self, text: List[str]) -> Tuple[List[str], Tensor]:
        upper = [s.upper() + "!" for s in text]
        lengths = torch.tensor([len(s) for s in text], dtype=torch.int32)
        return upper, lengths


class DictIn(nn.Module):
    """One Dict[str, Tensor] argument: the inputs by name."""

    def forward(self, inputs: Dict[str, Tensor]) -> Tensor:
        return inputs["alpha"] * 2.0 - inputs["beta"]


class DictOut(nn.Module):
    """A Dict[str, Tensor] result, taken by output name."""

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        return {"doubled": x * 2.0, "total": x.sum(dim=1, keepdim=True)}


class ListOut(nn.Module):
    """A List[Tensor] result."""

    def forward(self, x: Tensor) -> List[Tensor]:
        return [x.sqrt(), x.square()]


class InPlace(nn.Module):
    """Doubles its input in place and returns it (the input's memory is the model's to write)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.mul_(2.0)


class Raises(nn.Module):
    """Raises from forward when any input is negative."""

    def forward(self, x: Tensor) -> Tensor:
        if bool((x < 0).any()):
            raise ValueError("negative input")
        return x + 1.0


class AllTypes(nn.Module):
    """Every LibTorch type Triton maps, each passed through with +1 (or logical not)."""

    def forward(
        self, b: Tensor, u8: Tensor, i8: Tensor, i16: Tensor, i32: Tensor, i64: Tensor, f16: Tensor, f32: Tensor,
        f64: Tensor, bf16: Tensor
    ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        return (~b, u8 + 1, i8 + 1, i16 + 1, i32 + 1, i64 + 1, f16 + 1, f32 + 1, f64 + 1, bf16 + 1)


class TokenHead(nn.Module):
    """The ensemble's TorchScript step: token ids (from a WASM plugin) to class scores."""

    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(1000, 6, mode="mean")
        self.fc = nn.Linear(6 + 4, 3)

    def forward(self, ids: Tensor, features: Tensor) -> Tensor:
        pooled = self.emb(ids.long().remainder(1000))
        return torch.softmax(self.fc(torch.cat([pooled, features], dim=1)), dim=1)


class BenchCnn(nn.Module):
    """The benchmark's model: a VGG-style CNN on 3x128x128 images (several ms per image on 2 cores)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        blocks = []
        for cin, cout in [(32, 64), (64, 64), (64, 128), (128, 128), (128, 256)]:
            blocks += [nn.Conv2d(cin, cout, 3, stride=2 if cin != cout else 1, padding=1), nn.BatchNorm2d(cout),
                       nn.ReLU()]
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(256, 100)

    def forward(self, x: Tensor) -> Tensor:
        x = self.body(self.stem(x))
        return torch.softmax(self.head(x.mean(dim=(2, 3))), dim=1)


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: Tensor) -> Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


class ResNet18(nn.Module):
    """ResNet-18 as torchvision builds it (3x224x224 in, 1000 class scores out), randomly initialised."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        layers = []
        cin = 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, 1000)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.layers(self.stem(x)).mean(dim=(2, 3)))


# The benchmark's models: name, module, input shape, classes, batch limit and the dynamic batcher's
# settings. BenchCnn runs slower per image at batch 16 than at batch 1-12 in LibTorch on two
# cores, so its batcher prefers batches of 8 (a per-model tuning, as a Triton user would do it).
BENCH_MODELS = {
    "torch_bench": (BenchCnn, [3, 128, 128], 100, 16, "dynamic_batching { preferred_batch_size: [ 8 ] }"),
    "torch_resnet18": (ResNet18, [3, 224, 224], 1000, 8, "dynamic_batching { }"),
}


def write_bench(out):
    """The benchmark's models, each twice: `plain/<name>` (no batcher) and `dyn/<name>_dyn`
    (dynamic batching)."""
    for name, (cls, dims, classes, max_batch, batcher) in BENCH_MODELS.items():
        torch.manual_seed(0)
        module = torch.jit.script(cls().eval())
        body = f"""
max_batch_size: {max_batch}
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: {dims} }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {classes} ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
        for repo, model, extra in [("plain", name, ""), ("dyn", f"{name}_dyn", batcher + "\n")]:
            os.makedirs(os.path.join(out, repo, model, "1"), exist_ok=True)
            module.save(os.path.join(out, repo, model, "1", "model.pt"))
            with open(os.path.join(out, repo, model, "config.pbtxt"), "w") as f:
                f.write(_config(model, body + extra))


def _config(name, body):
    return f'name: "{name}"\nplatform: "pytorch_libtorch"\n{body.strip()}\n'


MODELS = {
    "torch_cnn": (SmallCnn, """
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 10000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""),
    "torch_tuple": (TupleOut, """
max_batch_size: 4
input [
  { name: "b" data_type: TYPE_FP32 dims: [ 5 ] },
  { name: "a" data_type: TYPE_FP32 dims: [ 5 ] }
]
output [
  { name: "OUTPUT__2" data_type: TYPE_INT64 dims: [ 1 ] reshape: { shape: [ ] } },
  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 5 ] },
  { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 5 ] }
]
"""),
    "torch_seq": (SeqEncoder, """
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 8 ] } ]
dynamic_batching { }
"""),
    "torch_strings": (Strings, """
max_batch_size: 0
input [ { name: "text" data_type: TYPE_STRING dims: [ -1 ] } ]
output [
  { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "OUTPUT__1" data_type: TYPE_INT32 dims: [ -1 ] }
]
"""),
    "torch_dict_in": (DictIn, """
max_batch_size: 4
input [
  { name: "alpha" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "beta" data_type: TYPE_FP32 dims: [ 3 ] }
]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""),
    "torch_dict_out": (DictOut, """
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [
  { name: "total" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "doubled" data_type: TYPE_FP32 dims: [ 3 ] }
]
"""),
    "torch_list_out": (ListOut, """
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""),
    "torch_inplace": (InPlace, """
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""),
    "torch_raises": (Raises, """
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100000 }
"""),
    "torch_types": (AllTypes, "max_batch_size: 2\ninput [\n" + ",\n".join(
        f'  {{ name: "{n}" data_type: TYPE_{t} dims: [ 3 ] }}'
        for n, t in [("b", "BOOL"), ("u8", "UINT8"), ("i8", "INT8"), ("i16", "INT16"), ("i32", "INT32"),
                     ("i64", "INT64"), ("f16", "FP16"), ("f32", "FP32"), ("f64", "FP64"), ("bf16", "BF16")]
    ) + "\n]\noutput [\n" + ",\n".join(
        f'  {{ name: "OUT__{i}" data_type: TYPE_{t} dims: [ 3 ] }}'
        for i, t in enumerate(["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BF16"])
    ) + "\n]\n"),
    "torch_token_head": (TokenHead, """
max_batch_size: 8
input [
  { name: "ids" data_type: TYPE_INT32 dims: [ 8 ] },
  { name: "features" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { }
"""),
}

# The ensemble: the prep_rust WASM plugin's token ids and features into the TorchScript head.
ENSEMBLE = """
name: "torch_pipeline"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 3 ] } ]
ensemble_scheduling { step [
  { model_name: "prep_rust" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" }
    input_map { key: "INPUT1" value: "INPUT1" }
    input_map { key: "TEXT" value: "TEXT" }
    output_map { key: "TOKEN_IDS" value: "ids" }
    output_map { key: "OUTPUT0" value: "features" } },
  { model_name: "torch_token_head" model_version: -1
    input_map { key: "ids" value: "ids" }
    input_map { key: "features" value: "features" }
    output_map { key: "OUTPUT__0" value: "SCORES" } }
] }
"""


def write(out, wasm_dir=None):
    """Writes every model (and, given the plugins' folder, the ensemble) under `out`."""
    torch.manual_seed(0)
    for name, (cls, body) in MODELS.items():
        d = os.path.join(out, name, "1")
        os.makedirs(d, exist_ok=True)
        module = cls().eval()
        torch.jit.script(module).save(os.path.join(d, "model.pt"))
        with open(os.path.join(out, name, "config.pbtxt"), "w") as f:
            f.write(_config(name, body))
    if wasm_dir:
        prep = os.path.join(out, "prep_rust")
        os.makedirs(os.path.join(prep, "1"), exist_ok=True)
        shutil.copy(os.path.join(wasm_dir, "prep_rust.wasm"), os.path.join(prep, "1", "model.wasm"))
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        shutil.copy(os.path.join(root, "model_repository", "prep_rust", "config.pbtxt"), prep)
        os.makedirs(os.path.join(out, "torch_pipeline", "1"), exist_ok=True)
        with open(os.path.join(out, "torch_pipeline", "config.pbtxt"), "w") as f:
            f.write(ENSEMBLE.strip() + "\n")


def reference(out, name):
    """The model as Python's torch.jit.load gives it (for comparisons)."""
    return torch.jit.load(os.path.join(out, name, "1", "model.pt")).eval()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--wasm-dir")
    a = ap.parse_args()
    write(a.out, a.wasm_dir)
