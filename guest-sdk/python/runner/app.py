"""Tern's Python runner: the one prebuilt component that serves Triton
Python-backend models (`backend: "python"`) as they are. At `initialize` it
imports `<version>/model.py` (or the config's `default_model_filename`)
from the version folder the host pre-opens read-only, as Triton's stub
does: as the module `<version>.model` (relative imports find its siblings),
with the folder on `sys.path` for sibling modules, `triton_python_backend_utils` and the
runner's `numpy` importable, and forwards `initialize`, `execute` and
`finalize` to its `TritonPythonModel`.

Built once by `make python-runner` (`tern plugin build` of this folder):
componentize-py keeps only the modules imported while it builds, so the
whole standard library is imported here, at build time, and every stdlib
import of a model costs nothing at run time.
"""

import importlib
import importlib.util
import json
import os
import pkgutil
import sys
import types

import tern_plugin

# --- build time: the standard library, snapshotted ---------------------------

# Not for a sandboxed server model: GUIs, the test suite, installers, REPLs.
_SKIP = {
    "idlelib", "tkinter", "turtle", "turtledemo", "test", "ensurepip", "lib2to3", "antigravity", "this",
    "__phello__", "__hello__", "_pyrepl", "pydoc", "pydoc_data", "site-packages", "venv", "_tkinter",
}


def _preload_stdlib():
    # componentize-py mounts the standard library at /python while it builds.
    if not os.path.isdir("/python"):
        return
    saved = list(sys.path)
    for m in pkgutil.walk_packages(["/python"], onerror=lambda name: None):
        if m.name.split(".")[0] in _SKIP or m.name.startswith("numpy"):
            continue
        try:
            importlib.import_module(m.name)
        except BaseException:  # noqa: BLE001 (modules that need what WASI lacks stay out)
            pass
    sys.path[:] = saved


_preload_stdlib()

import numpy  # noqa: E402 (the runner's numpy, snapshotted with the rest)
import triton_python_backend_utils  # noqa: E402,F401

import sandbox_asyncio  # noqa: E402

sandbox_asyncio.install()
numpy._host_arrays()  # tensors' values stay in the host while its kernels can compute on them


# --- what the sandbox has no room for: a clear error at the call ----------------

_NO_THREADS = ("the sandbox has no threads: send a decoupled model's responses from execute itself, or make "
               "execute `async def` and run asyncio tasks (asyncio.create_task, asyncio.gather)")
_NO_PROCESSES = ("the sandbox cannot start processes: call other models with BLS "
                 "(pb_utils.InferenceRequest(...).exec()) or do the work in Python")


def _refuse(call, why):
    """Replaces `call` (a thread or process start) with one that raises
    UNSUPPORTED naming the call, the model's file and line, and what to do
    instead. (Found at run time rather than when the model loads: a model
    whose other code paths never start a thread keeps serving.)"""
    def refused(*args, **kwargs):
        where = ""
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename.startswith("/models/"):
                where = f"{os.path.basename(frame.f_code.co_filename)} line {frame.f_lineno} "
                break
            frame = frame.f_back
        raise tern_plugin.TritonError(f"{where}calls {call}: {why}", tern_plugin.TritonError.UNSUPPORTED)
    return refused


def _refuse_threads_and_processes():
    import subprocess
    import threading

    threading.Thread.start = _refuse("threading.Thread.start()", _NO_THREADS)
    # subprocess.run, call, check_output, ... all start a Popen.
    subprocess.Popen = _refuse("subprocess.Popen()", _NO_PROCESSES)
    for name in ("system", "popen", "fork", "forkpty", "spawnv", "spawnve", "posix_spawn"):
        if hasattr(os, name):
            setattr(os, name, _refuse(f"os.{name}()", _NO_PROCESSES))
    try:
        import multiprocessing.process
    except ImportError:  # not in the sandbox's standard library
        return
    multiprocessing.process.BaseProcess.start = _refuse("multiprocessing.Process.start()", _NO_PROCESSES)


_refuse_threads_and_processes()

# --- run time ------------------------------------------------------------------

# What cannot run in the sandbox, and what to do instead.
_NATIVE = {
    "torch": "serve the network with backend: \"pytorch\" (TorchScript) or \"onnxruntime\" and call it with BLS",
    "tensorflow": "convert the network to ONNX and call it with BLS",
    "cupy": "GPU arrays are not available in the sandbox; use the runner's numpy",
    "cv2": "use tern_ops.cv2 (host image kernels)",
    "PIL": "use tern_ops.cv2 (host image kernels)",
    "scipy": "use the runner's numpy subset",
    "pandas": "use the runner's numpy subset",
    "transformers": "use a tokenizer plugin or the host kernels",
}


def _explain_import(e, path):
    name = (e.name or "").split(".")[0]
    line = ""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line = f" (line {tb.tb_lineno})"
        tb = tb.tb_next
    hint = _NATIVE.get(name)
    if hint:
        why = f"'{name}' is a native extension module, which cannot run inside Tern's WebAssembly sandbox: {hint}"
    else:
        why = (f"no module named '{name}' in the sandbox: Python modules beside model.py import, the standard "
               "library and numpy (a subset) are built in, native extension modules cannot run")
    return tern_plugin.TritonError(f"{os.path.basename(path)}{line} imports '{e.name}': {why}",
                                   tern_plugin.TritonError.UNSUPPORTED)


def _model_class(args):
    """Imports the model file named by the config from the version folder
    and returns its `TritonPythonModel` class."""
    config = json.loads(args["model_config"])
    filename = config.get("default_model_filename") or "model.py"
    folder = os.path.join(args["model_repository"], args["model_version"])
    path = os.path.join(folder, filename)
    if not os.path.isfile(path):
        raise tern_plugin.TritonError(
            f"'{filename}' is not in the version folder {args['model_version']}/ (backend \"python\")",
            tern_plugin.TritonError.NOT_FOUND)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # sibling modules and packages of model.py
    # Triton's stub embeds Python with sys.argv == [""]; code such as
    # `unittest.main("model", exit=False)` reads sys.argv[0]. (Set when the
    # model loads: the runtime starts each instance with an empty argv.)
    if not sys.argv:
        sys.argv.append("")
    # As Triton's stub does, the file is imported as `<version>.<name>`, the
    # version folder a package, so `from . import helper` finds its siblings.
    version = str(args["model_version"])
    package = sys.modules.get(version)
    if getattr(package, "__path__", None) != [folder]:
        package = types.ModuleType(version)
        package.__path__ = [folder]
        package.__package__ = version
        sys.modules[version] = package
    name = f"{version}.{filename[:-3] if filename.endswith('.py') else filename}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as e:
        raise _explain_import(e, path) from None
    except SyntaxError as e:
        raise tern_plugin.TritonError(
            f"{filename} line {e.lineno}: {e.msg}", tern_plugin.TritonError.INVALID_ARG) from None
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise tern_plugin.TritonError(f"{filename} defines no class TritonPythonModel",
                                      tern_plugin.TritonError.INVALID_ARG)
    return model_class


# The parameter of the one request the host sends, before any `initialize`,
# to run `auto_complete_config`: the config as JSON; the answer carries the
# completed config in its `config` parameter.
AUTO_COMPLETE = "tern.auto_complete_config"


def _auto_complete(request):
    """Runs `TritonPythonModel.auto_complete_config` (a static method, as in
    Triton) on the config the host sent and returns the completed config."""
    params = {p.key: tern_plugin._param_value(p.value) for p in request.parameters}
    config_json = params[AUTO_COMPLETE]
    args = {"model_config": config_json, "model_repository": params["tern.model_repository"],
            "model_version": str(params["tern.model_version"])}
    model_class = _model_class(args)
    model_config = triton_python_backend_utils.ModelConfig(config_json)
    if hasattr(model_class, "auto_complete_config"):
        model_config = model_class.auto_complete_config(model_config)
        if not isinstance(model_config, triton_python_backend_utils.ModelConfig):
            name = json.loads(config_json).get("name", "")
            raise tern_plugin.TritonError(
                f"auto_complete_config function in model '{name}' must return a valid pb.ModelConfig object.")
    return json.dumps(model_config.as_dict())


class _Runner:
    """Forwards to the model file's `TritonPythonModel`."""

    def __init__(self):
        self._model = None

    def initialize(self, args):
        model_class = _model_class(args)
        self._model = model_class()
        if hasattr(self._model, "initialize"):
            return self._model.initialize(args)
        return None

    def execute(self, requests):
        return self._model.execute(requests)

    def finalize(self):
        if self._model is not None and hasattr(self._model, "finalize"):
            return self._model.finalize()
        return None


_Exported = tern_plugin.export(_Runner)
_initialized = []


class Model(_Exported):
    """The exported model: `_Runner` behind Tern's SDK, plus the
    auto-complete request the host sends before `initialize`."""

    def initialize(self, ctx):
        _initialized.append(True)
        return super().initialize(ctx)

    def execute(self, requests):
        if not _initialized and len(requests) == 1 and any(p.key == AUTO_COMPLETE for p in requests[0].parameters):
            try:
                config = _auto_complete(requests[0])
            except Exception as e:  # noqa: BLE001 (every failure fails the load)
                return [tern_plugin.Err(tern_plugin._as_error(e))]
            return [tern_plugin.InferenceResponse(parameters={"config": config})._wit()]
        return super().execute(requests)
