"""`topk_python`: classifier post-processing on the host kernels from
Python with `tern_ops`' numpy-like surface: LOGITS (FP32 [n]) -> PROBS
(softmax, FP32 [n]) and TOP (indices of the 3 largest, INT64 [3]). Written
as numpy code would be (`np.exp(x - x.max()) / sum`, `argsort`-free top-k)
to exercise the array type; the JavaScript and C twins call the kernels
directly."""

import tern_ops as np
import tern_plugin as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = np.from_input(request, "LOGITS")          # [1, n]
            e = np.exp(x - x.max(axis=1).reshape(-1, 1))
            probs = e / e.sum(axis=1).reshape(-1, 1)
            _, top = np.top_k(probs, 3, axis=1)
            np.set_output(request, "PROBS", probs)
            np.set_output(request, "TOP", top)
            responses.append(pb_utils.InferenceResponse(output_tensors=[]))
        return responses


Model = pb_utils.export(TritonPythonModel)
