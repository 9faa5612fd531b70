"""`misbehave_python`: a test plugin in Python that misbehaves on request,
to check that the sandbox contains a Python guest the same way as a Rust
one. MODE (one string) selects: "ok" echoes, "loop" never returns, "memory"
allocates without bound, "raise" raises a plain exception, "triton_error"
raises TritonError(INVALID_ARG), "wrong_count" returns no responses,
"bad_response" returns something that is not a response, "print" writes
to stdout and stderr (which go to the server's log), "sleep" sleeps 20 s,
"codecs" decodes with codecs Python imports on first use (cp1252,
shift_jis), "async" runs an `async def` path that awaits a BLS call,
"repo_file" reads data.txt the way Triton models do, through
`args["model_repository"]` and `args["model_version"]`.
"""

import os
import sys
import time

import tern_plugin as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version_dir = os.path.join(args["model_repository"], args["model_version"])

    def execute(self, requests):
        modes = [pb_utils.get_input_tensor_by_name(r, "MODE").as_strings()[0] for r in requests]
        if "loop" in modes:
            n = 0
            while True:
                n += 1
        if "sleep" in modes:
            time.sleep(20)
        if "repo_file" in modes:
            with open(os.path.join(self.version_dir, "data.txt")) as f:
                text = f.read().strip()
            return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", [text], "BYTES", [1])])
                    for _ in requests]
        if "codecs" in modes:
            text = b"\x80 caf\xe9".decode("cp1252") + " " + b"\x83e\x83X\x83g".decode("shift_jis")
            return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", [text], "BYTES", [1])])
                    for _ in requests]
        if "async" in modes:
            return _run_async(requests)
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


class AsyncModel:
    """An `async def execute`, as Triton allows: awaits a BLS call to prep_c."""

    async def execute(self, requests):
        out = []
        for r in requests:
            call = pb_utils.InferenceRequest("prep_c", [
                pb_utils.Tensor("INPUT0", [1.0, 2.0, 3.0, 4.0], "FP32", [1, 4]),
                pb_utils.Tensor("INPUT1", [1.0, 1.0, 1.0, 1.0], "FP32", [1, 4]),
                pb_utils.Tensor("TEXT", ["x"], "BYTES", [1, 1]),
            ], ["OUTPUT0"])
            resp = await call.async_exec()
            if resp.has_error():
                raise resp.error()
            sums = ",".join(str(v) for v in resp.output_tensors()[0].as_list())
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", [f"async {sums}"], "BYTES", [1])]))
        return out


def _run_async(requests):
    # Returning the coroutine is what an `async def execute` does: export() runs it.
    return AsyncModel().execute(requests)


Model = pb_utils.export(TritonPythonModel)
