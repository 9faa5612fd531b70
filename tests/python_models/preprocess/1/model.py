# numpy pre-processing as image models do it: HWC uint8 -> normalised CHW
# float32, plus an argmax per channel.
import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            chw = images.astype(np.float32).transpose(0, 3, 1, 2) / np.float32(255.0)
            normalised = ((chw - MEAN) / STD).astype(np.float32)
            flat = images.reshape(images.shape[0], -1, 3)
            brightest = np.argmax(flat, axis=1).astype(np.int64)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("TENSOR", normalised),
                pb_utils.Tensor("BRIGHTEST", brightest),
            ]))
        return responses
