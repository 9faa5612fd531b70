"""Execution accelerators and GPU placement on a machine without them (CI):
every configured accelerator must register, so a model asking for one the
ONNX Runtime library lacks fails its load with a clear reason, and the
server keeps serving the rest."""

import os
import shutil

import numpy as np
import tritonclient.http as httpclient

CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
{extra}
"""


def test_unavailable_accelerators_fail_the_load_clearly(test_repo, tmp_path, start_tern):
    src = os.path.join(test_repo, "onnx_identity_fp32", "1")
    models = {
        "plain": "",
        "openvino": 'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }',
        "bogus": 'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "bogus" } ] } }',
        # ORT session options from model parameters.
        "spinning": 'parameters { key: "allow_spinning" value { string_value: "true" } }',
        "badspin": 'parameters { key: "allow_spinning" value { string_value: "maybe" } }',
        # Triton's ONNX Runtime backend parameters for memory and execution mode.
        "sessionopts": 'parameters [ { key: "enable_mem_arena" value { string_value: "off" } },'
        ' { key: "enable_mem_pattern" value { string_value: "false" } },'
        ' { key: "execution_mode" value { string_value: "1" } } ]',
        "shrink": 'parameters { key: "memory.enable_memory_arena_shrinkage" value { string_value: "cpu:0" } }',
        "badshrink": 'parameters { key: "memory.enable_memory_arena_shrinkage" value { string_value: "gpu:0" } }',
        "noarena": 'parameters [ { key: "memory.enable_memory_arena_shrinkage" value { string_value: "cpu:0" } },'
        ' { key: "enable_mem_arena" value { string_value: "0" } } ]',
        "badmode": 'parameters { key: "execution_mode" value { string_value: "2" } }',
        "badarena": 'parameters { key: "enable_mem_arena" value { string_value: "no arena" } }',
    }
    for name, extra in models.items():
        shutil.copytree(src, tmp_path / name / "1")
        (tmp_path / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
    t = start_tern([f"--model-repository={tmp_path}", "--exit-on-error=false"])
    c = httpclient.InferenceServerClient(t.url)
    index = {m["name"]: m for m in c.get_model_repository_index()}
    assert index["plain"]["state"] == "READY"
    assert index["openvino"]["state"] == "UNAVAILABLE"
    assert "OpenVINO" in index["openvino"]["reason"] or "openvino" in index["openvino"]["reason"].lower()
    assert "cpu_execution_accelerator 'bogus' is not supported" in index["bogus"]["reason"]
    assert index["spinning"]["state"] == "READY"
    assert index["badspin"]["state"] == "UNAVAILABLE"
    assert "parameter 'allow_spinning': failed to convert 'maybe' to boolean" in index["badspin"]["reason"]
    assert index["sessionopts"]["state"] == "READY"
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    inp = httpclient.InferInput("INPUT0", [1, 6], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(c.infer("sessionopts", [inp]).as_numpy("OUTPUT0"), x)
    # Arena shrinkage after every run, as Triton's run option.
    assert index["shrink"]["state"] == "READY"
    for _ in range(3):
        np.testing.assert_array_equal(c.infer("shrink", [inp]).as_numpy("OUTPUT0"), x)
    assert index["badshrink"]["state"] == "UNAVAILABLE"
    assert "names gpu:0, which this model's CPU instances do not run on" in index["badshrink"]["reason"]
    assert index["noarena"]["state"] == "UNAVAILABLE"
    assert "names the CPU arena, which enable_mem_arena turns off" in index["noarena"]["reason"]
    assert index["badmode"]["state"] == "UNAVAILABLE"
    assert "expected values for execution_mode are 0 or 1 but got 2" in index["badmode"]["reason"]
    assert index["badarena"]["state"] == "UNAVAILABLE"
    assert "parameter 'enable_mem_arena': failed to convert 'no arena' to boolean" in index["badarena"]["reason"]
    # The pinned pool needs CUDA: without it the gauges say 0, and GPU discovery is logged.
    import urllib.request

    text = urllib.request.urlopen(f"http://{t.metrics_url}/metrics").read().decode()
    assert "nv_pinned_memory_pool_total_bytes 0" in text
    assert "nv_gpu_utilization" not in text
    assert any("no GPU:" in line for line in t.lines)
