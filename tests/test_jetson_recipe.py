"""The Jetson image recipe (images/jetson/) as far as it can be checked without
a Jetson: the JetPack base images cannot be pulled here and the recipe was
never built. TERN_JETSON_CONTEXT names the build context
scripts/jetson_context.py assembled (`make jetson-context`).

* The Containerfile, read by a small parser (no container tool): every COPY
  source is in the context, every stage the JETPACK=5/6 and ORT_SOURCE build
  arguments reach starts from one of NVIDIA's L4T images for that JetPack,
  and the image's user, ports, entrypoint, command, environment, stop signal
  and labels are the CPU image's (read from scripts/images.py).
* The shell steps of the recipe: they parse, and the ONNX Runtime version gate
  (>= 1.17, what Tern needs) and the prebuilt paths (a wheel, the libraries,
  the JetPack's default wheel, a wheel from before 1.19 without the library)
  run here on stand-in files.
* The context's aarch64 binary under qemu-aarch64 with a 39-bit address space
  (as on Jetson kernels), run the way the image runs it (entrypoint, command,
  environment, with the image's paths mapped into the context), on the
  context's example repository and precompiled plugin cache: every plugin
  loads from the cache (none compiled, nothing written), and tritonclient gets
  answers over HTTP and gRPC from both plugins and the ONNX model. JetPack's
  ONNX Runtime cannot be built here, so the ONNX model runs on the aarch64 CPU
  build of ONNX Runtime (TERN_JETSON_ORT, default the one
  `scripts/dist.py --arch aarch64 --onnxruntime-only` fetches).
* With TERN_JETSON_TARBALL and TERN_HOST_BIN (what made the context), the
  context is made again and must be identical.
"""

import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, Tern

RECIPE = os.path.join(ROOT, "images", "jetson")
QEMU_DIR = os.path.join(ROOT, ".cache", "qemu-aarch64")
# What each JetPack is: its L4T major release, and the TensorRT and CUDA versions
# NVIDIA's l4t-tensorrt and l4t-cuda images are tagged with.
JETPACK = {
    "5": {"l4t": "35", "tensorrt": "8.5", "cuda": "11"},
    "6": {"l4t": "36", "tensorrt": "10.", "cuda": "12"},
}


def context():
    path = os.environ.get("TERN_JETSON_CONTEXT")
    if not path:
        pytest.skip("TERN_JETSON_CONTEXT is not set: `make jetson-context` assembles the Jetson build context "
                    "(scripts/jetson_context.py) and runs this test on it")
    if not os.path.isfile(os.path.join(path, "Containerfile")):
        pytest.fail(f"TERN_JETSON_CONTEXT={path} has no Containerfile: run scripts/jetson_context.py")
    return os.path.abspath(path)


# --- A Containerfile parser: enough of the Dockerfile syntax for this recipe. ---

def instructions(text):
    """(line number, INSTRUCTION, rest) for each instruction: continuation lines
    joined, comments and parser directives dropped."""
    out, buf, start = [], "", None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if start is None:
            start = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buf, start = "", None
    assert not buf, f"the Containerfile ends inside a continued instruction (line {start})"
    return out


def expand(s, env):
    """${VAR}, ${VAR:-default}, ${VAR:+alternative} and $VAR from env (an unknown
    variable is empty, as a base image's would be to this parser)."""
    def sub(m):
        name, op, word = m.group(1) or m.group(4), m.group(2), m.group(3)
        value = env.get(name) or ""
        if op == "-":
            return value or expand(word, env)
        if op == "+":
            return expand(word, env) if value else ""
        return value
    return re.sub(r"\$\{(\w+)(?::([-+])((?:[^}$]|\$\w+)*))?\}|\$(\w+)", sub, s)


def flags(rest):
    """--flag=value options at the start of COPY/FROM, and what follows them."""
    opts = {}
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        k, _, v = word[2:].partition("=")
        opts[k] = v
        rest = rest.strip()
    return opts, rest


def exec_form(rest):
    value = json.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), rest
    return value


def pairs(rest):
    """KEY=VALUE pairs of ENV/LABEL/ARG (quotes as the shell reads them)."""
    out = {}
    for word in shlex.split(rest):
        k, eq, v = word.partition("=")
        out[k] = v if eq else None
    return out


class Stage:
    def __init__(self, index, base, name):
        self.index, self.base, self.name = index, base, name
        self.items = []  # (line, INSTRUCTION, rest, args visible at that point)


def parse(text, build_args=None):
    """The stages of a Containerfile with `build_args` given (as `--build-arg`)."""
    build_args = dict(build_args or {})
    global_args, stages = {}, []
    declared = set()
    for line, word, rest in instructions(text):
        if word == "ARG" and not stages:
            for k, v in pairs(rest).items():
                declared.add(k)
                global_args[k] = build_args.get(k, expand(v or "", global_args))
            continue
        if word == "FROM":
            opts, rest = flags(rest)
            parts = rest.split()
            base = expand(parts[0], global_args)
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stage = Stage(len(stages), base, name)
            stage.args = {}
            stages.append(stage)
            continue
        assert stages, f"line {line}: {word} before the first FROM"
        stage = stages[-1]
        if word == "ARG":
            for k, v in pairs(rest).items():
                declared.add(k)
                if k in build_args:
                    stage.args[k] = build_args[k]
                elif v is not None:
                    stage.args[k] = expand(v, {**global_args, **stage.args})
                else:
                    stage.args[k] = global_args.get(k, "")
            continue
        stage.items.append((line, word, rest, dict(stage.args)))
    unknown = set(build_args) - declared
    assert not unknown, f"build arguments the Containerfile does not declare: {sorted(unknown)}"
    return stages


def by_name(stages):
    return {s.name: s for s in stages if s.name}


def reached(stages):
    """The stages the last one depends on (FROM aliases and COPY --from), and the
    external images at their roots."""
    names = by_name(stages)
    seen, external, todo = [], set(), [stages[-1]]
    while todo:
        s = todo.pop()
        if s in seen:
            continue
        seen.append(s)
        if s.base in names:
            todo.append(names[s.base])
        else:
            external.add(s.base)
        for _, word, rest, args in s.items:
            if word == "COPY":
                src = flags(rest)[0].get("from")
                if src:
                    assert src in names, f"COPY --from={src}: no such stage"
                    todo.append(names[src])
    return seen, external


def final_config(stages):
    """What the image's config gets from its last stage."""
    cfg = {"env": {}, "labels": {}, "exposed": set()}
    s = stages[-1]
    for _, word, rest, args in s.items:
        if word == "ENV":
            cfg["env"].update({k: expand(v or "", args) for k, v in pairs(rest).items()})
        elif word == "LABEL":
            cfg["labels"].update({k: expand(v or "", args) for k, v in pairs(rest).items()})
        elif word == "EXPOSE":
            cfg["exposed"].update(p if "/" in p else p + "/tcp" for p in rest.split())
        elif word in ("USER", "WORKDIR", "STOPSIGNAL"):
            cfg[word.lower()] = expand(rest, args)
        elif word in ("ENTRYPOINT", "CMD"):
            cfg[word.lower()] = exec_form(rest)
    return cfg


def containerfile():
    return open(os.path.join(context(), "Containerfile")).read()


# --- The CPU image's conventions, read from scripts/images.py. ---

def cpu_image():
    """The config scripts/images.py gives the CPU image (its `image_config`):
    labels, environment, entrypoint, cmd, user, exposed ports, stop signal.
    Labels whose value is computed per build (the version) read as None:
    only their presence is compared."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tern_images", os.path.join(ROOT, "scripts", "images.py"))
    images = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(images)
    c = images.image_config("cpu", None)
    return {
        "labels": c["Labels"],
        "entrypoint": c["Entrypoint"],
        "cmd": c["Cmd"],
        "user": c["User"],
        "workingdir": c["WorkingDir"],
        "env": dict(e.split("=", 1) for e in c["Env"]),
        "stopsignal": c["StopSignal"],
        "exposed": set(c["ExposedPorts"]),
    }


# --- The recipe, statically. ---

def test_every_copy_source_is_in_the_context():
    ctx = context()
    stages = parse(containerfile())
    names = by_name(stages)
    copies = 0
    for s in stages:
        for line, word, rest, args in s.items:
            assert word != "ADD", f"line {line}: ADD (use COPY: no remote or archive magic)"
            if word != "COPY":
                continue
            opts, rest = flags(rest)
            words = exec_form(rest) if rest.startswith("[") else rest.split()
            assert len(words) >= 2, f"line {line}: COPY needs a source and a destination"
            if "from" in opts:
                assert opts["from"] in names, f"line {line}: COPY --from={opts['from']}: no such stage"
                continue
            for src in words[:-1]:
                src = expand(src, args)
                assert not os.path.isabs(src) and ".." not in src.split("/"), f"line {line}: {src} leaves the context"
                found = glob.glob(os.path.join(ctx, src))
                assert found, f"line {line}: COPY {src}: not in the context {ctx}"
                if src.endswith("/"):
                    assert os.path.isdir(found[0]), f"line {line}: {src} is not a folder in the context"
                copies += 1
    assert copies >= 7, copies


@pytest.mark.parametrize("ort_source", ["build", "prebuilt"])
@pytest.mark.parametrize("jetpack", sorted(JETPACK))
def test_every_stage_starts_from_nvidias_l4t_image_for_that_jetpack(jetpack, ort_source):
    stages = parse(containerfile(), {"JETPACK": jetpack, "ORT_SOURCE": ort_source})
    seen, external = reached(stages)
    want = JETPACK[jetpack]
    for image in external:
        m = re.fullmatch(r"nvcr\.io/nvidia/(l4t-[a-z]+):(\S+)", image)
        assert m, f"JetPack {jetpack}: {image} is not one of NVIDIA's L4T images on nvcr.io"
        repo, tag = m.groups()
        if repo in ("l4t-jetpack", "l4t-base"):
            assert tag.startswith(f"r{want['l4t']}."), f"JetPack {jetpack} is L4T r{want['l4t']}: {image}"
        elif repo == "l4t-tensorrt":
            assert tag.startswith(f"r{want['tensorrt']}"), f"JetPack {jetpack} has TensorRT {want['tensorrt']}: {image}"
        elif repo == "l4t-cuda":
            assert tag.startswith(f"{want['cuda']}."), f"JetPack {jetpack} has CUDA {want['cuda']}: {image}"
        else:
            raise AssertionError(f"{image}: an L4T image this test does not know the JetPack of")
    # The image is the runtime base; ONNX Runtime comes from the stage ORT_SOURCE names,
    # built on (or unpacked in) the JetPack development image.
    names = by_name(stages)
    final = stages[-1]
    assert names[final.base].base.startswith("nvcr.io/nvidia/l4t-tensorrt:"), final.base
    ort = names["ort"]
    assert ort.base == f"ort-{ort_source}", ort.base
    assert names[names[ort.base].base].base.startswith("nvcr.io/nvidia/l4t-jetpack:"), ort.base
    assert names[f"ort-{'prebuilt' if ort_source == 'build' else 'build'}"] not in seen


def test_the_image_config_is_the_cpu_images():
    cpu = cpu_image()
    for jetpack in sorted(JETPACK):
        cfg = final_config(parse(containerfile(), {"JETPACK": jetpack}))
        assert cfg["user"] == cpu["user"] == "65532:65532", cfg["user"]
        assert cfg["workdir"] == cpu["workingdir"], cfg
        assert cfg["entrypoint"] == cpu["entrypoint"] == ["/usr/bin/tern"], cfg["entrypoint"]
        assert cfg["cmd"] == cpu["cmd"] == ["--model-repository=/models"], cfg["cmd"]
        assert cfg["exposed"] == cpu["exposed"], (cfg["exposed"], cpu["exposed"])
        assert cfg["stopsignal"] == cpu["stopsignal"], cfg
        for k, v in cpu["env"].items():
            assert cfg["env"].get(k) == v, (k, cfg["env"])
        assert set(cpu["labels"]) <= set(cfg["labels"]), (cpu["labels"], cfg["labels"])
        for k, v in cpu["labels"].items():
            if k == "org.opencontainers.image.description":
                assert "Jetson" in cfg["labels"][k] and f"JetPack {jetpack}" in cfg["labels"][k], cfg["labels"][k]
            elif k == "org.opencontainers.image.version":
                assert cfg["labels"][k] == version(), (cfg["labels"][k], version())
            elif k == "org.opencontainers.image.licenses":
                assert cfg["labels"][k].startswith("Apache-2.0 AND MIT"), cfg["labels"][k]
            elif v is not None:
                assert cfg["labels"][k] == v, (k, cfg["labels"][k], v)
        assert cfg["labels"]["io.tern.jetpack"] == jetpack


def test_the_shell_steps_parse():
    ctx = context()
    scripts = sorted(glob.glob(os.path.join(ctx, "*.sh")))
    assert {os.path.basename(s) for s in scripts} >= {"ort-build.sh", "ort-check.sh", "ort-prebuilt.sh",
                                                      "runtime-setup.sh"}, scripts
    for s in scripts:
        out = subprocess.run(["sh", "-n", s], capture_output=True, text=True)
        assert out.returncode == 0, (s, out.stderr)
        if shutil.which("shellcheck"):
            out = subprocess.run(["shellcheck", "-s", "sh", "-S", "warning", s], capture_output=True, text=True)
            assert out.returncode == 0, out.stdout


def test_the_context_holds_the_recipe_as_written():
    ctx = context()
    for f in sorted(os.listdir(RECIPE)):
        want = open(os.path.join(RECIPE, f)).read()
        got = open(os.path.join(ctx, f)).read()
        if f == "Containerfile":  # the version label's default is the tarball's version
            want = re.sub(r"^ARG TERN_VERSION=.*$", f"ARG TERN_VERSION={version()}", want, flags=re.M)
        assert got == want, f"{f} in the context differs from images/jetson/{f}: run scripts/jetson_context.py again"


# --- The ONNX Runtime steps, on stand-in files. ---

def run_sh(script, env, *args):
    full = {k: v for k, v in os.environ.items() if not k.startswith("ORT_")}
    full.update(env)
    return subprocess.run(["sh", os.path.join(RECIPE, script), *args], capture_output=True, text=True, env=full)


@pytest.mark.parametrize("ver,ok", [("1.16.0", False), ("1.16.3", False), ("1.17.0", True), ("1.17.3", True),
                                    ("1.18.0", True), ("1.23.0", True), ("1.31.1", True), ("2.0.0", True)])
def test_the_onnx_runtime_gate_wants_1_17_or_newer(tmp_path, ver, ok):
    (tmp_path / f"libonnxruntime.so.{ver}").write_bytes(b"stand-in")
    (tmp_path / "libonnxruntime_providers_shared.so").write_bytes(b"")
    (tmp_path / "libonnxruntime_providers_cuda.so").write_bytes(b"")
    out = run_sh("ort-check.sh", {}, str(tmp_path))
    assert (out.returncode == 0) == ok, out.stdout + out.stderr
    if ok:
        assert os.readlink(tmp_path / "libonnxruntime.so") == f"libonnxruntime.so.{ver}"
        assert f"ONNX Runtime {ver}" in out.stdout and "providers beside it: cuda" in out.stdout, out.stdout
    else:
        assert "C API level 17" in out.stderr and f"{ver} is older than 1.17" in out.stderr, out.stderr
        assert "ONNX Runtime versions" in out.stderr, out.stderr


def test_the_onnx_runtime_gate_wants_a_versioned_name(tmp_path):
    (tmp_path / "libonnxruntime.so").write_bytes(b"stand-in")
    out = run_sh("ort-check.sh", {}, str(tmp_path))
    assert out.returncode == 1 and "libonnxruntime.so.<version>" in out.stderr, out.stderr


def fake_wheel(path, ver, library=True):
    """A stand-in onnxruntime-gpu wheel: from 1.19 on ONNX Runtime's wheels hold
    libonnxruntime.so.<version>; before (library=False) only the Python module."""
    with zipfile.ZipFile(path, "w") as z:
        if library:
            z.writestr(f"onnxruntime/capi/libonnxruntime.so.{ver}", b"stand-in")
        z.writestr("onnxruntime/capi/onnxruntime_pybind11_state.so", b"stand-in")
        for p in ("shared", "cuda", "tensorrt"):
            z.writestr(f"onnxruntime/capi/libonnxruntime_providers_{p}.so", b"")
        z.writestr("onnxruntime/LICENSE", "MIT")
        z.writestr("onnxruntime/ThirdPartyNotices.txt", "notices")


def test_a_prebuilt_wheel_is_unpacked_and_gated(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    fake_wheel(src / "onnxruntime_gpu-1.23.0-cp310-cp310-linux_aarch64.whl", "1.23.0")
    r = run_sh("ort-prebuilt.sh", {"ORT_IN": str(src), "ORT_OUT": str(out)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(os.listdir(out / "lib")) == sorted([
        "libonnxruntime.so", "libonnxruntime.so.1.23.0", "libonnxruntime_providers_cuda.so",
        "libonnxruntime_providers_shared.so", "libonnxruntime_providers_tensorrt.so"])
    assert sorted(os.listdir(out / "licenses")) == ["onnxruntime-LICENSE", "onnxruntime-ThirdPartyNotices.txt"]
    assert "providers beside it: cuda tensorrt" in r.stdout, r.stdout
    # A build older than the oldest Tern runs with.
    shutil.rmtree(src), shutil.rmtree(out)
    src.mkdir()
    fake_wheel(src / "onnxruntime_gpu-1.16.3-cp38-cp38-linux_aarch64.whl", "1.16.3")
    r = run_sh("ort-prebuilt.sh", {"ORT_IN": str(src), "ORT_OUT": str(out)})
    assert r.returncode == 1 and "1.16.3 is older than 1.17" in r.stderr, r.stderr


def test_a_wheel_from_before_1_19_has_no_library_and_says_so(tmp_path):
    """Jetson Zoo's JetPack 5 wheels (1.17.0, 1.18.0) are from before ONNX
    Runtime put libonnxruntime.so into its wheels: the runtime is inside the
    Python module, which Tern cannot load."""
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    fake_wheel(src / "onnxruntime_gpu-1.17.0-cp38-cp38-linux_aarch64.whl", "1.17.0", library=False)
    r = run_sh("ort-prebuilt.sh", {"ORT_IN": str(src), "ORT_OUT": str(out), "JETPACK": "5"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "before 1.19" in r.stderr and "--build_shared_lib" in r.stderr, r.stderr
    assert not os.listdir(out / "lib")


def test_the_prebuilt_libraries_are_taken(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    for f in ("libonnxruntime.so.1.17.3", "libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so"):
        (src / f).write_bytes(b"stand-in")
    (src / "LICENSE").write_text("MIT")
    r = run_sh("ort-prebuilt.sh", {"ORT_IN": str(src), "ORT_OUT": str(out), "JETPACK": "5"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ONNX Runtime 1.17.3 (>= 1.17)" in r.stdout and "providers beside it: cuda" in r.stdout, r.stdout
    assert os.readlink(out / "lib" / "libonnxruntime.so") == "libonnxruntime.so.1.17.3"
    assert os.listdir(out / "licenses") == ["onnxruntime-LICENSE"]


def wheel_url(path):
    return "file://" + str(path), hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_jetpacks_default_wheel_is_taken_when_nothing_else_is_given(tmp_path):
    """JP<n>_ORT_WHEEL_URL (the Containerfile's default for JetPack 6: Jetson AI
    Lab's onnxruntime-gpu) is downloaded and checked against its SHA-256 when
    neither ORT_WHEEL_URL nor the context's ort-prebuilt/ gives one; both of
    those win over it."""
    assert shutil.which("curl"), "no curl to fetch a file:// URL (wget cannot); `make jetson-context` installs it"
    served = tmp_path / "index"
    served.mkdir()
    fake_wheel(served / "onnxruntime_gpu-1.23.0-cp310-cp310-linux_aarch64.whl", "1.23.0")
    url, sha = wheel_url(served / "onnxruntime_gpu-1.23.0-cp310-cp310-linux_aarch64.whl")
    default = {"JETPACK": "6", "JP6_ORT_WHEEL_URL": url, "JP6_ORT_WHEEL_SHA256": sha}

    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    r = run_sh("ort-prebuilt.sh", {"ORT_IN": str(src), "ORT_OUT": str(out), **default})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "JetPack 6's default ONNX Runtime" in r.stdout and "ONNX Runtime 1.23.0" in r.stdout, r.stdout
    # A wrong checksum stops the build.
    shutil.rmtree(src), shutil.rmtree(out)
    src.mkdir()
    r = run_sh("ort-prebuilt.sh", {"ORT_IN": str(src), "ORT_OUT": str(out), **default,
                                   "JP6_ORT_WHEEL_SHA256": "0" * 64})
    assert r.returncode != 0 and not os.path.exists(out / "lib" / "libonnxruntime.so"), r.stdout + r.stderr
    # The context's ort-prebuilt/ wins over the default.
    shutil.rmtree(src), shutil.rmtree(out)
    src.mkdir()
    fake_wheel(src / "onnxruntime_gpu-1.20.1-cp310-cp310-linux_aarch64.whl", "1.20.1")
    r = run_sh("ort-prebuilt.sh", {"ORT_IN": str(src), "ORT_OUT": str(out), **default})
    assert r.returncode == 0 and "ONNX Runtime 1.20.1" in r.stdout and "default ONNX Runtime" not in r.stdout, r.stdout
    # ORT_WHEEL_URL wins over both.
    shutil.rmtree(out)
    fake_wheel(served / "onnxruntime_gpu-1.31.1-cp310-cp310-linux_aarch64.whl", "1.31.1")
    url, sha = wheel_url(served / "onnxruntime_gpu-1.31.1-cp310-cp310-linux_aarch64.whl")
    r = run_sh("ort-prebuilt.sh", {"ORT_IN": str(src), "ORT_OUT": str(out), **default,
                                   "ORT_WHEEL_URL": url, "ORT_WHEEL_SHA256": sha})
    assert r.returncode == 0 and "ONNX Runtime 1.31.1" in r.stdout, r.stdout + r.stderr


def test_prebuilt_with_nothing_to_take_says_what_to_give(tmp_path):
    (tmp_path / "in").mkdir()
    r = run_sh("ort-prebuilt.sh", {"ORT_IN": str(tmp_path / "in"), "ORT_OUT": str(tmp_path / "out")})
    assert r.returncode == 1 and "ORT_WHEEL_URL" in r.stderr and "--ort-prebuilt" in r.stderr, r.stderr
    # JetPack 5 has no default wheel: the message says why and what to give.
    r = run_sh("ort-prebuilt.sh", {"ORT_IN": str(tmp_path / "in"), "ORT_OUT": str(tmp_path / "out"), "JETPACK": "5"})
    assert r.returncode == 1 and "JetPack 5 has no default" in r.stderr and "--build_shared_lib" in r.stderr, r.stderr


def test_the_default_is_the_jetpacks_published_onnx_runtime():
    """ORT_SOURCE defaults to prebuilt; JetPack 6's default wheel is Jetson AI
    Lab's onnxruntime-gpu for CUDA 12.6 (JetPack 6.1/6.2), pinned by SHA-256,
    and reaches the prebuilt stage; JetPack 5 has none."""
    text = containerfile()
    for jetpack in sorted(JETPACK):
        stages = parse(text, {"JETPACK": jetpack})
        names = by_name(stages)
        assert names["ort"].base == "ort-prebuilt", names["ort"].base
        runs = [args for _, word, rest, args in names["ort-prebuilt"].items if word == "RUN"]
        assert len(runs) == 1, runs
        args = runs[0]
        assert args["JETPACK"] == jetpack, args
        if jetpack == "6":
            assert re.fullmatch(r"https://pypi\.jetson-ai-lab\.io/jp6/cu126/\+f/[0-9a-f]{3}/[0-9a-f]{13}/"
                                r"onnxruntime_gpu-(\d+\.\d+\.\d+)-cp310-cp310-linux_aarch64\.whl",
                                args["JP6_ORT_WHEEL_URL"]), args["JP6_ORT_WHEEL_URL"]
            sha = args["JP6_ORT_WHEEL_SHA256"]
            assert re.fullmatch(r"[0-9a-f]{64}", sha), sha
            # The index's path names the file by the first 16 digits of its SHA-256.
            assert args["JP6_ORT_WHEEL_URL"].split("/+f/")[1].replace("/", "").startswith(sha[:16]), args
            ver = re.search(r"onnxruntime_gpu-([\d.]+)-", args["JP6_ORT_WHEEL_URL"]).group(1)
            assert tuple(map(int, ver.split("."))) >= (1, 19), f"{ver}: wheels before 1.19 hold no libonnxruntime.so"
        else:
            assert not args["JP5_ORT_WHEEL_URL"], args


def test_a_base_without_cuda_fails_the_build_naming_the_library(tmp_path):
    """runtime-setup.sh's check on stand-in providers built here: one linked
    against libcudart.so.12, which is not installed, and one against nothing."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build stand-in provider libraries")
    src = tmp_path / "s.c"
    src.write_text("int f(void) { return 1; }\n")
    lib = tmp_path / "lib"
    lib.mkdir()
    # A stub with the soname of CUDA 12's runtime, linked against and then removed.
    subprocess.run([cc, "-shared", "-fPIC", "-o", tmp_path / "libcudart.so", "-Wl,-soname,libcudart.so.12", src],
                   check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", lib / "libonnxruntime_providers_cuda.so", "-Wl,--no-as-needed",
                    src, f"-L{tmp_path}", "-lcudart"], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", lib / "libonnxruntime_providers_shared.so", src], check=True)
    os.remove(tmp_path / "libcudart.so")
    r = run_sh("runtime-setup.sh", {"TERN_LIB": str(lib)}, "--check-only")
    assert r.returncode == 1 and "  libcudart.so.12\n" in r.stderr and "l4t-jetpack" in r.stderr, r.stdout + r.stderr
    subprocess.run([cc, "-shared", "-fPIC", "-o", lib / "libonnxruntime_providers_cuda.so", src], check=True)
    r = run_sh("runtime-setup.sh", {"TERN_LIB": str(lib)}, "--check-only")
    assert r.returncode == 0 and "of libonnxruntime_providers_cuda.so is in the image" in r.stdout, r.stdout
    os.remove(lib / "libonnxruntime_providers_cuda.so")
    r = run_sh("runtime-setup.sh", {"TERN_LIB": str(lib)}, "--check-only")
    assert r.returncode == 0 and "ONNX models run on the CPU" in r.stdout, r.stdout


# --- scripts/jetson_context.py's own checks. ---

def context_script(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "jetson_context.py"), *args],
                          capture_output=True, text=True)


def test_the_context_script_names_a_missing_input(tmp_path):
    out = str(tmp_path / "ctx")
    r = context_script("--tarball", str(tmp_path / "nope.tar.gz"), "--tern-host", sys.executable, "--out", out)
    assert r.returncode != 0 and "no tarball at" in r.stderr and "make package-check" in r.stderr, r.stderr
    musl = tmp_path / "tern-0.1.0-aarch64-linux-musl.tar.gz"
    musl.write_bytes(b"")
    r = context_script("--tarball", str(musl), "--tern-host", sys.executable, "--out", out)
    assert r.returncode != 0 and "not an aarch64 gnu tarball" in r.stderr, r.stderr
    gnu = tmp_path / "tern-0.1.0-aarch64-linux-gnu.tar.gz"
    gnu.write_bytes(b"")
    r = context_script("--tarball", str(gnu), "--tern-host", str(tmp_path / "tern"), "--out", out)
    assert r.returncode != 0 and "no tern binary at" in r.stderr, r.stderr
    assert not os.path.exists(out)


def tree(top):
    """Every file and folder under top: mode, modification time, and the content's hash."""
    out = {}
    for d, dirs, files in os.walk(top):
        for name in dirs + files:
            p = os.path.join(d, name)
            st = os.lstat(p)
            digest = hashlib.sha256(open(p, "rb").read()).hexdigest() if name in files else None
            out[os.path.relpath(p, top)] = (oct(st.st_mode), int(st.st_mtime), digest)
    return out


def test_the_context_is_made_again_identically(tmp_path):
    ctx = context()
    tarball, host = os.environ.get("TERN_JETSON_TARBALL"), os.environ.get("TERN_HOST_BIN")
    if not (tarball and host):
        pytest.skip("TERN_JETSON_TARBALL and TERN_HOST_BIN (what made the context) are not set")
    again = tmp_path / "again"
    r = context_script("--tarball", tarball, "--tern-host", host, "--out", str(again))
    assert r.returncode == 0, r.stderr

    def comparable(t):
        # The key is fresh for each context (jetson_context.py), and so are
        # the seals made with it: their modes and times must match, not their bytes.
        secret = lambda path: path == "cwasm.key" or path.endswith(".seal")
        return {p: (m, t, None if secret(p) else d) for p, (m, t, d) in t.items()}

    assert comparable(tree(again)) == comparable(tree(ctx))
    assert tree(again)["cwasm.key"][2] != tree(ctx)["cwasm.key"][2], "each context has its own key"


# --- The context's binary, run the way the image runs it. ---

def qemu_root():
    root = os.path.join(QEMU_DIR, "root")
    if not os.path.exists(os.path.join(root, "proc", "cpuinfo")):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "qemu-aarch64.sh"), QEMU_DIR,
                        os.path.join(context(), "bin", "tern")], check=True, capture_output=True)
    return root


def qemu(*args):
    return ["qemu-aarch64", "-R", "512G", "-L", qemu_root(), *args]


_version = []


def version():
    """The version the context's binary reports (`tern --version`, under qemu)."""
    if not _version:
        out = subprocess.run(qemu(os.path.join(context(), "bin", "tern"), "--version"),
                             capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k != "ORT_DYLIB_PATH"})
        m = re.match(r"tern (\S+) \(commit \S+, aarch64-unknown-linux-gnu, features: ([^)]*)\)", out.stdout)
        assert m, out.stdout + out.stderr
        assert "onnx" in m.group(2) and "cuda" in m.group(2), f"the Jetson image needs the onnx and cuda features: {m.group(0)}"
        _version.append(m.group(1))
    return _version[0]


def cpu_onnxruntime():
    path = os.environ.get("TERN_JETSON_ORT")
    if not path:
        path = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "dist.py"), "--arch", "aarch64",
                               "--onnxruntime-only"], capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.isfile(path), path
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    ctx = context()
    cfg = final_config(parse(containerfile()))
    cache = str(tmp_path_factory.mktemp("var-cache-tern"))
    shutil.copytree(os.path.join(ctx, "cwasm"), cache, dirs_exist_ok=True)
    # The seal key, next to the cache folder as the Containerfile places it.
    shutil.copy(os.path.join(ctx, "cwasm.key"), cache + ".key")
    before = sorted(os.listdir(cache))
    # The image's paths, mapped into the context: /models, the plugin cache, ONNX Runtime.
    ort = cpu_onnxruntime()
    mapping = {"/models": os.path.join(ctx, "models"), "/var/cache/tern/wasm": cache,
               "/usr/lib/tern/libonnxruntime.so": ort, "/usr/lib/tern": os.path.dirname(ort)}
    env = {k: ":".join(mapping.get(p, p) for p in v.split(":")) for k, v in cfg["env"].items()}
    assert {cache, ort} <= set(env.values()), env
    env["ORT_DYLIB_PATH"] = None  # the test suite's own library must not leak in
    args = [re.sub(r"=/models$", "=" + mapping["/models"], a) for a in cfg["entrypoint"][1:] + cfg["cmd"]]
    assert cfg["entrypoint"][0] == "/usr/bin/tern"
    t = Tern(args, env=env, binary=os.path.join(ctx, "bin", "tern"),
             wrapper=["qemu-aarch64", "-R", "512G", "-L", qemu_root()])
    yield t, cache, before
    assert t.stop() == 0, t.log()


def test_every_plugin_loads_from_the_precompiled_cache(served):
    t, cache, before = served
    log = t.log()
    plugins = sorted(os.path.basename(os.path.dirname(os.path.dirname(p)))
                     for p in glob.glob(os.path.join(context(), "models", "*", "1", "model.wasm")))
    assert plugins == ["add_sub", "simple_identity"], plugins
    # A 39-bit address space, as on Jetson kernels: the on-demand entries serve.
    assert "pooling allocator unavailable" in log and "pooling=false" in log, log
    for m in plugins:
        # From the cache, or sharing the code of a model with the same component that was.
        assert f"(Cache) model={m} " in log or f"(Shared) model={m} " in log, (m, log)
    assert "(Compiled)" not in log and "recompiling" not in log, log
    assert sorted(os.listdir(cache)) == before, "the server wrote to the precompiled cache"
    # Both layouts are there for every plugin: one per component hash and layout.
    entries = [re.fullmatch(r"([0-9a-f]{64})-aarch64-(pooling|on-demand)\.cwasm(\.seal)?", e) for e in before]
    assert all(entries), before
    hashes = {e.group(1) for e in entries}
    # Each entry with its seal (its keyed digest under cwasm.key).
    assert len(hashes) == len(plugins) and len(before) == 4 * len(plugins), before


@pytest.mark.parametrize("mod", [httpclient, grpcclient], ids=["http", "grpc"])
def test_the_example_models_answer(served, mod):
    t = served[0]
    c = mod.InferenceServerClient(t.url if mod is httpclient else t.grpc_url)
    assert c.is_server_ready()
    for m in sorted(os.listdir(os.path.join(context(), "models"))):
        assert c.is_model_ready(m), m
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = np.full((2, 4), 0.5, dtype=np.float32)
    ins = [mod.InferInput("INPUT0", [2, 4], "FP32"), mod.InferInput("INPUT1", [2, 4], "FP32")]
    ins[0].set_data_from_numpy(x)
    ins[1].set_data_from_numpy(y)
    r = c.infer("add_sub", ins)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x + y)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), x - y)
    texts = np.array([[b"jetson", b"orin", "\u00fcber".encode()]], dtype=np.object_)
    ins = [mod.InferInput("INPUT0", [1, 3], "BYTES")]
    ins[0].set_data_from_numpy(texts)
    np.testing.assert_array_equal(c.infer("simple_identity", ins).as_numpy("OUTPUT0"), texts)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    ins = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    r = c.infer("simple", ins)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
