"""The Python guest SDK (guest-sdk/python/tern_plugin.py) under CPython, over
the bindings componentize-py generates for wit/: tensor conversions for every
data type, BYTES encoding, gather/split, the Triton-style export adapter and
BLS conversions (the host import replaced by a fake)."""

import array
import importlib
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def sdk(tmp_path_factory):
    out = tmp_path_factory.mktemp("bindings")
    tool = os.path.join(ROOT, ".venv", "bin", "componentize-py")
    subprocess.run([tool, "-d", os.path.join(ROOT, "wit"), "-w", "plugin", "bindings", str(out)], check=True)
    sys.path[:0] = [str(out), os.path.join(ROOT, "guest-sdk", "python")]
    try:
        yield importlib.import_module("tern_plugin")
    finally:
        sys.path.remove(str(out))
        sys.path.remove(os.path.join(ROOT, "guest-sdk", "python"))
        for m in [m for m in sys.modules if m.startswith(("wit_world", "componentize_py", "tern_plugin"))]:
            del sys.modules[m]


@pytest.mark.parametrize(
    "dtype,values",
    [
        ("BOOL", [True, False, True]),
        ("UINT8", [0, 255]),
        ("UINT16", [65535, 1]),
        ("UINT32", [2**32 - 1, 0]),
        ("UINT64", [2**64 - 1, 3]),
        ("INT8", [-128, 127]),
        ("INT16", [-32768, 5]),
        ("INT32", [-(2**31), 2**31 - 1]),
        ("INT64", [-(2**63), 7]),
        ("FP16", [1.5, -0.25]),
        ("FP32", [1.5, -2.0]),
        ("FP64", [0.1, 1e300]),
        ("BF16", [1.0, -3.0]),
    ],
)
def test_every_dtype_round_trips(sdk, dtype, values):
    t = sdk.Tensor("x", values, dtype, [1, len(values)])
    assert t.datatype() == dtype and t.shape() == [1, len(values)]
    assert t.as_list() == values
    w = t._wit()
    back = sdk.Tensor._from_wit(w)
    assert back.as_list() == values and back.wire_bytes() == t.wire_bytes()


def test_layout_is_tritons(sdk):
    assert sdk.Tensor("x", [1.0, 2.0], "FP32").as_bytes() == b"\x00\x00\x80?\x00\x00\x00@"
    s = sdk.Tensor("s", ["ab", b"\x00"])
    assert s.datatype() == "BYTES" and s.wire_bytes() == b"\x02\x00\x00\x00ab\x01\x00\x00\x00\x00"
    with pytest.raises(sdk.TritonError, match="holds 2 strings: as_bytes\\(\\) gives the bytes of one"):
        s.as_bytes()
    assert sdk.Tensor("one", [b"\x00raw"], "BYTES").as_bytes() == b"\x00raw"
    assert s.as_list() == [b"ab", b"\x00"]
    assert sdk.Tensor("i", [1, 2]).datatype() == "INT64"
    assert sdk.Tensor("a", array.array("f", [1.0])).datatype() == "FP32"
    assert sdk.Tensor("a", array.array("f", [1.0, 2.0])).as_array() == array.array("f", [1.0, 2.0])


def test_bad_values_are_invalid_arg(sdk):
    with pytest.raises(sdk.TritonError) as e:
        sdk.Tensor("x", [1, 2, 3], "FP32", [2, 2])
    assert "shape [2, 2] holds 4 element(s), got 3" in str(e.value) and e.value.code() == sdk.TritonError.INVALID_ARG
    with pytest.raises(sdk.TritonError, match="values do not fit UINT8"):
        sdk.Tensor("x", [256], "UINT8")
    with pytest.raises(sdk.TritonError, match="unknown datatype 'FLOAT'"):
        sdk.Tensor("x", [1.0], "FLOAT")
    with pytest.raises(sdk.TritonError, match="BYTES element overruns"):
        sdk.Tensor.from_bytes("s", "BYTES", [1], b"\x05\x00\x00\x00ab").as_list()
    with pytest.raises(sdk.TritonError, match="not UTF-8"):
        sdk.Tensor("s", [b"\xff"]).as_strings()
    with pytest.raises(sdk.TritonError) as e:
        sdk.Tensor("x", [1.0], "FP32").as_numpy()
    assert e.value.code() == sdk.TritonError.UNSUPPORTED


def wit_request(sdk, **inputs):
    t = sdk._t
    return t.Request(
        id="r",
        inputs=[v._wit(k) for k, v in inputs.items()],
        requested_outputs=[],
        parameters=[t.Parameter(key="temperature", value=t.ParameterValue_Double(0.5))],
        correlation_id=t.CorrelationId_Number(42),
        flags=1,
    )


def test_gather_and_split(sdk):
    r1 = sdk.Request(wit_request(sdk, X=sdk.Tensor("X", [1, 2], "INT32", [1, 2])))
    r2 = sdk.Request(wit_request(sdk, X=sdk.Tensor("X", [3, 4, 5, 6], "INT32", [2, 2])))
    b = sdk.gather([r1, r2], "X")
    assert list(b.values) == [1, 2, 3, 4, 5, 6] and b.sizes == [1, 2] and b.inner_shape == [2]
    outs = b.split("Y", [v * 10 for v in b.values])
    assert [o.shape() for o in outs] == [[1, 2], [2, 2]] and outs[1].as_list() == [30, 40, 50, 60]
    with pytest.raises(sdk.TritonError, match="3 values for a batch of 3 rows of 2"):
        b.split("Y", [1, 2, 3])
    odd = sdk.Request(wit_request(sdk, X=sdk.Tensor("X", [1, 2, 3], "INT32", [1, 3])))
    with pytest.raises(sdk.TritonError, match="different shapes"):
        sdk.gather([r1, odd], "X")
    with pytest.raises(sdk.TritonError, match="request has no input 'Z'"):
        sdk.gather([r1], "Z")


def test_export_adapter_maps_triton_style_models(sdk):
    t = sdk._t
    ctx = t.ModelContext(
        model_name="m",
        model_version=3,
        config_json=json.dumps({"name": "m", "output": [{"name": "Y", "data_type": "TYPE_FP32"}]}),
        instance_name="m_0",
        instance_kind=t.InstanceKind.CPU,
        device_id=0,
        repository_path="/model",
    )
    seen = {}

    class M:
        def initialize(self, args):
            seen["args"] = args
            self.cfg = json.loads(args["model_config"])

        def execute(self, requests):
            out = []
            for r in requests:
                seen["meta"] = (r.request_id(), r.parameter("temperature"), r.correlation_id(), r.flags())
                x = sdk.get_input_tensor_by_name(r, "X")
                if x.as_list()[0] < 0:
                    out.append(sdk.InferenceResponse(error=sdk.TritonError("negative", sdk.TritonError.INVALID_ARG)))
                else:
                    y = sdk.Tensor("Y", [v * 2 for v in x.as_list()], "FP32", x.shape())
                    out.append(sdk.InferenceResponse(output_tensors=[y], parameters={"n": 1}))
            return out

    model = sdk.export(M)()
    model.initialize(ctx)
    assert seen["args"]["model_version"] == "3" and seen["args"]["model_instance_kind"] == "CPU"
    assert sdk.get_output_config_by_name(json.loads(ctx.config_json), "Y")["data_type"] == "TYPE_FP32"
    reqs = [
        wit_request(sdk, X=sdk.Tensor("X", [1.0, 2.0], "FP32", [1, 2])),
        wit_request(sdk, X=sdk.Tensor("X", [-1.0], "FP32", [1, 1])),
    ]
    ok, err = model.execute(reqs)
    assert seen["meta"] == ("r", 0.5, 42, 1)
    y = sdk.Tensor._from_wit(ok.value.outputs[0])
    assert y.as_list() == [2.0, 4.0] and ok.value.parameters[0].value == t.ParameterValue_Int(1)
    assert err.value.code == t.ErrorCode.INVALID_ARG and err.value.message == "negative"

    class Broken:
        def execute(self, requests):
            raise KeyError("oops")

    broken = sdk.export(Broken)()
    broken.initialize(ctx)
    results = broken.execute(reqs)
    # The error says where; the whole traceback goes to the server's log.
    assert [r.value.message for r in results] == ["KeyError: 'oops' (at test_sdk_python.py:164 in execute)"] * 2

    class FailsInit:
        def initialize(self, args):
            raise sdk.TritonError("no vocabulary", sdk.TritonError.NOT_FOUND)

        def execute(self, requests):
            return []

    with pytest.raises(sdk.Err) as e:
        sdk.export(FailsInit)().initialize(ctx)
    assert e.value.value.code == t.ErrorCode.NOT_FOUND and e.value.value.message == "no vocabulary"


def test_bls_request_and_errors(sdk, monkeypatch):
    t = sdk._t
    calls = []

    def fake_infer(req):
        calls.append(req)
        if req.model_name == "missing":
            raise sdk.Err(t.Error(code=t.ErrorCode.NOT_FOUND, message="no model 'missing'"))
        return t.Response(outputs=[sdk.Tensor("OUT", [7], "INT32")._wit()], parameters=[])

    monkeypatch.setattr(sdk._host, "infer", fake_infer)
    r = sdk.InferenceRequest("simple", [sdk.Tensor("IN", [1], "INT32")], ["OUT"], parameters={"p": True}).exec()
    assert not r.has_error() and sdk.get_output_tensor_by_name(r, "OUT").as_list() == [7]
    assert calls[0].model_version == -1 and calls[0].requested_outputs == ["OUT"]
    assert calls[0].parameters[0].value == t.ParameterValue_Bool(True)
    r = sdk.InferenceRequest("missing", []).exec()
    assert r.has_error() and r.error().code() == sdk.TritonError.NOT_FOUND and "missing" in r.error().message()


def test_a_failed_batch_reschedules_nothing(sdk, monkeypatch):
    """A request released with RESCHEDULE goes back to the host only once
    every answer of the batch is built: when another answer is bad, the
    whole batch fails and nothing runs again."""
    t = sdk._t
    config = {"name": "m", "sequence_batching": {"iterative_sequence": True}}
    ctx = t.ModelContext(model_name="m", model_version=1, config_json=json.dumps(config), instance_name="m_0",
                         instance_kind=t.InstanceKind.CPU, device_id=0, repository_path="/model")
    released = []
    monkeypatch.setattr(sdk._responses, "reschedule", released.append)
    monkeypatch.setattr(sdk._responses, "is_cancelled", lambda index: False)

    class M:
        def execute(self, requests):
            requests[0].set_release_flags(sdk.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            return [None, self.second]

    model = sdk.export(M)()
    model.initialize(ctx)
    reqs = [wit_request(sdk, X=sdk.Tensor("X", [1.0], "FP32", [1, 1])) for _ in range(2)]
    reqs = [t.Request(id=r.id, inputs=r.inputs, requested_outputs=[], parameters=[], correlation_id=r.correlation_id,
                      flags=0) for r in reqs]
    M.second = "not a response"
    results = model.execute(reqs)
    assert all(isinstance(r, sdk.Err) for r in results) and released == []
    assert "execute must return InferenceResponse objects" in results[0].value.message
    M.second = sdk.InferenceResponse(output_tensors=[sdk.Tensor("Y", [1.0], "FP32", [1, 1])])
    results = model.execute(reqs)
    assert released == [0] and not isinstance(results[1], sdk.Err)
