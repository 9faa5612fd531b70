"""`empty_python`: answers every request with an empty response. The
per-call floor of a Python plugin (`make bench-lang`)."""

import tern_plugin as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse() for _ in requests]


Model = pb_utils.export(TritonPythonModel)
