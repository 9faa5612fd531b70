"""`stream_python`: the decoupled test plugin in Python, written as a Triton
Python-backend decoupled `model.py` is: for each request, `COUNT` (INT32
[1]) responses `OUT` = 0, 1, ... through `request.get_response_sender()`,
then `TRITONSERVER_RESPONSE_COMPLETE_FINAL` alone; a negative `COUNT` is
answered with an error response (final); `COUNT` -3 with an error response
that leaves the stream open, then `OUT` = 7, then the final flag; `execute`
returns None. Request parameter
`delay_ms` sleeps before each response; a cancelled request stops early.
"""

import time

import tern_plugin as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_list()[0]
            delay = request.parameter("delay_ms", 0) / 1000
            if count == -3:
                error = pb_utils.TritonError("COUNT -3: an error response, the stream stays open",
                                             pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error))
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", [7], "INT32", [1])]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            if count < 0:
                error = pb_utils.TritonError(f"COUNT must be >= 0, got {count}", pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for i in range(count):
                if delay:
                    time.sleep(delay)
                if request.is_cancelled():
                    pb_utils.log("info", f"request cancelled after {i} of {count} responses")
                    break
                out = pb_utils.Tensor("OUT", [i], "INT32", [1])
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None


Model = pb_utils.export(TritonPythonModel)
