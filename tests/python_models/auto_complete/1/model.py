"""A model whose config.pbtxt names only its backend: auto_complete_config
declares the tensors, a max batch size and dynamic batching; initialize and
execute report the completed config they were given."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

INPUTS = [
    {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
    {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
]
OUTPUTS = [
    {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
    {"name": "CONFIG", "data_type": "TYPE_STRING", "dims": [1]},
]


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config.as_dict()
        have = {t["name"] for t in config["input"]}
        for t in INPUTS:
            if t["name"] not in have:
                auto_complete_model_config.add_input(t)
        have = {t["name"] for t in config["output"]}
        for t in OUTPUTS:
            if t["name"] not in have:
                auto_complete_model_config.add_output(t)
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.seen = json.dumps({
            "max_batch_size": config["max_batch_size"],
            "dynamic_batching": "dynamic_batching" in config,
            "inputs": [t["name"] for t in config["input"]],
            "outputs": [t["name"] for t in config["output"]],
        }, sort_keys=True).encode()

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            seen = np.array([[self.seen]] * a.shape[0], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a * b + 1).astype(np.float32)),
                pb_utils.Tensor("CONFIG", seen),
            ]))
        return responses
