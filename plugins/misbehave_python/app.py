"""`misbehave_python`: a test plugin in Python that misbehaves on request,
to check that the sandbox contains a Python guest the same way as a Rust
one. MODE (one string) selects: "ok" echoes, "loop" never returns, "memory"
allocates without bound, "raise" raises a plain exception, "triton_error"
raises TritonError(INVALID_ARG), "wrong_count" returns no responses,
"bad_response" returns something that is not a response, "print" writes
to stdout and stderr (which go to the server's log), "sleep" sleeps 20 s.
"""

import sys
import time

import tern_plugin as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        modes = [pb_utils.get_input_tensor_by_name(r, "MODE").as_strings()[0] for r in requests]
        if "loop" in modes:
            n = 0
            while True:
                n += 1
        if "sleep" in modes:
            time.sleep(20)
        if "memory" in modes:
            hoard = []
            while True:
                hoard.append(bytearray(1 << 20))
        if "raise" in modes:
            raise ValueError("asked to raise")
        if "triton_error" in modes:
            raise pb_utils.TritonError("asked for an INVALID_ARG error", pb_utils.TritonError.INVALID_ARG)
        if "wrong_count" in modes:
            return []
        if "bad_response" in modes:
            return ["not a response" for _ in requests]
        if "print" in modes:
            print("hello from print")
            print("and from stderr", file=sys.stderr)
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", [m], "BYTES", [1])])
            for m in modes
        ]


Model = pb_utils.export(TritonPythonModel)
