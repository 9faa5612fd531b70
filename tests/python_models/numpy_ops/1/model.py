# numpy array work on request-sized tensors: float arithmetic with
# broadcasting and scalars, casts, transposes, reshapes (views included),
# argmax. Each result goes out as one BYTES element,
# b"name\0dtype\0shape\0" + its bytes, for the client to compare with numpy;
# a last element, b"held\0" + JSON, names the results Tern's runner kept in
# the host (none on Triton).
import json

import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
WIDE = np.array([0.1, 1e300, -2.5], dtype=np.float64).reshape(3, 1, 1)


def results(inputs):
    # A fresh array of each input for every result: reading one array's
    # values (x[::-1]) does not change how the next result is computed.
    def fresh(name):
        return lambda: inputs[name].copy()

    x, u, i, d = fresh("X"), fresh("U"), fresh("I"), fresh("D")
    out = {}
    out["add"] = x() + x()[::-1]
    out["sub"] = x() - x() * 0.5
    out["mul"] = x() * x()
    out["div"] = x() / x()[:, ::-1]
    out["div_zero"] = x() / 0.0
    out["rdiv"] = 1.0 / x()
    out["rsub"] = 3 - x()
    out["scalar_f32"] = x() / np.float32(255.0) + np.float32(0.1)
    out["scalar_py"] = x() * 0.1 + 1e-3
    out["radd_rmul"] = 2.5 + np.float32(3.0) * x()
    # A small constant changed between two uses (-0.0 against 0.0: equal
    # as numbers, not as bits): the second product sees the change.
    m = np.array([0.0, 1.0, 2.0], dtype=np.float32).reshape(3, 1, 1)
    out["small_first"] = x() * m
    m[0] = -0.0
    out["small_changed"] = x() * m
    out["broadcast_channel"] = (x() - MEAN) / MEAN
    out["broadcast_wide"] = x() * WIDE
    out["mixed_f64"] = x() + d().reshape(2, 3, 16, 16)
    out["f64"] = d() * 3.3 - d() / 7
    out["u8_f32"] = u().astype(np.float32)
    out["u8_f64"] = u().astype(np.float64) / 255
    out["i32_f32"] = i().astype(np.float32)
    out["i32_f64"] = i().astype(np.float64)
    out["f64_f32"] = d().astype(np.float32)
    out["f32_f64"] = x().astype(np.float64)
    out["transpose"] = u().transpose(0, 3, 1, 2)
    out["transpose_T"] = i().T
    out["preprocess"] = ((u().astype(np.float32).transpose(0, 3, 1, 2) / np.float32(255.0) - MEAN) / MEAN).astype(np.float32)
    out["argmax_u8"] = np.argmax(u().reshape(1, -1, 3), axis=1)
    out["argmax_i32_0"] = np.argmax(i(), axis=0)
    out["argmax_i32_last"] = i().argmax(axis=-1)
    out["argmax_f32"] = np.argmax(x(), axis=3)
    out["expand_squeeze"] = np.squeeze(np.expand_dims(x(), 0) + 1, axis=0)
    w = x()
    v = w.reshape(-1)
    v[0] = 7.0  # a view: w changes too, as in numpy
    out["view_write"] = w.copy()
    out["to_int"] = (x() * 10).astype(np.int32)
    out["sum"] = i().sum(axis=1)
    return out


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in "XUID"}
            out = results(inputs)
            items = [
                name.encode() + b"\0" + a.dtype.name.encode() + b"\0" + json.dumps(list(a.shape)).encode() + b"\0" + a.tobytes()
                for name, a in out.items()
            ]
            held = [name for name, a in out.items() if getattr(getattr(a, "_store", None), "held", None) is not None]
            items.append(b"held\0" + json.dumps(held).encode())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RESULTS", np.array(items, dtype=np.object_))]))
        return responses
