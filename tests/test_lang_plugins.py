"""Plugins in Python, JavaScript and C end to end.

* The `prep_*` example (add_sub + text normalisation + hashed word ids) in
  Rust, Python, JavaScript and C gives identical answers, checked against an
  independent numpy/Python reference over HTTP and gRPC, batched and from
  many threads (dynamic batching).
* A Python plugin that loops forever, hoards memory, raises or answers
  wrongly is contained like a Rust one while other models keep serving.
* `tern plugin new` + `tern plugin build` for every language give a plugin
  that serves; a missing toolchain or an unknown folder is a clear error.
"""

import os
import re
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern, tern_bin

LANGS = ["rust", "python", "js", "c"]
MAX_TOKENS = 8


def plugins_dir():
    d = os.environ.get("TERN_PLUGINS_DIR", os.path.join(ROOT, "target", "wasm32-wasip2", "release"))
    for p in [f"prep_{l}" for l in LANGS] + ["misbehave_python"]:
        if not os.path.exists(os.path.join(d, p + ".wasm")):
            pytest.fail(f"{p}.wasm not found in {d}; run `make plugins lang-plugins`")
    return d


def tool_env():
    """PATH and tool variables so `tern plugin build` finds the toolchains make installed."""
    env = dict(os.environ)
    env["PATH"] = os.path.join(ROOT, ".venv", "bin") + os.pathsep + env.get("PATH", "")
    jco = os.path.join(ROOT, ".cache", "jco", "node_modules", ".bin", "jco")
    if os.path.exists(jco):
        env.setdefault("TERN_JCO", jco)
    return env


def reference(text):
    """The job in plain Python: what every language must answer."""
    words = text.lower().split()  # bytes: ASCII lower-case, ASCII whitespace
    ids = []
    for w in words[:MAX_TOKENS]:
        h = 0x811C9DC5
        for b in w:
            h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
        ids.append(h % 30000 + 1)
    return b" ".join(words), ids + [0] * (MAX_TOKENS - len(ids))


@pytest.fixture(scope="module")
def lang_repo(tmp_path_factory):
    src = plugins_dir()
    root = tmp_path_factory.mktemp("lang") / "models"
    for name in [f"prep_{l}" for l in LANGS]:
        os.makedirs(root / name / "1")
        shutil.copy(os.path.join(ROOT, "model_repository", name, "config.pbtxt"), root / name)
        shutil.copy(os.path.join(src, name + ".wasm"), root / name / "1" / "model.wasm")
    os.makedirs(root / "misbehave_python" / "1")
    shutil.copy(os.path.join(src, "misbehave_python.wasm"), root / "misbehave_python" / "1" / "model.wasm")
    (root / "misbehave_python" / "1" / "data.txt").write_text("read through model_repository\n")
    (root / "misbehave_python" / "config.pbtxt").write_text(
        """name: "misbehave_python"
backend: "wasm"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "execution_timeout_ms" value: { string_value: "1500" } }
parameters { key: "max_memory_bytes" value: { string_value: "134217728" } }
"""
    )
    return str(root)


@pytest.fixture(scope="module")
def lsrv(lang_repo, tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("wasm-cache"))
    t = Tern([f"--model-repository={lang_repo}", f"--wasm-cache-dir={cache}"])
    yield t
    t.stop()


TEXTS = [
    b"  Hello\tWORLD \n",
    b"",
    b"One two three four five six seven eight NINE ten",
    "Ünïcode ÄB stays\x0bput".encode(),
    b"a",
]


def prep_inputs(client, a, b, texts):
    ins = [
        client.InferInput("INPUT0", list(a.shape), "FP32"),
        client.InferInput("INPUT1", list(b.shape), "FP32"),
        client.InferInput("TEXT", [len(texts), 1], "BYTES"),
    ]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    ins[2].set_data_from_numpy(np.array([[t] for t in texts], dtype=np.object_))
    return ins


def check_prep(r, a, b, texts):
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    refs = [reference(t) for t in texts]
    assert [x[0] for x in r.as_numpy("NORMALIZED")] == [x[0] for x in refs]
    assert r.as_numpy("TOKEN_IDS").tolist() == [x[1] for x in refs]


@pytest.mark.parametrize("lang", LANGS)
def test_prep_example_matches_the_reference(lsrv, lang):
    rng = np.random.default_rng(7)
    a = rng.normal(size=(len(TEXTS), 4)).astype(np.float32)
    b = rng.normal(size=(len(TEXTS), 4)).astype(np.float32)
    h = httpclient.InferenceServerClient(lsrv.url)
    check_prep(h.infer(f"prep_{lang}", prep_inputs(httpclient, a, b, TEXTS)), a, b, TEXTS)
    g = grpcclient.InferenceServerClient(lsrv.grpc_url)
    check_prep(g.infer(f"prep_{lang}", prep_inputs(grpcclient, a, b, TEXTS)), a, b, TEXTS)
    meta = h.get_model_metadata(f"prep_{lang}")
    assert meta["platform"] == "wasm"


def test_prep_examples_agree_under_concurrent_batching(lsrv):
    """Many single-row requests at once: the dynamic batcher hands each plugin
    lists of requests, which the SDK gather/split helpers must keep apart."""
    errors = []

    def worker(lang, seed):
        c = httpclient.InferenceServerClient(lsrv.url)
        rng = np.random.default_rng(seed)
        try:
            for i in range(6):
                a = rng.normal(size=(1, 4)).astype(np.float32)
                b = rng.normal(size=(1, 4)).astype(np.float32)
                text = [TEXTS[(seed + i) % len(TEXTS)] + b" Extra%d" % seed]
                check_prep(c.infer(f"prep_{lang}", prep_inputs(httpclient, a, b, text)), a, b, text)
        except Exception as e:  # noqa: BLE001 (collected for the assert)
            errors.append((lang, repr(e)))

    threads = [threading.Thread(target=worker, args=(l, s)) for l in LANGS for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def mode(client, m):
    inp = httpclient.InferInput("MODE", [1], "BYTES")
    inp.set_data_from_numpy(np.array([m.encode()], dtype=np.object_))
    return client.infer("misbehave_python", [inp]).as_numpy("OUTPUT0")[0].decode()


@pytest.mark.parametrize(
    "m,expect",
    [
        ("loop", "exceeded its execution deadline of 1500 ms"),
        ("sleep", "exceeded its execution deadline of 1500 ms"),
        ("memory", "hit its memory cap of 134217728 bytes"),
    ],
)
def test_python_plugin_abuse_is_contained(lsrv, m, expect):
    """A Python plugin that never returns, sleeps (`time.sleep(20)`, blocked
    in a WASI call) or allocates without bound gets its batch failed with a
    clear error and its instance restarted, while other models keep
    answering; afterwards it serves again."""
    h = httpclient.InferenceServerClient(lsrv.url)
    assert mode(h, "ok") == "ok"
    stop = threading.Event()
    served = []

    def bystander():
        c = httpclient.InferenceServerClient(lsrv.url)
        a = np.ones((1, 4), dtype=np.float32)
        while not stop.is_set():
            r = c.infer("prep_c", prep_inputs(httpclient, a, a, [b"x"]))
            served.append(r.as_numpy("OUTPUT0")[0][0])

    t = threading.Thread(target=bystander)
    t.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            mode(h, m)
        assert time.monotonic() - t0 < 10
        assert "misbehave_python" in str(e.value) and expect in str(e.value), str(e.value)
    finally:
        stop.set()
        t.join()
    assert served and all(v == 2.0 for v in served)
    assert mode(h, "ok") == "ok"


@pytest.mark.parametrize(
    "m,status,expect",
    [
        ("raise", "500", "ValueError: asked to raise (at app.py:{raise_line} in execute)"),
        ("triton_error", "400", "asked for an INVALID_ARG error"),
        ("wrong_count", "500", "execute returned 0 response(s) for 1 request(s)"),
        ("bad_response", "500", "execute must return InferenceResponse objects, got str"),
    ],
)
def test_python_plugin_errors_reach_the_client(lsrv, m, status, expect):
    app = open(os.path.join(ROOT, "plugins", "misbehave_python", "app.py")).read().splitlines()
    expect = expect.format(raise_line=app.index('            raise ValueError("asked to raise")') + 1)
    h = httpclient.InferenceServerClient(lsrv.url)
    with pytest.raises(InferenceServerException) as e:
        mode(h, m)
    assert expect in str(e.value), str(e.value)
    assert e.value.status() == status, (e.value.status(), str(e.value))
    if m == "raise":
        # The whole traceback is in the server's log, tagged with the model.
        assert lsrv.wait_log('in execute') and lsrv.wait_log('Traceback (most recent call last)')
    assert mode(h, "ok") == "ok"


def test_python_print_goes_to_the_server_log(lsrv):
    h = httpclient.InferenceServerClient(lsrv.url)
    assert mode(h, "print") == "print"
    assert lsrv.wait_log("stdout: hello from print")
    assert lsrv.wait_log("stderr: and from stderr")
    line = next(line for line in lsrv.lines if "stdout: hello from print" in line)
    assert "misbehave_python" in line, line


def plugin_cmd(*args, env=None):
    return subprocess.run([tern_bin(), "plugin", *args], capture_output=True, text=True, env=env or tool_env(), timeout=600)


def test_scaffold_builds_and_serves_in_every_language(tmp_path):
    repo = tmp_path / "repo"
    for lang in LANGS:
        r = plugin_cmd("new", str(repo / f"hello_{lang}"), "--lang", lang)
        assert r.returncode == 0, r.stderr
        r = plugin_cmd("build", str(repo / f"hello_{lang}"), "--cache-dir", str(tmp_path / "cache"))
        assert r.returncode == 0, r.stderr
        assert "built" in r.stderr and (repo / f"hello_{lang}" / "1" / "model.wasm").is_file()
        # Progress of the toolchain step (plain lines when not on a terminal), then the precompile.
        tool = {"rust": "cargo build", "python": "componentize-py", "js": "jco componentize", "c": "clang"}[lang]
        assert re.search(rf"^{tool}: finished in \d+\.\d s$", r.stderr, re.M), r.stderr
        assert "precompiled in" in r.stderr, r.stderr
    t = Tern([f"--model-repository={repo}", f"--wasm-cache-dir={tmp_path / 'cache'}"])
    # `tern plugin build` precompiled every component: the server compiles none of them.
    ready = [line for line in t.lines if "component ready" in line]
    for lang in LANGS:
        assert any(f"hello_{lang}" in line and "(Cache)" in line for line in ready), ready
    assert not [line for line in t.lines if "compiling '" in line], t.lines
    try:
        h = httpclient.InferenceServerClient(t.url)
        g = grpcclient.InferenceServerClient(t.grpc_url)
        x = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
        for lang in LANGS:
            for client, c in ((httpclient, h), (grpcclient, g)):
                i = client.InferInput("INPUT0", [1, 3], "FP32")
                i.set_data_from_numpy(x)
                np.testing.assert_array_equal(c.infer(f"hello_{lang}", [i]).as_numpy("OUTPUT0"), x * 2)
    finally:
        t.stop()


def test_plugin_tool_errors_are_clear(tmp_path):
    r = plugin_cmd("build", str(tmp_path))
    assert r.returncode == 1 and "cannot tell the language" in r.stderr, r.stderr
    assert plugin_cmd("new", str(tmp_path / "p"), "--lang", "python").returncode == 0
    env = tool_env()
    env["TERN_COMPONENTIZE_PY"] = str(tmp_path / "no-such-componentize-py")
    r = plugin_cmd("build", str(tmp_path / "p"), env=env)
    assert r.returncode == 1 and "does not exist" in r.stderr and "pip install componentize-py" in r.stderr, r.stderr
    assert not (tmp_path / "p" / "1" / "model.wasm").exists()
    # A syntax error is reported with the toolchain's own message; nothing is written.
    (tmp_path / "p" / "app.py").write_text("def broken(:\n")
    r = plugin_cmd("build", str(tmp_path / "p"))
    assert r.returncode == 1 and "componentize-py failed" in r.stderr and "SyntaxError" in r.stderr, r.stderr
    assert not (tmp_path / "p" / "1" / "model.wasm").exists()
    r = plugin_cmd("new", str(tmp_path / "p"), "--lang", "c")
    assert r.returncode == 1 and "not empty" in r.stderr, r.stderr
    r = plugin_cmd("new", str(tmp_path / "q"), "--lang", "cobol")
    assert r.returncode == 2 and "cobol" in r.stderr, r.stderr


def test_reloaded_plugin_serves_its_new_version(tmp_path):
    """A new version folder, then a rebuilt model.wasm in the same version:
    each load serves the new code, and the replaced version stops serving.
    (A C plugin: the reload path is the same for every language, and its
    component builds and compiles in a second.)"""
    repo = tmp_path / "repo"
    calc = repo / "calc"
    src = calc / "model.c"

    def build(factor, version):
        src.write_text(re.sub(r"in\[i\] \* \d", f"in[i] * {factor}", src.read_text()))
        (calc / str(version)).mkdir(exist_ok=True)
        r = plugin_cmd("build", str(calc), "-o", str(calc / str(version) / "model.wasm"), "--cache-dir", "none")
        assert r.returncode == 0, r.stderr

    assert plugin_cmd("new", str(calc), "--lang", "c").returncode == 0
    build(2, 1)
    t = Tern([f"--model-repository={repo}", f"--wasm-cache-dir={tmp_path / 'cache'}",
              "--model-control-mode=explicit", "--load-model=calc"])
    try:
        h = httpclient.InferenceServerClient(t.url)
        x = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)

        def times():
            i = httpclient.InferInput("INPUT0", [1, 3], "FP32")
            i.set_data_from_numpy(x)
            return h.infer("calc", [i]).as_numpy("OUTPUT0") / x

        np.testing.assert_array_equal(times(), 2)
        build(3, 2)
        h.load_model("calc")
        np.testing.assert_array_equal(times(), 3)
        assert h.is_model_ready("calc", "2") and not h.is_model_ready("calc", "1")
        build(5, 2)  # the same version, rebuilt
        h.load_model("calc")
        np.testing.assert_array_equal(times(), 5)
    finally:
        t.stop()


def test_python_porting_gaps_are_closed(lsrv):
    """Files found as Triton models find them (`model_repository` is the
    model's folder, the version folder is below it), codecs Python imports on first use (cp1252, shift_jis) are in the
    component, and an `async def execute` that awaits a BLS call
    (`async_exec`) runs as in Triton."""
    h = httpclient.InferenceServerClient(lsrv.url)
    assert mode(h, "repo_file") == "read through model_repository"
    assert mode(h, "codecs") == "\u20ac caf\u00e9 \u30c6\u30b9\u30c8"
    assert mode(h, "async") == "async 2.0,3.0,4.0,5.0"


def wheel(path, name, files):
    """A minimal wheel (what pip installs) holding `files`."""
    import zipfile

    dist = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        for f, data in files.items():
            z.writestr(f, data)
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: tern-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")


def test_python_requirements_are_vendored_and_native_code_is_refused(tmp_path):
    """requirements.txt beside app.py: pure-Python packages are installed into
    the component; a package with native code is refused at build naming it;
    an import the build cannot find says what to do."""
    p = tmp_path / "repo" / "shout"
    assert plugin_cmd("new", str(p), "--lang", "python").returncode == 0
    wheel(p / "mini_dep-1.0-py3-none-any.whl", "mini_dep", {"mini_dep/__init__.py": "def twice(v):\n    return v * 2\n"})
    (p / "requirements.txt").write_text("./mini_dep-1.0-py3-none-any.whl\n")
    app = p / "app.py"
    app.write_text(app.read_text().replace("import tern_plugin as pb_utils", "import mini_dep\nimport tern_plugin as pb_utils")
                   .replace("[v * 2 for v in x.as_array()]", "[mini_dep.twice(v) for v in x.as_array()]"))
    r = plugin_cmd("build", str(p), "--cache-dir", "none")
    assert r.returncode == 0, r.stderr
    assert "pip install -r requirements.txt: finished" in r.stderr, r.stderr
    t = Tern([f"--model-repository={tmp_path / 'repo'}", f"--wasm-cache-dir={tmp_path / 'cache'}"])
    try:
        h = httpclient.InferenceServerClient(t.url)
        i = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        i.set_data_from_numpy(np.array([[1.5, -2.0, 3.25]], dtype=np.float32))
        assert h.infer("shout", [i]).as_numpy("OUTPUT0").tolist() == [[3.0, -4.0, 6.5]]
    finally:
        t.stop()
    # A package with native code: refused before anything is built.
    wheel(p / "fast_dep-1.0-py3-none-any.whl", "fast_dep",
          {"fast_dep/__init__.py": "", "fast_dep/_core.cpython-312-wasm32-wasi.so": "\0"})
    (p / "requirements.txt").write_text("./fast_dep-1.0-py3-none-any.whl\n")
    before = (p / "1" / "model.wasm").stat().st_mtime
    r = plugin_cmd("build", str(p), "--cache-dir", "none")
    assert r.returncode == 1, r.stderr
    assert "requirements.txt: 'fast_dep' holds native code ('fast_dep/_core.cpython-312-wasm32-wasi.so')" in r.stderr, r.stderr
    assert "tern_ops" in r.stderr and (p / "1" / "model.wasm").stat().st_mtime == before
    # An import nothing provides: the toolchain's error, and what to do.
    (p / "requirements.txt").unlink()
    app.write_text("import tern_no_such_module\n" + app.read_text())
    r = plugin_cmd("build", str(p), "--cache-dir", "none")
    assert r.returncode == 1 and "No module named 'tern_no_such_module'" in r.stderr, r.stderr
    assert "list pure-Python packages in requirements.txt" in r.stderr and "tern_ops" in r.stderr, r.stderr


def test_js_and_c_errors_say_where(tmp_path):
    """A JavaScript exception and a C tern_fail() come back with the file,
    line and function they came from; the JS stack goes to the server log."""
    repo = tmp_path / "repo"
    js, c = repo / "where_js", repo / "where_c"
    assert plugin_cmd("new", str(js), "--lang", "js").returncode == 0
    assert plugin_cmd("new", str(c), "--lang", "c").returncode == 0
    src = (js / "model.js").read_text()
    src = src.replace("class Plugin {", 'function explode(v) {\n  throw new RangeError(`negative input ${v}`);\n}\n\nclass Plugin {')
    src = src.replace('      const x = input(r, "INPUT0");', '      const x = input(r, "INPUT0");\n      if (x.typed()[0] < 0) explode(x.typed()[0]);')
    (js / "model.js").write_text(src)
    js_line = src.splitlines().index("  throw new RangeError(`negative input ${v}`);") + 1
    src = (c / "model.c").read_text()
    src = src.replace("        float *out = malloc(", "        if (count && in[0] < 0) {\n"
                      '            tern_fail(&results[r], TERN_INVALID_ARG, "negative input %g", in[0]);\n'
                      "            continue;\n        }\n        float *out = malloc(")
    (c / "model.c").write_text(src)
    c_line = src.splitlines().index('            tern_fail(&results[r], TERN_INVALID_ARG, "negative input %g", in[0]);') + 1
    for p in (js, c):
        r = plugin_cmd("build", str(p), "--cache-dir", "none")
        assert r.returncode == 0, r.stderr
    t = Tern([f"--model-repository={repo}", f"--wasm-cache-dir={tmp_path / 'cache'}"])
    try:
        h = httpclient.InferenceServerClient(t.url)
        i = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        i.set_data_from_numpy(np.array([[-1.0, 2.0, 3.0]], dtype=np.float32))
        with pytest.raises(InferenceServerException) as e:
            h.infer("where_js", [i])
        assert f"RangeError: negative input -1 (at model.js:{js_line} in explode)" in str(e.value), str(e.value)
        assert t.wait_log("RangeError: negative input -1") and t.wait_log("at execute")
        with pytest.raises(InferenceServerException) as e:
            h.infer("where_c", [i])
        assert f"negative input -1 (at model.c:{c_line} in tern_model_execute)" in str(e.value), str(e.value)
        assert e.value.status() == "400"
    finally:
        t.stop()
