"""`ops_python`: exercises `tern_ops`' numpy-like surface on an input X
(FP32 [rows, cols], rows >= 2, cols >= 4; one row: its outer product's shape) and returns every result as JSON
(RESULT, one string); tests/test_ops.py computes the same with numpy."""

import json

import tern_ops as np
import tern_plugin as pb_utils


def results(x):
    if x.shape[0] == 1:
        # One row: its outer product (refused by the host when too large).
        return {"outer": list((x.T * x).shape)}
    y = np.array([[1.0, 2.0, 3.0, 4.0]], "FP32")
    parts = np.split(x[:, :4], 2, axis=1)
    return {
        "shape": list(x.shape),
        "dtype": x.dtype,
        "T": x.T.tolist(),
        "row1": x[1].tolist(),
        "col_last": x[:, -1].tolist(),
        "every_other": x[..., ::2].tolist(),
        "item": x[0, 1],
        "broadcast": (x[:, :4] * y + 1).tolist(),
        "rsub": (10 - x).tolist(),
        "rdiv": (1 / (x.clip(1, 5))).tolist(),
        "pow": (x ** 2).tolist(),
        "neg_abs": abs(-x).tolist(),
        "sum0": x.sum(axis=0).tolist(),
        "mean1": x.mean(axis=1).tolist(),
        "max": x.max(),
        "min1": x.min(axis=1).tolist(),
        "argmax1": x.argmax(axis=1).tolist(),
        "argmax": x.argmax(),
        "softmax": np.softmax(x, axis=-1).tolist(),
        "sigmoid": np.sigmoid(x).tolist(),
        "exp": np.exp(x.clip(-5, 5)).tolist(),
        "maximum": np.maximum(x, 0.5).tolist(),
        "round": np.round(x * 3).tolist(),
        "uint8": (x * 10).clip(0, 255).astype("uint8").tolist(),
        "split": [p.tolist() for p in parts],
        "concat": np.concatenate(parts[::-1], axis=1).tolist(),
        "expand": list(np.expand_dims(x, 0).shape),
        "squeeze": list(np.squeeze(np.expand_dims(x, 0)).shape),
        "reshape": x.reshape(-1).tolist(),
        "int_div": (np.array([[3, 4]], "INT32") / 2).tolist(),
        "frombuffer": np.frombuffer(bytes([1, 2, 3, 250]), "uint8", [2, 2]).astype("FP32").tolist(),
        "zeros": np.zeros((2, 3), "INT64").tolist(),
    }


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = np.from_input(request, "X")
            out = pb_utils.Tensor("RESULT", [json.dumps(results(x)).encode()], "BYTES", [1])
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses


Model = pb_utils.export(TritonPythonModel)
