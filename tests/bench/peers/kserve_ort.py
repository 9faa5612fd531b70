"""KServe model server for `make bench-peers`: ONNX models run with ONNX Runtime.

    python kserve_ort.py --http-port 8080 --grpc-port 8081 --model simple=/path/model.onnx [--model ...]

One `kserve.Model` per model, serving the v2 protocol over REST (with the
binary tensor extension) and gRPC. `predict` is a plain method, as in
KServe's custom-model examples: the server calls it on its event loop, so
one inference runs at a time (KServe has no batcher). Metadata (inputs and
outputs, batch dimension as -1) comes from the ONNX session, which uses ONNX
Runtime's default thread settings. Per-request logging is off.

perf_analyzer needs Triton's model-configuration read, which KServe lacks:
it is added here over REST and gRPC (see model_config.py).
"""

import argparse
import logging

import kserve
import kserve.model_server
import kserve.protocol.grpc.server as kserve_grpc
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse
from kserve.utils.numpy_codec import from_np_dtype
from kserve.utils.utils import generate_uuid

import model_config

DTYPES = {"tensor(float)": "FP32", "tensor(int32)": "INT32", "tensor(int64)": "INT64", "tensor(uint8)": "UINT8"}


def _meta(args):
    return [{"name": a.name, "datatype": DTYPES[a.type], "shape": [d if isinstance(d, int) else -1 for d in a.shape]} for a in args]


class OrtModel(kserve.Model):
    def __init__(self, name, path):
        super().__init__(name)
        self.path = path
        self.load()

    def load(self):
        self.session = ort.InferenceSession(self.path, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.ready = True
        return self.ready

    def get_input_types(self):
        return _meta(self.session.get_inputs())

    def get_output_types(self):
        return _meta(self.session.get_outputs())

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        feeds = {i.name: i.as_numpy() for i in payload.inputs}
        results = self.session.run(self.output_names, feeds)
        # Raw bytes for gRPC and for REST requests that ask for binary outputs
        # (request-wide `binary_data_output`, or `binary_data` on each requested
        # output, as Triton's clients send it); a JSON list otherwise.
        requested = payload.request_outputs or []
        binary = payload.use_binary_outputs or (bool(requested) and all(o.binary_data for o in requested))
        outputs = []
        for name, r in zip(self.output_names, results):
            out = InferOutput(name=name, shape=list(r.shape), datatype=from_np_dtype(r.dtype))
            out.set_data_from_numpy(r, binary_data=binary)
            outputs.append(out)
        return InferResponse(
            response_id=payload.id or generate_uuid(),
            model_name=self.name,
            infer_outputs=outputs,
            use_binary_outputs=payload.use_binary_outputs,
            requested_outputs=payload.request_outputs,  # their per-output binary_data flags
        )


def add_model_config_endpoints():
    async def config(model_name: str):
        return model_config.config_json(model_name)

    kserve.model_server.app.add_api_route("/v2/models/{model_name}/config", config, methods=["GET"])
    pb2_grpc = kserve_grpc.grpc_predict_v2_pb2_grpc
    add_servicer = pb2_grpc.add_GRPCInferenceServiceServicer_to_server

    def add_with_config(servicer, server):
        add_servicer(servicer, server)
        server.add_generic_rpc_handlers((model_config.grpc_handler(),))

    pb2_grpc.add_GRPCInferenceServiceServicer_to_server = add_with_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--model", action="append", required=True, help="NAME=PATH.onnx")
    a, _ = ap.parse_known_args()
    add_model_config_endpoints()
    models = [OrtModel(*m.split("=", 1)) for m in a.model]
    server = kserve.ModelServer(http_port=a.http_port, grpc_port=a.grpc_port, workers=1, enable_latency_logging=False)
    # No per-request log lines (uvicorn's access log, KServe's timing trace),
    # as with the other servers.
    # "kserve" itself logs every gRPC call at INFO (its LoggingInterceptor).
    for name in ("uvicorn.access", "kserve.trace", "kserve"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start(models)


if __name__ == "__main__":
    main()
