# BYTES in and out: object arrays of bytes, as Triton hands them over.
import numpy as np
import triton_python_backend_utils as pb_utils

from helpers import shout  # a sibling module in the version folder


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([shout(t) for t in text.flatten()], dtype=np.object_).reshape(text.shape)
            lengths = np.array([len(t) for t in text.flatten()], dtype=np.int32).reshape(text.shape)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("UPPER", upper),
                pb_utils.Tensor("LENGTHS", lengths),
            ]))
        return responses
