"""`prep_python`: the example preprocessing job in Python, written the way a
Triton Python-backend `model.py` is (see docs/plugins.md, "Porting").

OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1 (FP32 [4], the
`add_sub` twin); TEXT (one string) is normalised to NORMALIZED (ASCII
lower-case, runs of whitespace collapsed to one space, trimmed) and split
into words hashed to TOKEN_IDS (FNV-1a 32 mod 30000 + 1, the first 8 words,
0-padded). The Rust, JavaScript and C versions give identical results.
"""

import json

import tern_plugin as pb_utils

MAX_TOKENS = 8
VOCAB = 30000


def fnv1a(word):
    h = 0x811C9DC5
    for b in word:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def normalize(text):
    words = text.lower().split()  # bytes: ASCII lower-case and ASCII whitespace
    ids = [fnv1a(w) % VOCAB + 1 for w in words[:MAX_TOKENS]]
    return b" ".join(words), ids + [0] * (MAX_TOKENS - len(ids))


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        pb_utils.Logger.log_info(f"{args['model_name']} ready on {args['model_instance_name']}")

    def execute(self, requests):
        # The add_sub part runs once for the whole batch.
        a = pb_utils.gather(requests, "INPUT0")
        b = pb_utils.gather(requests, "INPUT1")
        sums = a.split("OUTPUT0", [x + y for x, y in zip(a.values, b.values)])
        diffs = a.split("OUTPUT1", [x - y for x, y in zip(a.values, b.values)])

        responses = []
        for request, s, d in zip(requests, sums, diffs):
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_list()
            rows = [normalize(t) for t in texts]
            n = len(rows)
            norm = pb_utils.Tensor("NORMALIZED", [r[0] for r in rows], "BYTES", [n, 1])
            ids = pb_utils.Tensor("TOKEN_IDS", [i for r in rows for i in r[1]], "INT32", [n, MAX_TOKENS])
            responses.append(pb_utils.InferenceResponse(output_tensors=[s, d, norm, ids]))
        return responses


Model = pb_utils.export(TritonPythonModel)
