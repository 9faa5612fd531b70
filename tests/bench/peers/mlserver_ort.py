"""MLServer runtime for `make bench-peers`: one ONNX model run with ONNX Runtime.

model-settings.json names this class (`mlserver_ort.OrtRuntime`) and the
model file in `parameters.uri`; inputs and outputs are decoded/encoded with
MLServer's NumpyCodec, as a user's own runtime would do it. The session uses
ONNX Runtime's default thread settings (the same as the other servers).
MLServer runs it in its inference worker process (parallel_workers: 1, its
default) and adds its adaptive batcher in front where model-settings.json
sets max_batch_size and max_batch_time.
"""

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OrtRuntime(MLModel):
    async def load(self) -> bool:
        path = self.settings.parameters.uri  # absolute, written by peers.py
        self._session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        results = self._session.run(self._outputs, feeds)
        outputs = [NumpyCodec.encode_output(n, r) for n, r in zip(self._outputs, results)]
        for o in outputs:
            # Without NumpyCodec's `content_type` tag: perf_analyzer's JSON
            # reader takes any output `parameters` to hold binary_data_size.
            o.parameters = None
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
