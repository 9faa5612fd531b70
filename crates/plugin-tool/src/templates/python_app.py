"""`{{name}}`: OUTPUT0 = INPUT0 * 2, written like a Triton Python-backend model.py."""

import tern_plugin as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(f"{args['model_name']} ready on {args['model_instance_name']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            y = pb_utils.Tensor("OUTPUT0", [v * 2 for v in x.as_array()], "FP32", x.shape())
            responses.append(pb_utils.InferenceResponse(output_tensors=[y]))
        return responses


Model = pb_utils.export(TritonPythonModel)
