"""File-type detection end to end: the `magika` ensemble = magika_prep (WASM,
Magika's feature extraction) → magika_model (ONNX, from the `magika` wheel) →
magika_post (WASM, Magika's thresholds and overwrite rules), compared with the
`magika` Python package itself on real and generated files of many types, over
HTTP and gRPC, one file per request, one batch of all files, and concurrent
requests."""

import gzip
import io
import json
import os
import shutil
import struct
import tarfile
import zipfile
import zlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, Tern

import magika  # noqa: E402 (tests/requirements.txt)

REPO = os.path.join(ROOT, "model_repository")
MODELS = ("magika", "magika_prep", "magika_model", "magika_post")


def png(width=48, height=32):
    rows = b"".join(b"\x00" + bytes((x * 5 + y * 3) % 256 for x in range(width * 3)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def pdf():
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        None,
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    text = b"BT /F1 24 Tf 72 700 Td (Tern serves Magika) Tj ET"
    objects[3] = b"<< /Length %d >>\nstream\n%s\nendstream" % (len(text), text)
    out, offsets = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n"), []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def archive_zip():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in ("README.md", "Makefile"):
            # A fixed timestamp: every call must give the same bytes.
            z.writestr(zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0)), repo_file(name), zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def archive_tar():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = repo_file("Cargo.toml")
        info = tarfile.TarInfo("Cargo.toml")
        info.size, info.mtime = len(data), 1767225600
        t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def repo_file(path):
    return open(os.path.join(ROOT, path), "rb").read()


def samples():
    shell = b"#!/usr/bin/env bash\nset -euo pipefail\nfor f in \"$@\"; do\n  echo \"checking $f\"\n" \
        b"  if [ -f \"$f\" ]; then wc -l \"$f\"; else echo missing >&2; exit 1; fi\ndone\n"
    html = b"<!DOCTYPE html>\n<html>\n<head><title>Tern</title></head>\n<body>\n<h1>Hello</h1>\n" \
        b"<p>An inference server.</p>\n<ul><li>fast</li><li>small</li></ul>\n</body>\n</html>\n"
    prose = b"Tern reads Triton model repositories unchanged and runs user logic as sandboxed " \
        b"WebAssembly components. " * 6
    return {
        "prose": prose,
        "json": json.dumps({"name": "tern", "ports": [8000, 8001, 8002], "models": {"magika": {"ok": True}}},
                           indent=2).encode(),
        "png": png(),
        "pdf": pdf(),
        "zip": archive_zip(),
        "tar": archive_tar(),
        "gzip": gzip.compress(repo_file("README.md"), mtime=0),
        "elf": open(shutil.which("ls") or "/bin/ls", "rb").read(),
        "shell": shell,
        "html": html,
        "python": repo_file("tests/test_magika.py"),
        "rust": repo_file("plugins/magika_prep/src/lib.rs"),
        "makefile": repo_file("Makefile"),
        "markdown": repo_file("README.md"),
        "toml": repo_file("Cargo.toml"),
        "proto": repo_file("host/proto/grpc_service.proto"),
        "wasm": repo_file("model_repository/add_sub/1/model.wasm"),
        "onnx": repo_file("model_repository/tiny_lm/1/model.onnx"),
        "kb_json": repo_file("model_repository/magika_post/1/content_types_kb.min.json"),
        "random_bytes": np.random.default_rng(7).bytes(3000),
        "random_text": bytes(np.random.default_rng(8).integers(33, 127, 3000, dtype=np.uint8)),
        "empty": b"",
        "three_bytes": b"abc",
        "short_binary": b"\xff\xfe\x00",
        "mostly_spaces": b"   \n\t   x  \n   ",
        "short_not_utf8": b"\n\n    \xc3\x28ab  ",
    }


@pytest.fixture(scope="module")
def tsrv(tmp_path_factory):
    for m in MODELS[1:]:
        if not os.listdir(os.path.join(REPO, m, "1")):
            pytest.fail(f"model_repository/{m}/1 is empty; run `make setup`")
    cache = str(tmp_path_factory.mktemp("wasm-cache"))
    t = Tern([f"--model-repository={REPO}", f"--wasm-cache-dir={cache}"])
    yield t
    t.stop()


@pytest.fixture(scope="module")
def expected():
    m = magika.Magika()
    out = {}
    for name, content in samples().items():
        p = m.identify_bytes(content).prediction
        out[name] = (str(p.output.label), str(p.dl.label), p.score)
    return out


def file_input(client, contents):
    i = client.InferInput("FILE", [len(contents), 1], "BYTES")
    i.set_data_from_numpy(np.array([[c] for c in contents], dtype=np.object_))
    return i


def answers(result):
    labels = [x.decode() for x in result.as_numpy("LABEL").reshape(-1)]
    dl = [x.decode() for x in result.as_numpy("DL_LABEL").reshape(-1)]
    scores = result.as_numpy("SCORE").reshape(-1).tolist()
    return list(zip(labels, dl, scores))


def assert_same(name, got, want):
    assert got[0] == want[0] and got[1] == want[1], (name, got, want)
    assert abs(got[2] - want[2]) < 1e-4, (name, got, want)


def test_the_samples_cover_many_types(expected):
    # The comparison is only worth something if magika tells the samples apart.
    labels = {v[0] for v in expected.values()}
    assert {"png", "pdf", "zip", "elf", "json", "shell", "python", "html", "empty", "txt"} <= labels, labels


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_labels_match_the_magika_package(tsrv, expected, proto):
    client = httpclient if proto == "http" else grpcclient
    c = client.InferenceServerClient(tsrv.url if proto == "http" else tsrv.grpc_url)
    files = samples()
    for name, content in files.items():
        got = answers(c.infer("magika", [file_input(client, [content])]))
        assert len(got) == 1
        assert_same(name, got[0], expected[name])
    # All files as one batch of rows.
    got = answers(c.infer("magika", [file_input(client, list(files.values()))]))
    for name, g in zip(files, got):
        assert_same(name, g, expected[name])


def test_concurrent_requests_batch_and_stay_correct(tsrv, expected):
    c = httpclient.InferenceServerClient(tsrv.url, concurrency=16)
    files = list(samples().items()) * 3
    pending = [c.async_infer("magika", [file_input(httpclient, [content])]) for _, content in files]
    for (name, _), p in zip(files, pending):
        assert_same(name, answers(p.get_result())[0], expected[name])
    stats = c.get_inference_statistics("magika_model")["model_stats"][0]
    assert stats["inference_count"] >= len(files)


def test_wrong_input_is_a_clear_error(tsrv, expected):
    c = httpclient.InferenceServerClient(tsrv.url)
    i = httpclient.InferInput("FILE", [1, 1], "INT32")
    i.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(Exception, match="FILE"):
        c.infer("magika", [i])
    # ...and the pipeline keeps answering.
    got = answers(c.infer("magika", [file_input(httpclient, [samples()["shell"]])]))[0]
    assert_same("shell", got, expected["shell"])
