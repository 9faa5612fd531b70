"""`nudenet_prep`: the preprocessing of nudenet's `NudeDetector` (its
`_read_image`), ported from OpenCV + numpy to `tern_ops` line for line:
decode, pad to a square (bottom/right), resize to the detector's input,
scale to [0, 1] as an NCHW FP32 blob. Pixels stay on the host: the blob
becomes the `images` output without entering the plugin.

IMAGE (BYTES [1]: JPEG/PNG/WebP/BMP) -> images (FP32 [3, S, S]) and
META (FP32 [4]: original width, original height, x padding, y padding),
S = the `input_size` parameter (320).
"""

import json

import tern_plugin as pb_utils
from tern_ops import cv2
import tern_ops as np


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        self.size = int(params.get("input_size", {}).get("string_value", "320"))

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                data = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_list()[0]
                mat = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
                width, height = mat.shape[1], mat.shape[0]
                mat_c3 = cv2.cvtColor(mat, cv2.COLOR_RGBA2BGR)
                max_size = max(mat_c3.shape[:2])
                x_pad = max_size - mat_c3.shape[1]
                y_pad = max_size - mat_c3.shape[0]
                mat_pad = cv2.copyMakeBorder(mat_c3, 0, y_pad, 0, x_pad, cv2.BORDER_CONSTANT)
                blob = cv2.dnn.blobFromImage(mat_pad, 1 / 255.0, (self.size, self.size), (0, 0, 0), swapRB=True)
                np.set_output(request, "images", blob)
                meta = pb_utils.Tensor("META", [width, height, x_pad, y_pad], "FP32", [1, 4])
                responses.append(pb_utils.InferenceResponse(output_tensors=[meta]))
            except pb_utils.TritonError as e:
                responses.append(e)
        return responses


Model = pb_utils.export(TritonPythonModel)
