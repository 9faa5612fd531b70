"""Signed and encrypted model folders, end to end through the built binary:
`tern model keygen|sign|verify|encrypt`, a server started with
`--model-trust-key` (only models whose signed manifest verifies load), and
the `decrypt` repository agent (model files decrypted in memory)."""

import os
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, infer_simple, tern_bin


def tern_model(*args, check=True):
    r = subprocess.run([tern_bin(), "model", *map(str, args)], capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def make_keys(tmp_path, *names):
    """`tmp_path/keys` with the keys `tern model keygen` makes: `*.pem`
    signing keys (and their `.pub`), `*.key` encryption keys."""
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in names:
        tern_model("keygen", "--sign" if name.endswith(".pem") else "--encrypt", keys / name)
    return keys


def simple_model(root, name):
    """The `simple` ONNX add/sub model (INT32 [16]) as `<root>/<name>`."""
    (root / name / "1").mkdir(parents=True)
    shutil.copy(f"{ROOT}/model_repository/simple/1/model.onnx", root / name / "1" / "model.onnx")
    text = open(f"{ROOT}/model_repository/simple/config.pbtxt").read().replace('name: "simple"', f'name: "{name}"')
    (root / name / "config.pbtxt").write_text(text)
    return root / name


def add_sub_plugin(root, name):
    wasm_dir = os.environ.get("TERN_PLUGINS_DIR", os.path.join(ROOT, "target", "wasm32-wasip2", "release"))
    wasm = os.path.join(wasm_dir, "add_sub.wasm")
    if not os.path.exists(wasm):
        pytest.fail(f"{wasm} not found; run `make plugins` (or set TERN_PLUGINS_DIR)")
    (root / name / "1").mkdir(parents=True)
    shutil.copy(wasm, root / name / "1" / "model.wasm")
    text = open(f"{ROOT}/model_repository/add_sub/config.pbtxt").read().replace('name: "add_sub"', f'name: "{name}"')
    (root / name / "config.pbtxt").write_text(text)
    return root / name


def index(t):
    return {m["name"]: m for m in httpclient.InferenceServerClient(t.url).get_model_repository_index()}


def test_only_models_whose_signed_manifest_verifies_load(tmp_path, start_tern):
    keys = make_keys(tmp_path, "signer.pem")
    assert oct(os.stat(keys / "signer.pem").st_mode & 0o777) == "0o600"
    # A key OpenSSL made signs as well (PKCS#8 PEM in, SPKI PEM trusted).
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", keys / "ossl.pem"], check=True)
    subprocess.run(["openssl", "pkey", "-in", keys / "ossl.pem", "-pubout", "-out", keys / "ossl.pub"], check=True)

    root = tmp_path / "models"
    for name in ("signed", "tampered", "grown", "stranger_signed"):
        simple_model(root, name)
    simple_model(root, "unsigned")
    tern_model("sign", "--key", keys / "signer.pem", root / "signed", root / "tampered", root / "grown")
    tern_model("sign", "--key", keys / "ossl.pem", root / "stranger_signed")
    # The signature is plain Ed25519 over the manifest's bytes: OpenSSL checks it too.
    subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", keys / "signer.pem.pub", "-rawin",
                    "-in", root / "signed" / "tern-manifest.json", "-sigfile", root / "signed" / "tern-manifest.sig"],
                   check=True, capture_output=True)
    with open(root / "tampered" / "1" / "model.onnx", "ab") as f:
        f.write(b"\0")
    (root / "grown" / "2").mkdir()
    shutil.copy(root / "grown" / "1" / "model.onnx", root / "grown" / "2" / "model.onnx")
    r = tern_model("verify", "--trust-key", keys / "signer.pem.pub", root / "tampered", check=False)
    assert r.returncode == 1 and "file '1/model.onnx' does not match the signed manifest" in r.stderr, r.stderr

    t = start_tern([f"--model-repository={root}", f"--model-trust-key={keys / 'signer.pem.pub'}",
                    "--model-control-mode=explicit", "--load-model=*", "--exit-on-error=false"])
    rows = index(t)
    assert rows["signed"]["state"] == "READY", rows["signed"]
    infer_simple(t, "signed")
    assert "the model is not signed" in rows["unsigned"]["reason"], rows["unsigned"]
    assert "file '1/model.onnx' does not match the signed manifest" in rows["tampered"]["reason"]
    assert "file '2/model.onnx' is not in the signed manifest" in rows["grown"]["reason"]
    assert "does not verify with any --model-trust-key" in rows["stranger_signed"]["reason"]

    c = httpclient.InferenceServerClient(t.url)
    # A load may not replace the signed config.
    with pytest.raises(InferenceServerException, match="may not replace the signed config"):
        c.load_model("signed", config='{"max_batch_size": 4}')
    # A file changed after the first load: the reload fails, the loaded version serves.
    with open(root / "signed" / "config.pbtxt", "a") as f:
        f.write("\n# changed\n")
    with pytest.raises(InferenceServerException, match="file 'config.pbtxt' does not match the signed manifest"):
        c.load_model("signed")
    assert c.is_model_ready("signed")
    infer_simple(t, "signed")
    # Signed again, the new files load; a second trust key admits the other signer.
    tern_model("sign", "--key", keys / "signer.pem", root / "signed", root / "grown")
    c.load_model("signed")
    c.load_model("grown")
    assert index(t)["grown"]["state"] == "READY" and c.is_model_ready("grown", "2")
    t.stop()
    t = start_tern([f"--model-repository={root}",
                    f"--model-trust-key={keys / 'signer.pem.pub'},{keys / 'ossl.pub'}",
                    "--model-control-mode=explicit", "--load-model=stranger_signed"])
    infer_simple(t, "stranger_signed")


def test_a_trust_key_that_is_not_a_public_key_stops_the_server(tmp_path, start_tern):
    (tmp_path / "models").mkdir()
    (tmp_path / "bad.pem").write_text("not a key\n")
    t = start_tern([f"--model-repository={tmp_path / 'models'}", f"--model-trust-key={tmp_path / 'bad.pem'}"],
                   wait_ready=False)
    assert t.wait(30) != 0
    assert "--model-trust-key: " in t.log() and "is not an Ed25519 public key in PEM" in t.log(), t.log()


def test_encrypted_models_are_served_from_memory_only(tmp_path, start_tern):
    keys = make_keys(tmp_path, "model.key", "other.key")
    plain = tmp_path / "plain"
    simple_model(plain, "onnx_enc")
    add_sub_plugin(plain, "wasm_enc")
    simple_model(plain, "env_enc")
    simple_model(plain, "wrong_key")
    root = tmp_path / "models"
    tern_model("encrypt", "--key", keys / "model.key", "--out", root, plain / "onnx_enc")
    tern_model("encrypt", "--key", keys / "model.key", "--out", root, plain / "wasm_enc")
    tern_model("encrypt", "--key", keys / "model.key", "--key-source", "key_env=TERN_TEST_MODEL_KEY",
               "--out", root, plain / "env_enc")
    tern_model("encrypt", "--key", keys / "other.key", "--out", root, plain / "wrong_key")
    # The served key is not the one that encrypted it.
    cfg = (root / "wrong_key" / "config.pbtxt").read_text()
    (root / "wrong_key" / "config.pbtxt").write_text(cfg.replace(str(keys / "other.key"), str(keys / "model.key")))
    # The decrypt agent named over a file that is not encrypted.
    simple_model(root, "not_encrypted")
    with open(root / "not_encrypted" / "config.pbtxt", "a") as f:
        f.write(f'model_repository_agents {{ agents [ {{ name: "decrypt" parameters {{ key: "key_file" '
                f'value: "{keys / "model.key"}" }} }} ] }}\n')
    # A Python model cannot be served decrypted (its runner reads files by path).
    (root / "py_enc" / "1").mkdir(parents=True)
    (root / "py_enc" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (root / "py_enc" / "config.pbtxt").write_text(
        'backend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f'model_repository_agents {{ agents [ {{ name: "decrypt" parameters {{ key: "key_file" '
        f'value: "{keys / "model.key"}" }} }} ] }}\n')

    onnx_bytes = (plain / "onnx_enc" / "1" / "model.onnx").read_bytes()
    on_disk = (root / "onnx_enc" / "1" / "model.onnx").read_bytes()
    assert on_disk.startswith(b"TERNENC1") and onnx_bytes[-16:] not in on_disk
    assert (root / "wasm_enc" / "1" / "model.wasm").read_bytes().startswith(b"TERNENC1")

    cache = tmp_path / "wasm-cache"
    t = start_tern([f"--model-repository={root}", "--model-control-mode=explicit", "--load-model=*",
                    "--exit-on-error=false", f"--wasm-cache-dir={cache}"],
                   env={"TERN_TEST_MODEL_KEY": (keys / "model.key").read_text().strip()})
    rows = index(t)
    for name in ("onnx_enc", "wasm_enc", "env_enc"):
        assert rows[name]["state"] == "READY", rows[name]
    infer_simple(t, "onnx_enc")
    infer_simple(t, "env_enc")
    c = httpclient.InferenceServerClient(t.url)
    x = np.ones((1, 4), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32"), httpclient.InferInput("INPUT1", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(2 * x)
    r = c.infer("wasm_enc", inputs)
    assert (r.as_numpy("OUTPUT0") == 3 * x).all() and (r.as_numpy("OUTPUT1") == -x).all()
    # The compiled code of an encrypted plugin is not written to the cache.
    assert not cache.exists() or not [f for f in os.listdir(cache) if f.endswith(".cwasm")], os.listdir(cache)
    assert "does not decrypt with the key from key_file" in rows["wrong_key"]["reason"], rows["wrong_key"]
    assert "file '1/model.onnx' is not encrypted" in rows["not_encrypted"]["reason"], rows["not_encrypted"]
    assert "cannot serve a Python model" in rows["py_enc"]["reason"], rows["py_enc"]
    t.stop()

    # Without the key in the environment the model does not load, and says why.
    t = start_tern([f"--model-repository={root}", "--model-control-mode=explicit", "--load-model=env_enc",
                    "--exit-on-error=false"], env={"TERN_TEST_MODEL_KEY": None})
    assert "key_env 'TERN_TEST_MODEL_KEY': the environment variable is not set" in index(t)["env_enc"]["reason"]


def test_an_encrypted_model_can_be_signed_and_the_key_come_from_a_systemd_credential(tmp_path, start_tern):
    keys = make_keys(tmp_path, "model.key", "signer.pem")
    creds = tmp_path / "credentials"
    creds.mkdir()
    shutil.copy(keys / "model.key", creds / "tern-model-key")
    plain = tmp_path / "plain"
    simple_model(plain, "both")
    root = tmp_path / "models"
    tern_model("encrypt", "--key", keys / "model.key", "--key-source", "key_credential=tern-model-key",
               "--out", root, plain / "both")
    tern_model("sign", "--key", keys / "signer.pem", root / "both")
    t = start_tern([f"--model-repository={root}", f"--model-trust-key={keys / 'signer.pem.pub'}"],
                   env={"CREDENTIALS_DIRECTORY": str(creds)})
    infer_simple(t, "both")


def external_data_model(root, name):
    """An ONNX model Y = X + W (FP32 [4]) whose W lives in `1/weights.bin`
    (ONNX external data, as models over 2 GB keep their weights)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.array([1.5, -2.0, 3.25, 100.0], dtype=np.float32), name="W")
    graph = helper.make_graph([helper.make_node("Add", ["X", "W"], ["Y"])], "ext",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / name / "1").mkdir(parents=True)
    onnx.save_model(model, str(root / name / "1" / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    return root / name


def infer_external(t, name):
    c = httpclient.InferenceServerClient(t.url)
    x = httpclient.InferInput("X", [4], "FP32")
    x.set_data_from_numpy(np.ones(4, dtype=np.float32))
    y = c.infer(name, [x]).as_numpy("Y")
    assert y.tolist() == [2.5, -1.0, 4.25, 101.0], y


def test_signed_and_encrypted_models_with_external_data_read_it_through_the_agents(tmp_path, start_tern):
    keys = make_keys(tmp_path, "signer.pem", "model.key")
    root = tmp_path / "models"
    signed = external_data_model(root, "ext_signed")
    assert (signed / "1" / "weights.bin").stat().st_size == 16
    tern_model("sign", "--key", keys / "signer.pem", signed)
    plain = tmp_path / "plain"
    external_data_model(plain, "ext_enc")
    tern_model("encrypt", "--key", keys / "model.key", "--file", "1/model.onnx", "--file", "1/weights.bin",
               "--out", root, plain / "ext_enc")
    assert (root / "ext_enc" / "1" / "weights.bin").read_bytes().startswith(b"TERNENC1")
    tern_model("sign", "--key", keys / "signer.pem", root / "ext_enc")

    t = start_tern([f"--model-repository={root}", f"--model-trust-key={keys / 'signer.pem.pub'}",
                    "--model-control-mode=explicit", "--load-model=*", "--exit-on-error=false"])
    infer_external(t, "ext_signed")
    infer_external(t, "ext_enc")
    # Weights changed after signing: the reload is refused, the loaded version serves on.
    (signed / "1" / "weights.bin").write_bytes(np.zeros(4, dtype=np.float32).tobytes())
    c = httpclient.InferenceServerClient(t.url)
    with pytest.raises(InferenceServerException, match="file '1/weights.bin' does not match the signed manifest"):
        c.load_model("ext_signed")
    infer_external(t, "ext_signed")
