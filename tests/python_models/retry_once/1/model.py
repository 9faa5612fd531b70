"""A non-decoupled model that reschedules every request once before it
answers: the first run returns None for it, the second the sum. A request
whose INPUT0[0] is negative gets a response on its first run while
rescheduled, which Triton refuses."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            key = request.correlation_id()
            runs = self.runs.get(key, 0) + 1
            response = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("RUNS", np.array([runs], np.int32)),
            ])
            if runs == 1:
                self.runs[key] = runs
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(response if a[0] < 0 else None)
            else:
                del self.runs[key]
                responses.append(response)
        return responses
