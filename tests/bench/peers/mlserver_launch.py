"""Starts MLServer (`mlserver start FOLDER`) with Triton's model-config read
added (model_config.py): `python mlserver_launch.py FOLDER`."""

import sys

import mlserver.grpc.server as grpc_server
import mlserver.rest.server as rest_server
from mlserver.cli.main import main

import model_config

_create_app = rest_server.create_app
_add_servicer = grpc_server.add_GRPCInferenceServiceServicer_to_server


def create_app(*args, **kwargs):
    app = _create_app(*args, **kwargs)

    async def config(model_name: str):
        return model_config.config_json(model_name)

    app.add_api_route("/v2/models/{model_name}/config", config, methods=["GET"])
    return app


def add_servicer(servicer, server):
    _add_servicer(servicer, server)
    server.add_generic_rpc_handlers((model_config.grpc_handler(),))


rest_server.create_app = create_app
grpc_server.add_GRPCInferenceServiceServicer_to_server = add_servicer

if __name__ == "__main__":
    sys.argv = ["mlserver", "start", sys.argv[1]]
    main()
