"""`nudenet_prep_pure`: `nudenet_prep` without the host kernels, as a
plugin author without them has to write it: PNG decoding (zlib + the PNG
filters), padding, OpenCV-style bilinear resizing and normalisation in
pure Python. The baseline `make bench-detection` compares the host
kernels with (PNG only; JPEG is out of reach in pure Python).

IMAGE (BYTES [1]: an 8-bit RGB or RGBA PNG) -> images (FP32 [3, S, S],
BGR as nudenet feeds its detector) and META (FP32 [4])."""

import array
import json
import struct
import zlib

import tern_plugin as pb_utils


def decode_png(data):
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise pb_utils.TritonError("not a PNG file")
    pos, idat, w = 8, [], 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            if depth != 8 or ctype not in (2, 6):
                raise pb_utils.TritonError("only 8-bit RGB/RGBA PNGs are supported")
            c = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    raw = zlib.decompress(b"".join(idat))
    stride = w * c
    out = bytearray(h * stride)
    prev = bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(c, stride):
                line[i] = (line[i] + line[i - c]) & 255
        elif f == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 255
        elif f == 3:
            for i in range(stride):
                left = line[i - c] if i >= c else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - c] if i >= c else 0
                b = prev[i]
                cc = prev[i - c] if i >= c else 0
                p = a + b - cc
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - cc)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else cc)) & 255
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return w, h, c, out


def axis_weights(src, dst):
    """OpenCV INTER_LINEAR source index pairs and weights for one axis."""
    scale = src / dst
    res = []
    for d in range(dst):
        f = (d + 0.5) * scale - 0.5
        i = int(f // 1)
        f -= i
        if i < 0:
            i, f = 0, 0.0
        if i >= src - 1:
            i, f = src - 1, 0.0
        res.append((i, min(i + 1, src - 1), 1.0 - f, f))
    return res


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.size = int(params.get("input_size", {}).get("string_value", "320"))

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_list()[0]
            w, h, c, px = decode_png(data)
            side = max(w, h)
            s = self.size
            xs, ys = axis_weights(side, s), axis_weights(side, s)
            planes = [array.array("f", bytes(4 * s * s)) for _ in range(3)]

            def at(x, y, ch):  # the padded image: zeros right of / below the picture
                return px[(y * w + x) * c + ch] if x < w and y < h else 0

            for oy, (y0, y1, wy0, wy1) in enumerate(ys):
                for ox, (x0, x1, wx0, wx1) in enumerate(xs):
                    for ch in range(3):
                        v = (at(x0, y0, ch) * wx0 + at(x1, y0, ch) * wx1) * wy0 + (
                            at(x0, y1, ch) * wx0 + at(x1, y1, ch) * wx1) * wy1
                        # RGB in the file, BGR to the detector.
                        planes[2 - ch][oy * s + ox] = round(v) / 255.0
            blob = planes[0] + planes[1] + planes[2]
            out = pb_utils.Tensor("images", blob, "FP32", [1, 3, s, s])
            meta = pb_utils.Tensor("META", [w, h, side - w, side - h], "FP32", [1, 4])
            responses.append(pb_utils.InferenceResponse(output_tensors=[out, meta]))
        return responses


Model = pb_utils.export(TritonPythonModel)
