# Idioms of Triton's own Python-backend test models (qa/python_models):
# pb_utils.Logger.log with its levels, unittest.main("model", exit=False)
# (which reads sys.argv), ndarray.flat indexing, np.repeat, np.ubyte, and
# as_numpy() giving the tensor's one array each time.
import json
import sys
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class IdiomsTest(unittest.TestCase):
    def test_repeat(self):
        self.assertEqual(np.repeat(np.array([1, 2], dtype=np.int32), 2).tolist(), [1, 1, 2, 2])


class TritonPythonModel:
    def initialize(self, args):
        logger = pb_utils.Logger
        logger.log("initialize: info", logger.INFO)
        logger.log("initialize: default level")
        logger.log_warn("initialize: warn")

    def execute(self, requests):
        logger = pb_utils.Logger
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            x = tensor.as_numpy()
            logger.log("execute: verbose", logger.VERBOSE)
            logger.log("execute: error level", logger.ERROR)
            result = unittest.main("model", exit=False, verbosity=0).result
            flat = np.array([x.flat[0], x.flat[-1], sum(int(v) for v in x.flat)], dtype=np.int64)
            report = {
                "argv": sys.argv,
                "tests_run": result.testsRun,
                "ok": result.wasSuccessful(),
                "flat_len": len(x.flat),
                "same_array": tensor.as_numpy() is x,
                "levels": [int(logger.INFO), int(logger.WARNING), int(logger.ERROR), int(logger.VERBOSE)],
            }
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("REPEATED", np.repeat(x, [2] + [1] * (len(x) - 1))),
                pb_utils.Tensor("FLAT", flat),
                pb_utils.Tensor("UBYTE", x.astype(np.ubyte)),
                pb_utils.Tensor("REPORT", np.array([json.dumps(report, sort_keys=True)], dtype=np.object_)),
            ]))
        return responses
