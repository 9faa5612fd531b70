"""A decoupled iterative model: a request asking for COUNT responses is run
through `execute` COUNT times, one response per run, rescheduling itself
until the last (request rescheduling with `iterative_sequence`). ACTIVE is
how many sequences have begun and not ended at each run, this one included:
1 while sequences run one after another on its one slot."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}  # correlation id -> (responses left, runs so far)

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
                self.left[key] = (count, 0)
            active = len(self.left)
            left, runs = self.left[key]
            left, runs = left - 1, runs + 1
            sender = request.get_response_sender()
            response = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("LEFT", np.array([left], np.int32)),
                pb_utils.Tensor("RUN", np.array([runs], np.int32)),
                pb_utils.Tensor("FLAGS", np.array([request.flags()], np.int32)),
                pb_utils.Tensor("HAS_ID", np.array([key != 0], np.bool_)),
                pb_utils.Tensor("ACTIVE", np.array([active], np.int32)),
            ])
            if left <= 0:
                del self.left[key]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self.left[key] = (left, runs)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
        return None
