# A Triton Python-backend sequence model, unchanged on both servers: it sums
# each sequence's INPUT (keyed by its CORRID control), and says where the
# request ran: BATCH = [requests in this execute call, this request's row,
# READY]. INPUT >= 1,000,000 sleeps INPUT - 1,000,000 ms first (the tests'
# blocker, which holds the instance while the next batches queue up).
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for row, request in enumerate(requests):
            def value(name):
                return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])

            x, ready = value("INPUT"), value("READY")
            corrid, start, end = value("CORRID"), value("START"), value("END")
            if x >= 1_000_000:
                time.sleep((x - 1_000_000) / 1000)
            total = 0
            if ready:
                total = x if start else self.sums.get(corrid, 0) + x
                self.sums[corrid] = total
                if end:
                    self.sums.pop(corrid, None)
            out = pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int32))
            batch = pb_utils.Tensor("BATCH", np.array([[len(requests), row, ready]], dtype=np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out, batch]))
        return responses
