# What a request says about itself: its id, the client's timeout
# (microseconds, 0 when none) and its parameters, as Triton's
# InferenceRequest accessors give them.
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            info = {
                "request_id": request.request_id(),
                "timeout": request.timeout(),
                "parameters": json.loads(request.parameters()),
            }
            out = pb_utils.Tensor("OUT", np.array([json.dumps(info, sort_keys=True).encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
