"""`make bench-detection`: preprocessing and end-to-end detection figures
for docs/PERFORMANCE.md, all measured in one run on the same images.

1. Per-image preprocessing (nudenet's: decode, pad to square, bilinear
   resize to 320, scale to an NCHW FP32 blob):
   * inside the plugin with the host kernels (`nudenet_prep`): the
     server-side compute time per request from the statistics extension;
   * numpy + PIL in this Python process (same steps);
   * nudenet's own OpenCV code (`_read_image`) in this process;
   * the pure-Python plugin (`nudenet_prep_pure`, PNG only): server-side.
2. End-to-end detection throughput: the `nudenet_detect` ensemble over HTTP
   vs `NudeDetector().detect()` in one Python process, at concurrency 1
   and 8 (threads; ONNX Runtime releases the GIL).
"""

import argparse
import concurrent.futures
import io
import json
import os
import sys
import time
import urllib.request

import numpy as np
import tritonclient.http as httpclient
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
from conftest import Tern  # noqa: E402
import gen_models  # noqa: E402
import test_detection  # noqa: E402


def images(fmt):
    out = []
    for seed in range(8):
        img = test_detection.faces(640, 480, seed)
        out.append(test_detection.encode(img, fmt))
    return out


def stats(url, model):
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats") as r:
        s = json.load(r)["model_stats"][0]["inference_stats"]
    return s["compute_infer"]["count"], s["compute_infer"]["ns"]


def server_ms(url, model, data, rounds):
    c = httpclient.InferenceServerClient(url)
    for d in data[:2]:
        test_detection.infer(c, httpclient, d, model)
    n0, ns0 = stats(url, model)
    for _ in range(rounds):
        for d in data:
            test_detection.infer(c, httpclient, d, model)
    n1, ns1 = stats(url, model)
    return (ns1 - ns0) / (n1 - n0) / 1e6


def local_ms(fn, data, rounds):
    for d in data[:2]:
        fn(d)
    t = time.perf_counter()
    for _ in range(rounds):
        for d in data:
            fn(d)
    return (time.perf_counter() - t) / (rounds * len(data)) * 1e3


def pil_numpy(data, size=320):
    """nudenet's preprocessing with PIL + numpy."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    side = max(w, h)
    square = Image.new("RGB", (side, side))
    square.paste(img, (0, 0))
    small = square.resize((size, size), Image.BILINEAR)
    a = np.asarray(small, dtype=np.float32)[:, :, ::-1] / 255.0
    return np.ascontiguousarray(a.transpose(2, 0, 1))[None]


def throughput(fn, data, concurrency, seconds):
    def worker(k):
        n, i, end = 0, k, time.perf_counter() + seconds
        call = fn()
        while time.perf_counter() < end:
            call(data[i % len(data)])
            i += 1
            n += 1
        return n

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        t = time.perf_counter()
        total = sum(pool.map(worker, range(concurrency)))
        return total / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tern", required=True)
    p.add_argument("--plugins", required=True)
    p.add_argument("--repo", default=".cache/bench-detection")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=10)
    a = p.parse_args()

    import shutil

    import nudenet.nudenet as nn

    shutil.rmtree(a.repo, ignore_errors=True)
    gen_models.detection_repo(a.repo, a.plugins)
    pure = os.path.join(a.repo, "nudenet_prep_pure")
    shutil.copytree(os.path.join(a.repo, "nudenet_prep"), pure)
    shutil.copy(os.path.join(a.plugins, "nudenet_prep_pure.wasm"), os.path.join(pure, "1", "model.wasm"))
    cfg = os.path.join(pure, "config.pbtxt")
    with open(cfg) as f:
        text = f.read().replace('"nudenet_prep"', '"nudenet_prep_pure"')
    with open(cfg, "w") as f:
        f.write(text.replace('"134217728"', '"536870912"') + 'parameters { key: "execution_timeout_ms" value: { string_value: "120000" } }\n')

    jpeg, png = images("JPEG"), images("PNG")
    server = Tern([f"--model-repository={a.repo}", "--log-verbose=0"], binary=a.tern)
    try:
        rows = []
        for name, data in (("JPEG", jpeg), ("PNG", png)):
            kern = server_ms(server.url, "nudenet_prep", data, a.rounds)
            pil = local_ms(pil_numpy, data, a.rounds)
            cv = local_ms(lambda d: nn._read_image(d, 320), data, a.rounds)
            rows.append((name, kern, pil, cv))
        pure_ms = server_ms(server.url, "nudenet_prep_pure", png[:2], 1)
        print("\n## Preprocessing per 640x480 image (ms), 8 images x", a.rounds, "rounds")
        print("| image | plugin + host kernels | numpy + PIL (native Python) | OpenCV (nudenet) | kernels / PIL |")
        print("|---|---|---|---|---|")
        for name, kern, pil, cv in rows:
            print(f"| {name} | {kern:.2f} | {pil:.2f} | {cv:.2f} | {kern / pil:.2f}x |")
        png_kern = rows[1][1]
        print(f"\npure-Python plugin (PNG): {pure_ms:.0f} ms per image = {pure_ms / png_kern:.0f}x the host kernels")

        det = nn.NudeDetector()
        print("\n## End-to-end detection, JPEG 640x480 (images/s)")
        print("| concurrency | Tern ensemble (HTTP) | nudenet in one Python process | ratio |")
        print("|---|---|---|---|")
        for conc in (1, 8):
            def tern_call():
                c = httpclient.InferenceServerClient(server.url)
                return lambda d: test_detection.infer(c, httpclient, d)

            t = throughput(tern_call, jpeg, conc, a.seconds)
            n = throughput(lambda: det.detect, jpeg, conc, a.seconds)
            print(f"| {conc} | {t:.1f} | {n:.1f} | {t / n:.2f} |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
