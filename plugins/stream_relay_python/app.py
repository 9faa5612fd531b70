"""`stream_relay_python`: streaming BLS in Python, as a Triton Python model
writes it: `InferenceRequest(...).exec(decoupled=True)` on the model named by
the `target` parameter (default `stream_count`), answering with every `OUT`
it streamed back, in order, as `OUTS` (INT32 [n])."""

import json

import tern_plugin as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.target = params.get("target", {}).get("string_value", "stream_count")

    def execute(self, requests):
        responses = []
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "COUNT")
            outs = []
            error = None
            bls = pb_utils.InferenceRequest(model_name=self.target, inputs=[count], requested_output_names=["OUT"])
            for response in bls.exec(decoupled=True):
                if response.has_error():
                    error = response.error()
                    break
                outs.extend(pb_utils.get_output_tensor_by_name(response, "OUT").as_list())
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTS", outs, "INT32", [len(outs)])]))
        return responses


Model = pb_utils.export(TritonPythonModel)
