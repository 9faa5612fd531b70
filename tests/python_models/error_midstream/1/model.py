"""A decoupled model whose stream carries an error in the middle: for
N it sends I = 0 .. N-1, every odd one as an error response instead, then
the final flag alone. Errors do not end a stream; the final flag does."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):
                if i % 2:
                    error = pb_utils.TritonError(f"odd value {i} refused")
                    sender.send(pb_utils.InferenceResponse(error=error))
                else:
                    sender.send(pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor("I", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
