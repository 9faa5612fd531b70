"""A real detection pipeline on the host kernels (`tern:plugin/ops`):
`nudenet_detect` = `nudenet_prep` (Python plugin, nudenet's OpenCV
preprocessing ported line for line to `tern_ops`) -> the YOLOv8 detector
from the nudenet wheel (ONNX) -> `yolo_post` (Rust plugin: box decoding
and NMS on `tern_plugin::ops`), compared with nudenet's own
`NudeDetector().detect()` on images drawn with PIL at test time (JPEG and
PNG, WebP, BMP, RGB and RGBA, several sizes and aspect ratios), over HTTP and gRPC;
the preprocessing and the post-processing are also checked on their own
against nudenet's functions; corrupt files and decompression bombs fail
alone; host arrays are released request after request."""

import concurrent.futures
import io
import os
import random
import struct
import zlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Tern
import gen_models

import nudenet  # noqa: E402 (make setup installs it)
from PIL import Image, ImageDraw, ImageFilter  # noqa: E402
import nudenet.nudenet as nn  # noqa: E402

WASM_DIR = os.environ.get("TERN_PLUGINS_DIR", os.path.join(ROOT, "target", "wasm32-wasip2", "release"))

# Scores may differ by this much from nudenet's: zune-jpeg vs libjpeg-turbo
# (up to 3 levels per pixel) and fast_image_resize vs OpenCV's fixed-point
# bilinear (up to 1 level) feed the detector slightly different pixels.
SCORE_TOL = 0.03
BOX_TOL = 3


def faces(w, h, seed, mode="RGB"):
    """A drawing of cartoon faces the detector finds (FACE_FEMALE) on a plain background."""
    r = random.Random(seed)
    img = Image.new("RGB", (w, h), (r.randrange(60, 200),) * 3)
    dr = ImageDraw.Draw(img)
    for _ in range(3):
        fw = r.randrange(w // 6, w // 2)
        fh = int(fw * 1.3)
        x0, y0 = r.randrange(0, max(1, w - fw)), r.randrange(0, max(1, h - fh))
        skin = (r.randrange(190, 240), r.randrange(140, 190), r.randrange(110, 160))
        dr.ellipse([x0 - fw * 0.1, y0 - fh * 0.15, x0 + fw * 1.1, y0 + fh * 0.5], fill=(r.randrange(20, 90),) * 3)
        dr.ellipse([x0, y0, x0 + fw, y0 + fh], fill=skin)
        ey, er = fh * 0.38, fw * 0.08
        for cx in (x0 + fw * 0.3, x0 + fw * 0.7):
            dr.ellipse([cx - er, y0 + ey - er * 0.6, cx + er, y0 + ey + er * 0.6], fill=(255, 255, 255))
            dr.ellipse([cx - er * 0.5, y0 + ey - er * 0.5, cx + er * 0.5, y0 + ey + er * 0.5], fill=(60, 40, 20))
        dr.line([x0 + fw * 0.5, y0 + fh * 0.45, x0 + fw * 0.45, y0 + fh * 0.62], fill=(150, 100, 80), width=3)
        dr.chord([x0 + fw * 0.32, y0 + fh * 0.62, x0 + fw * 0.68, y0 + fh * 0.82], 0, 180, fill=(170, 60, 60))
    img = img.filter(ImageFilter.GaussianBlur(2))
    return img.convert(mode) if mode != "RGB" else img


def encode(img, fmt):
    b = io.BytesIO()
    img.save(b, fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return b.getvalue()


# (seed, size, format, mode): faces found, none found, RGBA, tall, wide,
# tiny, lossy WebP, BMP.
CASES = [
    (3, (300, 500), "JPEG", "RGB"),
    (5, (300, 500), "PNG", "RGB"),
    (11, (300, 500), "PNG", "RGBA"),
    (18, (640, 480), "JPEG", "RGB"),
    (18, (300, 500), "PNG", "RGB"),
    (1, (640, 480), "JPEG", "RGB"),
    (15, (300, 500), "JPEG", "RGB"),
    (4, (1000, 250), "PNG", "RGB"),
    (7, (64, 48), "JPEG", "RGB"),
    (11, (300, 500), "WEBP", "RGB"),
    (3, (300, 500), "BMP", "RGB"),
]


def image_bytes(case):
    seed, (w, h), fmt, mode = case
    return encode(faces(w, h, seed, mode), fmt)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    for p in ("nudenet_prep", "yolo_post"):
        if not os.path.exists(os.path.join(WASM_DIR, p + ".wasm")):
            pytest.fail(f"{p}.wasm not found in {WASM_DIR}; run `make plugins lang-plugins`")
    root = str(tmp_path_factory.mktemp("detection") / "models")
    gen_models.detection_repo(root, WASM_DIR)
    return root


@pytest.fixture(scope="module")
def server(repo):
    t = Tern([f"--model-repository={repo}", "--log-verbose=0"])
    yield t
    t.stop()


@pytest.fixture(scope="module")
def detector():
    return nn.NudeDetector()


def infer(client, mod, data, model="nudenet_detect"):
    inp = mod.InferInput("IMAGE", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[data]], dtype=object))
    return client.infer(model, [inp])


def detections(r):
    return [
        (label.decode(), float(score), box)
        for label, score, box in zip(r.as_numpy("LABELS")[0], r.as_numpy("SCORES")[0], r.as_numpy("BOXES")[0].tolist())
    ]


def assert_same(got, ref, what):
    """Same detections up to pixel-level rounding: every one matched by label,
    score and box; one missing only when its score is within the tolerance
    of nudenet's NMS threshold (0.25)."""
    ref = [(d["class"], d["score"], d["box"]) for d in ref]
    unmatched = list(got)
    for label, score, box in ref:
        match = next(
            (
                g
                for g in unmatched
                if g[0] == label
                and abs(g[1] - score) <= SCORE_TOL
                and max(abs(a - b) for a, b in zip(g[2], box)) <= BOX_TOL
            ),
            None,
        )
        if match is None:
            assert score < 0.25 + SCORE_TOL, f"{what}: {label} {score:.3f} {box} not found in {got}"
        else:
            unmatched.remove(match)
    for label, score, box in unmatched:
        assert score < 0.25 + SCORE_TOL, f"{what}: extra detection {label} {score:.3f} {box}; nudenet: {ref}"


def test_detections_match_nudenet_over_http_and_grpc(server, detector):
    h = httpclient.InferenceServerClient(server.url)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    found = 0
    for case in CASES:
        data = image_bytes(case)
        ref = detector.detect(data)
        found += len(ref)
        for name, client, mod in (("http", h, httpclient), ("grpc", g, grpcclient)):
            got = detections(infer(client, mod, data))
            assert_same(got, ref, f"{case} over {name}")
    assert found >= 6, "the test images must give the detector something to find"


def test_preprocessing_matches_opencv_pixel_for_pixel(server):
    """nudenet_prep's blob against nudenet's `_read_image` (OpenCV)."""
    c = httpclient.InferenceServerClient(server.url)
    for case in CASES:
        data = image_bytes(case)
        blob, _, _, x_pad, y_pad, w, h = nn._read_image(data, 320)
        r = infer(c, httpclient, data, "nudenet_prep")
        got = r.as_numpy("images")
        assert got.shape == (1, 3, 320, 320) and got.dtype == np.float32
        levels = np.abs(got - blob) * 255
        fmt = case[2]
        assert levels.max() <= (1.01 if fmt in ("PNG", "BMP") else 4.01), f"{case}: max {levels.max()} levels off"
        assert levels.mean() < 0.2, f"{case}: mean {levels.mean()} levels off"
        assert r.as_numpy("META").tolist() == [[w, h, x_pad, y_pad]]


def test_postprocessing_equals_nudenet_on_the_same_model_output(server):
    """yolo_post alone on a detector output with planted boxes (overlapping,
    of several classes, near the thresholds, outside the image): exactly
    nudenet's `_postprocess`."""
    rng = np.random.default_rng(7)
    out = rng.uniform(0, 0.15, size=(1, 22, 2100)).astype(np.float32)
    out[0, 0:4] = rng.uniform(0, 320, size=(4, 2100)).astype(np.float32)
    for anchor in rng.choice(2100, size=60, replace=False):
        cls = int(rng.integers(0, 18))
        out[0, 4 + cls, anchor] = np.float32(rng.choice([0.21, 0.26, 0.5, 0.9]) + rng.uniform(0, 0.05))
    # A cluster of overlapping boxes for NMS, and one far outside the image.
    for i, a in enumerate(range(100, 110)):
        out[0, 0:4, a] = [150 + i, 150 + i, 80, 60]
        out[0, 4 + (i % 3), a] = 0.3 + i * 0.05
    out[0, 0:4, 200] = [400, -30, 100, 100]
    out[0, 5, 200] = 0.8
    c = httpclient.InferenceServerClient(server.url)
    for w, h, x_pad, y_pad in [(300, 500, 200, 0), (640, 480, 0, 160), (320, 320, 0, 0)]:
        ref = nn._postprocess([out], x_pad, y_pad, 0, 0, w, h, 320, 320)
        raw = httpclient.InferInput("output0", [1, 22, 2100], "FP32")
        raw.set_data_from_numpy(out)
        meta = httpclient.InferInput("META", [1, 4], "FP32")
        meta.set_data_from_numpy(np.array([[w, h, x_pad, y_pad]], dtype=np.float32))
        got = detections(c.infer("yolo_post", [raw, meta]))
        assert len(ref) >= 10
        assert [(d["class"], d["box"]) for d in ref] == [(g[0], g[2]) for g in got]
        assert [np.float32(d["score"]) for d in ref] == [np.float32(g[1]) for g in got]


def png_header_only(w, h):
    """A PNG whose header claims w x h pixels (valid CRC) and whose data is tiny."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    "data,expect",
    [
        (b"definitely not an image", "cannot decode the image"),
        (image_bytes(CASES[1])[:3000], "cannot decode the image"),
        (image_bytes(CASES[0])[:120], "cannot decode the image"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "cannot decode the image"),
        (png_header_only(60000, 60000), "memory cap"),
        (b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", "JPEG, PNG, WebP and BMP are supported"),
    ],
    ids=["garbage", "truncated-png", "jpeg-header-only", "broken-png", "bomb-header", "gif"],
)
def test_bad_images_fail_alone(server, detector, data, expect):
    for client, mod in (
        (httpclient.InferenceServerClient(server.url), httpclient),
        (grpcclient.InferenceServerClient(server.grpc_url), grpcclient),
    ):
        with pytest.raises(InferenceServerException) as e:
            infer(client, mod, data)
        assert expect in str(e.value), str(e.value)
        good = image_bytes(CASES[1])
        assert_same(detections(infer(client, mod, good)), detector.detect(good), "after a bad image")


def test_host_arrays_are_released_under_load(server, detector):
    """Each request makes ~20 MB of host arrays from a 1600x1200 image
    under a 128 MiB cap: they must be freed as the plugin drops them, from
    8 threads (dynamic batching, one instance per model)."""
    big = encode(faces(1600, 1200, 3), "PNG")
    ref = detector.detect(big)

    def one(_):
        c = httpclient.InferenceServerClient(server.url)
        return detections(infer(c, httpclient, big))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for got in pool.map(one, range(48)):
            assert_same(got, ref, "big image under load")
    assert "memory cap" not in server.log()
