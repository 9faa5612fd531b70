//! Images as HWC `UINT8` [`Array`]s: decoding (JPEG, PNG, WebP, BMP with
//! the `image` crate, bounded by a byte budget checked against the header
//! before any pixel is decoded), colour conversion (OpenCV's fixed-point
//! luma), resizing (`fast_image_resize`: nearest, bilinear interpolation
//! as OpenCV's `INTER_LINEAR`, box as `INTER_AREA`), padding, cropping,
//! letterboxing and normalisation into NCHW/NHWC model inputs.

use std::io::Cursor;

use fast_image_resize as fr;
use half::f16;
use image::{DynamicImage, ImageDecoder, ImageFormat};
use tern_core::error::{Error, Result};
use tern_core::DataType;

use crate::array::Array;

/// Colour layouts of HWC `UINT8` images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Color {
    /// One channel.
    Gray,
    /// Red, green, blue.
    Rgb,
    /// Blue, green, red (OpenCV's order).
    Bgr,
    /// RGB and alpha.
    Rgba,
    /// BGR and alpha.
    Bgra,
}

impl Color {
    /// Number of channels.
    pub fn channels(self) -> usize {
        match self {
            Color::Gray => 1,
            Color::Rgb | Color::Bgr => 3,
            Color::Rgba | Color::Bgra => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Color::Gray => "gray",
            Color::Rgb => "rgb",
            Color::Bgr => "bgr",
            Color::Rgba => "rgba",
            Color::Bgra => "bgra",
        }
    }
}

/// Resampling filters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// Nearest neighbour.
    Nearest,
    /// Bilinear interpolation with half-pixel centres and no antialiasing
    /// (OpenCV's `INTER_LINEAR`).
    Bilinear,
    /// The mean of the covered source pixels (OpenCV's `INTER_AREA` when
    /// shrinking).
    Area,
}

/// Layouts `normalize` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[1, C, H, W]`.
    Nchw,
    /// `[1, H, W, C]`.
    Nhwc,
}

/// Height, width and channels of an HWC `UINT8` image.
pub fn hwc(img: &Array) -> Result<(usize, usize, usize)> {
    match (img.dtype(), img.shape()) {
        (DataType::Uint8, &[h, w, c]) if (1..=4).contains(&c) => Ok((h, w, c)),
        (dtype, shape) => Err(Error::invalid_arg(format!(
            "expected an image: a UINT8 array of shape [height, width, channels] with 1 to 4 channels, got {} {shape:?}",
            dtype.wire_name()
        ))),
    }
}

fn image(h: usize, w: usize, c: usize, data: Vec<u8>) -> Result<Array> {
    Array::new(DataType::Uint8, vec![h, w, c], data.into())
}

fn bad_image(e: impl std::fmt::Display) -> Error {
    Error::invalid_arg(format!("cannot decode the image: {e}"))
}

/// Reads an image's header: (width, height, channels), nothing decoded.
pub fn probe(data: &[u8]) -> Result<(u32, u32, u32)> {
    guarded(|| {
        let decoder = reader(data)?.into_decoder().map_err(bad_image)?;
        let (w, h) = decoder.dimensions();
        Ok((w, h, decoder.color_type().channel_count() as u32))
    })
}

/// Runs third-party decoder code, turning a panic in it into a bad-image
/// error: the decoders can panic on crafted files (zune-jpeg's AVX2
/// upsampler asserted on an 895-byte progressive JPEG the `image` fuzz
/// target found), and a bad file is the caller's error, not a failed call.
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_string());
        Err(bad_image(format!("the decoder failed on it ({what})")))
    })
}

/// A reader for `data`, refusing formats other than JPEG, PNG, WebP, BMP.
fn reader(data: &[u8]) -> Result<image::ImageReader<Cursor<&[u8]>>> {
    let reader = image::ImageReader::new(Cursor::new(data))
        .with_guessed_format()
        .map_err(bad_image)?;
    match reader.format() {
        Some(ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP | ImageFormat::Bmp) => {
            Ok(reader)
        }
        Some(other) => Err(Error::unsupported(format!(
            "cannot decode {other:?} images: JPEG, PNG, WebP and BMP are supported"
        ))),
        None => Err(Error::invalid_arg(
            "cannot decode the image: not a JPEG, PNG, WebP or BMP file",
        )),
    }
}

/// Decodes a JPEG, PNG, WebP or BMP image into an HWC `UINT8` array in
/// `color`. The header is read first: an image whose decoded pixels would
/// need more than `budget` bytes fails before anything is allocated, and
/// the decoder itself is held to the same budget. EXIF orientation is not
/// applied (as OpenCV's `IMREAD_UNCHANGED`).
pub fn decode(data: &[u8], color: Color, budget: usize) -> Result<Array> {
    guarded(|| decode_unguarded(data, color, budget))
}

fn decode_unguarded(data: &[u8], color: Color, budget: usize) -> Result<Array> {
    let mut reader = reader(data)?;
    let format = reader.format();
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(budget as u64);
    reader.limits(limits);
    let decoder = reader.into_decoder().map_err(bad_image)?;
    let (w, h) = decoder.dimensions();
    let out = (w as u64) * (h as u64) * color.channels() as u64;
    let need = decoder
        .total_bytes()
        .saturating_add(out)
        .saturating_add(decoder_buffers(format, data, (w, h)));
    if need > budget as u64 {
        return Err(Error::unavailable(format!(
            "decoding a {w}x{h} image needs {need} bytes, more than the {budget} bytes left under the plugin's memory cap (max_memory_bytes)"
        )));
    }
    if w == 0 || h == 0 {
        return Err(bad_image(format!("the image is {w}x{h}")));
    }
    let gray_source = !decoder.color_type().has_color();
    let img = DynamicImage::from_decoder(decoder).map_err(bad_image)?;
    let (h, w) = (h as usize, w as usize);
    match color {
        Color::Gray if gray_source => image(h, w, 1, img.into_luma8().into_raw()),
        Color::Rgb => image(h, w, 3, img.into_rgb8().into_raw()),
        Color::Rgba => image(h, w, 4, img.into_rgba8().into_raw()),
        Color::Gray | Color::Bgr => {
            let rgb = image(h, w, 3, img.into_rgb8().into_raw())?;
            convert_color(&rgb, Color::Rgb, color)
        }
        Color::Bgra => {
            let rgba = image(h, w, 4, img.into_rgba8().into_raw())?;
            convert_color(&rgba, Color::Rgba, color)
        }
    }
}

/// What the decoders allocate besides the pixels, which their allocation
/// limits do not bound: zune-jpeg's buffers for one row of MCUs grow with
/// the width (up to ~220 bytes per column: 3.3 MB for a 15105x1 image),
/// and a progressive JPEG keeps every coefficient until its last scan (2
/// bytes per sample, padded to whole MCUs; counted for every JPEG, with 4
/// components, as the file's markers cannot be trusted to say which it
/// is); image-webp allocates the first VP8 partition (< 512 KiB) and then
/// each DCT partition (< 16 MiB) at the size the file declares, before
/// reading it, so a 61-byte file can make it allocate 16 MiB, while a
/// lossless WebP is decoded into ARGB words (4 bytes a pixel) before it is
/// written out as RGB(A). Found by the `image` fuzz target (fuzz/README.md).
fn decoder_buffers(format: Option<ImageFormat>, data: &[u8], (w, h): (u32, u32)) -> u64 {
    let (w, h) = (u64::from(w), u64::from(h));
    match format {
        Some(ImageFormat::Jpeg) => w * 256 + (w + 32) * (h + 32) * 4 * 2,
        Some(ImageFormat::WebP) => {
            // Lossy: its partitions (the first < 512 KiB, one DCT partition
            // < 16 MiB, allocated at their declared sizes) and the YUV 4:2:0
            // frame it decodes into, in whole 16x16 macroblocks, with a row
            // of per-macroblock state.
            let (mw, mh) = (w.div_ceil(16) * 16, h.div_ceil(16) * 16);
            let lossy = (1 << 24) + (1 << 19) + mw * mh * 3 / 2 + w * 64;
            // Lossless ("VP8L"): the ARGB frame.
            let lossless = w * h * 4;
            match data.get(12..16) {
                Some(b"VP8L") => lossless,
                Some(b"VP8 ") => lossy,
                // Extended ("VP8X"): either.
                _ => lossy.max(lossless),
            }
        }
        _ => 0,
    }
}

/// OpenCV's fixed-point ITU-R 601 luma (`cvtColor(..., COLOR_RGB2GRAY)`).
fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((r as u32 * 4899 + g as u32 * 9617 + b as u32 * 1868 + 8192) >> 14) as u8
}

/// Converts an HWC `UINT8` image from `from` to `to`: channels reordered,
/// alpha dropped (or added as 255), gray from OpenCV's luma.
pub fn convert_color(img: &Array, from: Color, to: Color) -> Result<Array> {
    let (h, w, c) = hwc(img)?;
    if c != from.channels() {
        return Err(Error::invalid_arg(format!(
            "convert-color: a {} image has {} channels, this one has {c}",
            from.name(),
            from.channels()
        )));
    }
    if from == to {
        return Ok(img.clone());
    }
    let src = &img.data()[..];
    // Every source pixel as (r, g, b, a).
    let rgba = |p: &[u8]| -> [u8; 4] {
        match from {
            Color::Gray => [p[0], p[0], p[0], 255],
            Color::Rgb => [p[0], p[1], p[2], 255],
            Color::Bgr => [p[2], p[1], p[0], 255],
            Color::Rgba => [p[0], p[1], p[2], p[3]],
            Color::Bgra => [p[2], p[1], p[0], p[3]],
        }
    };
    let oc = to.channels();
    let mut out = Vec::with_capacity(h * w * oc);
    for p in src.chunks_exact(c) {
        let [r, g, b, a] = rgba(p);
        match to {
            Color::Gray => out.push(if from == Color::Gray {
                p[0]
            } else {
                luma(r, g, b)
            }),
            Color::Rgb => out.extend_from_slice(&[r, g, b]),
            Color::Bgr => out.extend_from_slice(&[b, g, r]),
            Color::Rgba => out.extend_from_slice(&[r, g, b, a]),
            Color::Bgra => out.extend_from_slice(&[b, g, r, a]),
        }
    }
    image(h, w, oc, out)
}

/// Resizes `src` (`w` x `h` pixels of type `P`) into a new `width` x
/// `height` buffer. Typed, not through `fr::PixelType`: the untyped entry
/// point dispatches at run time over every pixel type the crate has (16-bit,
/// float, ...), which keeps all of them in the binary; these four are all
/// `UINT8` HWC images need.
fn resize_pixels<P: fr::PixelTrait>(
    src: &[u8],
    (w, h): (u32, u32),
    (width, height): (u32, u32),
    options: &fr::ResizeOptions,
) -> std::result::Result<Vec<u8>, String> {
    let src = fr::images::TypedImageRef::<P>::from_buffer(w, h, src).map_err(|e| e.to_string())?;
    let mut out = vec![0u8; width as usize * height as usize * P::size()];
    let mut dst = fr::images::TypedImage::<P>::from_buffer(width, height, &mut out)
        .map_err(|e| e.to_string())?;
    fr::Resizer::new()
        .resize_typed(&src, &mut dst, options)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Resizes an HWC `UINT8` image to `height` x `width`.
pub fn resize(img: &Array, height: usize, width: usize, filter: Filter) -> Result<Array> {
    let (h, w, c) = hwc(img)?;
    if height == 0 || width == 0 || h == 0 || w == 0 {
        return Err(Error::invalid_arg(format!(
            "resize: cannot resize a {w}x{h} image to {width}x{height}"
        )));
    }
    let dims = |v: usize| {
        u32::try_from(v).map_err(|_| Error::invalid_arg(format!("resize: size {v} is too large")))
    };
    if (h, w) == (height, width) {
        return Ok(img.clone());
    }
    let (from, to) = ((dims(w)?, dims(h)?), (dims(width)?, dims(height)?));
    let alg = match filter {
        Filter::Nearest => fr::ResizeAlg::Nearest,
        Filter::Bilinear => fr::ResizeAlg::Interpolation(fr::FilterType::Bilinear),
        Filter::Area => fr::ResizeAlg::Convolution(fr::FilterType::Box),
    };
    let options = fr::ResizeOptions::new().resize_alg(alg).use_alpha(false);
    let src = img.data();
    let out = match c {
        1 => resize_pixels::<fr::pixels::U8>(src, from, to, &options),
        2 => resize_pixels::<fr::pixels::U8x2>(src, from, to, &options),
        3 => resize_pixels::<fr::pixels::U8x3>(src, from, to, &options),
        _ => resize_pixels::<fr::pixels::U8x4>(src, from, to, &options),
    }
    .map_err(|e| Error::internal(format!("resize: {e}")))?;
    image(height, width, c, out)
}

/// Borders of `value` around an HWC `UINT8` image.
pub fn pad(
    img: &Array,
    top: usize,
    bottom: usize,
    left: usize,
    right: usize,
    value: u8,
) -> Result<Array> {
    let (h, w, c) = hwc(img)?;
    let (oh, ow) = (h + top + bottom, w + left + right);
    crate::array::count(&[oh, ow, c])?;
    let mut out = vec![value; oh * ow * c];
    let src = &img.data()[..];
    for y in 0..h {
        let at = ((y + top) * ow + left) * c;
        out[at..at + w * c].copy_from_slice(&src[y * w * c..(y + 1) * w * c]);
    }
    image(oh, ow, c, out)
}

/// The `height` x `width` region of an HWC image starting at (`top`, `left`).
pub fn crop(img: &Array, top: usize, left: usize, height: usize, width: usize) -> Result<Array> {
    let (h, w, _) = hwc(img)?;
    if top.saturating_add(height) > h || left.saturating_add(width) > w {
        return Err(Error::invalid_arg(format!(
            "crop: a {width}x{height} region at ({left}, {top}) does not lie inside the {w}x{h} image"
        )));
    }
    img.slice(0, top as i64, (top + height) as i64, 1)?.slice(
        1,
        left as i64,
        (left + width) as i64,
        1,
    )
}

/// Where `letterbox` put the image.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Letterbox {
    /// Scale applied to the image.
    pub scale: f64,
    /// Rows added above.
    pub pad_top: usize,
    /// Columns added on the left.
    pub pad_left: usize,
}

/// Resizes an image to fit `height` x `width` keeping its aspect ratio and
/// pads the rest with `value`, centred (YOLO's letterbox).
pub fn letterbox(
    img: &Array,
    height: usize,
    width: usize,
    value: u8,
    filter: Filter,
) -> Result<(Array, Letterbox)> {
    let (h, w, _) = hwc(img)?;
    if height == 0 || width == 0 || h == 0 || w == 0 {
        return Err(Error::invalid_arg(format!(
            "letterbox: cannot fit a {w}x{h} image into {width}x{height}"
        )));
    }
    let scale = (height as f64 / h as f64).min(width as f64 / w as f64);
    let nh = ((h as f64 * scale).round() as usize).clamp(1, height);
    let nw = ((w as f64 * scale).round() as usize).clamp(1, width);
    let resized = resize(img, nh, nw, filter)?;
    let (top, left) = ((height - nh) / 2, (width - nw) / 2);
    let out = pad(
        &resized,
        top,
        height - nh - top,
        left,
        width - nw - left,
        value,
    )?;
    Ok((
        out,
        Letterbox {
            scale,
            pad_top: top,
            pad_left: left,
        },
    ))
}

/// A model input from an HWC `UINT8` image: `(v * scale - mean[c]) / std[c]`
/// laid out as `layout` with a batch dimension of 1, in FP32, FP16 or UINT8
/// (rounded and saturated).
pub fn normalize(
    img: &Array,
    layout: Layout,
    dtype: DataType,
    scale: f64,
    mean: &[f64],
    std: &[f64],
) -> Result<Array> {
    let (h, w, c) = hwc(img)?;
    let per_channel = |v: &[f64], what: &str, default: f64| -> Result<Vec<f64>> {
        match v.len() {
            0 => Ok(vec![default; c]),
            n if n == c => Ok(v.to_vec()),
            n => Err(Error::invalid_arg(format!(
                "normalize: {what} has {n} values for an image of {c} channels"
            ))),
        }
    };
    let mean = per_channel(mean, "mean", 0.0)?;
    let std = per_channel(std, "std", 1.0)?;
    if std.contains(&0.0) {
        return Err(Error::invalid_arg("normalize: std must not be 0"));
    }
    // One lookup table per channel: 256 possible inputs.
    let lut: Vec<[f32; 256]> = (0..c)
        .map(|ch| {
            let mut t = [0f32; 256];
            for (v, slot) in t.iter_mut().enumerate() {
                *slot = (((v as f64 * scale) as f32 as f64 - mean[ch]) / std[ch]) as f32;
            }
            t
        })
        .collect();
    let src = &img.data()[..];
    let n = h * w;
    let mut values = vec![0f32; n * c];
    match layout {
        Layout::Nchw => {
            for (ch, table) in lut.iter().enumerate() {
                let plane = &mut values[ch * n..(ch + 1) * n];
                for (i, out) in plane.iter_mut().enumerate() {
                    *out = table[src[i * c + ch] as usize];
                }
            }
        }
        Layout::Nhwc => {
            for (i, (out, &v)) in values.iter_mut().zip(src).enumerate() {
                *out = lut[i % c][v as usize];
            }
        }
    }
    let shape = match layout {
        Layout::Nchw => vec![1, c, h, w],
        Layout::Nhwc => vec![1, h, w, c],
    };
    match dtype {
        DataType::Fp32 => Ok(Array::from_f32(shape, &values)),
        DataType::Fp16 => {
            let mut data = Vec::with_capacity(values.len() * 2);
            for v in values {
                data.extend_from_slice(&f16::from_f32(v).to_le_bytes());
            }
            Array::new(DataType::Fp16, shape, data.into())
        }
        DataType::Uint8 => {
            let data: Vec<u8> = values.iter().map(|v| v.round() as u8).collect();
            Array::new(DataType::Uint8, shape, data.into())
        }
        other => Err(Error::invalid_arg(format!(
            "normalize: the result must be FP32, FP16 or UINT8, not {}",
            other.wire_name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rgb(h: usize, w: usize, f: impl Fn(usize, usize) -> [u8; 3]) -> Array {
        let mut d = Vec::new();
        for y in 0..h {
            for x in 0..w {
                d.extend_from_slice(&f(y, x));
            }
        }
        image(h, w, 3, d).unwrap()
    }

    fn encode(img: &Array, format: ImageFormat) -> Vec<u8> {
        let (h, w, _) = hwc(img).unwrap();
        let buf = image::RgbImage::from_raw(w as u32, h as u32, img.data().to_vec()).unwrap();
        let mut out = Cursor::new(Vec::new());
        buf.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    #[test]
    fn decodes_png_bmp_and_lossless_webp_exactly_and_converts_colour() {
        let img = rgb(3, 4, |y, x| [(x * 60) as u8, (y * 100) as u8, 7]);
        for format in [ImageFormat::Png, ImageFormat::Bmp, ImageFormat::WebP] {
            let back = decode(&encode(&img, format), Color::Rgb, 1 << 20).unwrap();
            assert_eq!(back, img, "{format:?}");
        }
        let bgr = decode(&encode(&img, ImageFormat::Png), Color::Bgr, 1 << 20).unwrap();
        assert_eq!(&bgr.data()[..3], &[7, 0, 0]);
        assert_eq!(probe(&encode(&img, ImageFormat::Png)).unwrap(), (4, 3, 3));
        assert!(probe(b"nope").is_err());
        let gray = decode(&encode(&img, ImageFormat::Png), Color::Gray, 1 << 20).unwrap();
        assert_eq!(gray.shape(), &[3, 4, 1]);
        // cv2.cvtColor(np.uint8([[[60, 100, 7]]]), cv2.COLOR_RGB2GRAY) == 77
        assert_eq!(luma(60, 100, 7), 77);
        let rgba = decode(&encode(&img, ImageFormat::Png), Color::Rgba, 1 << 20).unwrap();
        assert_eq!(&rgba.data()[..4], &[0, 0, 7, 255]);
    }

    #[test]
    fn decodes_jpeg_close_to_the_source() {
        let img = rgb(16, 16, |_, _| [200, 100, 50]);
        let back = decode(&encode(&img, ImageFormat::Jpeg), Color::Rgb, 1 << 20).unwrap();
        assert_eq!(back.shape(), &[16, 16, 3]);
        for (a, b) in back.data().iter().zip(img.data().iter()) {
            assert!((*a as i32 - *b as i32).abs() <= 3);
        }
    }

    #[test]
    fn a_decoder_panic_is_a_bad_image_not_a_failed_call() {
        // Found by the `image` fuzz target: zune-jpeg's AVX2 upsampler asserts
        // (`input.len() * 2 <= scratch_space.len()`) on this progressive JPEG.
        let file = include_bytes!("../testdata/jpeg-upsampler-panic.jpg");
        assert!(probe(file).is_ok());
        let r = decode(file, Color::Rgba, 256 << 10);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let e = r.as_ref().expect_err("the AVX2 upsampler panics on it");
            assert_eq!(e.code, tern_core::error::Code::InvalidArg, "{e}");
            assert!(
                e.to_string().contains(
                    "cannot decode the image: the decoder failed on it (assertion failed"
                ),
                "{e}"
            );
        }
        if let Ok(img) = r {
            assert_eq!(img.data().len(), img.shape().iter().product::<usize>());
        }
    }

    #[test]
    fn the_budget_counts_the_decoders_own_buffers() {
        // zune-jpeg's MCU-row buffers grow with the width: 15105 x 1 pixels
        // (45 KB) took 3.3 MB of them.
        let wide = encode(&rgb(1, 15105, |_, _| [9, 9, 9]), ImageFormat::Jpeg);
        let e = decode(&wide, Color::Rgb, 1 << 20).unwrap_err();
        assert_eq!(e.code, tern_core::error::Code::Unavailable, "{}", e.message);
        assert_eq!(
            decode(&wide, Color::Rgb, 8 << 20).unwrap().shape(),
            &[1, 15105, 3]
        );
        // A 61-byte lossy WebP (the fuzzer's) whose VP8 header declares a
        // ~16 MiB partition: image-webp allocates it before reading, so the
        // decode is refused unless the budget holds a partition.
        let lying = [
            0x52, 0x49, 0x46, 0x46, 0x30, 0x00, 0x00, 0x00, 0x57, 0x45, 0x42, 0x50, 0x56, 0x50,
            0x38, 0x20, 0x24, 0x00, 0x00, 0x00, 0x30, 0x01, 0x00, 0x9d, 0x01, 0x2a, 0x01, 0x00,
            0x81, 0x00, 0x01, 0x40, 0x26, 0x25, 0xa0, 0x00, 0x03, 0x70, 0x00, 0xfe, 0xfb, 0x8d,
            0x4b, 0xff, 0xac, 0x66, 0x8f, 0xfe, 0x48, 0xff, 0xd8, 0x1e, 0x66, 0x3f, 0xff, 0xff,
            0xfe, 0xe0, 0x00, 0x00, 0x00,
        ];
        for budget in [16 << 10, 256 << 10, 4 << 20] {
            let e = decode(&lying, Color::Rgb, budget).unwrap_err();
            assert_eq!(e.code, tern_core::error::Code::Unavailable, "{}", e.message);
        }
        // A 59-byte lossy WebP (the fuzzer's) declaring 2903 x 4162 pixels:
        // image-webp decodes into a YUV frame of its own (18 MB here), which
        // took a gray decode 4 MB past a 64 MiB budget before it was counted.
        let yuv = [
            0x52, 0x49, 0x46, 0x46, 0x32, 0x00, 0x00, 0x00, 0x57, 0x45, 0x42, 0x50, 0x56, 0x50,
            0x38, 0x20, 0x2d, 0x00, 0x00, 0x00, 0xb0, 0x01, 0x00, 0x9d, 0x01, 0x2a, 0x57, 0x4b,
            0x42, 0x50, 0x56, 0xed, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00,
            0x00, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x02, 0x00, 0x01, 0x39,
            0x00, 0x7e, 0x00,
        ];
        assert_eq!(probe(&yuv).unwrap(), (2903, 4162, 3));
        let e = decode(&yuv, Color::Gray, 64 << 20).unwrap_err();
        assert_eq!(e.code, tern_core::error::Code::Unavailable, "{}", e.message);
        // A progressive JPEG keeps every coefficient until its last scan
        // (the fuzzer's 42 x 19789 image took 5.3 MB under a 4 MiB budget):
        // counted for every JPEG, whatever its markers say.
        let tall = encode(
            &rgb(2000, 42, |y, x| [(x * 6) as u8, (y % 256) as u8, 7]),
            ImageFormat::Jpeg,
        );
        let e = decode(&tall, Color::Gray, 700 << 10).unwrap_err();
        assert_eq!(e.code, tern_core::error::Code::Unavailable, "{}", e.message);
        assert_eq!(
            decode(&tall, Color::Gray, 2 << 20).unwrap().shape(),
            &[2000, 42, 1]
        );
        // Lossless WebP has no partitions: its pixels and its ARGB frame count.
        let lossless = encode(&rgb(8, 8, |_, _| [1, 2, 3]), ImageFormat::WebP);
        assert_eq!(&lossless[12..16], b"VP8L");
        assert_eq!(
            decode(&lossless, Color::Rgb, 64 << 10).unwrap().shape(),
            &[8, 8, 3]
        );
        // A 121-byte lossless WebP (the fuzzer's) declaring 9216 x 1084
        // pixels: its 40 MB ARGB frame beside the 30 MB of RGB took the
        // decode 2.8 MB past a 64 MiB budget before it was counted.
        let argb = [
            0x52, 0x49, 0x46, 0x46, 0x00, 0x00, 0xf3, 0x00, 0x57, 0x45, 0x42, 0x50, 0x56, 0x50,
            0x38, 0x4c, 0x3b, 0x00, 0x00, 0x00, 0x2f, 0xff, 0xe3, 0x0e, 0x01, 0x17, 0x1f, 0xd9,
            0xff, 0x00, 0x0b, 0x08, 0x00, 0x01, 0xff, 0xef, 0xff, 0x02, 0x3e, 0xbb, 0xef, 0x76,
            0x6d, 0x30, 0xb7, 0x06, 0xe4, 0x21, 0x04, 0x33, 0x5c, 0x5c, 0x4e, 0x00, 0xc9, 0xe1,
            0x34, 0x02, 0x00, 0x00, 0x00, 0x00, 0x24, 0xc2, 0xe9, 0x0e, 0xaa, 0x00, 0x00, 0xcb,
            0x0a, 0x59, 0x87, 0x57, 0x45, 0x42, 0xf2, 0x50, 0x56, 0x50, 0x38, 0xff, 0xe0, 0x00,
            0x10, 0x4c, 0xc2, 0x01, 0x00, 0x00, 0x2f, 0x00, 0x00, 0x06, 0x66, 0x66, 0x66, 0x66,
            0xc6, 0xc2, 0xc7, 0xcd, 0xc3, 0xd1, 0xcc, 0x34, 0x32, 0xff, 0xc2, 0x00, 0x0b, 0x08,
            0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xc0,
        ];
        assert_eq!(probe(&argb).unwrap(), (9216, 1084, 3));
        let e = decode(&argb, Color::Rgb, 64 << 20).unwrap_err();
        assert_eq!(e.code, tern_core::error::Code::Unavailable, "{}", e.message);
        assert!(e.message.contains("9216x1084"), "{}", e.message);
    }

    #[test]
    fn refuses_garbage_truncated_files_and_bombs() {
        assert_eq!(
            decode(b"not an image", Color::Rgb, 1 << 20)
                .unwrap_err()
                .code,
            tern_core::error::Code::InvalidArg
        );
        let png = encode(&rgb(8, 8, |_, _| [1, 2, 3]), ImageFormat::Png);
        assert!(decode(&png[..png.len() / 2], Color::Rgb, 1 << 20).is_err());
        // A BMP header claiming 30000 x 30000 pixels: refused from the header.
        let mut bomb = encode(&rgb(8, 8, |_, _| [1, 2, 3]), ImageFormat::Bmp);
        bomb[18..22].copy_from_slice(&30_000i32.to_le_bytes());
        bomb[22..26].copy_from_slice(&30_000i32.to_le_bytes());
        let e = decode(&bomb, Color::Rgb, 64 << 20).unwrap_err();
        assert_eq!(e.code, tern_core::error::Code::Unavailable, "{}", e.message);
        assert!(e.message.contains("30000x30000"), "{}", e.message);
        // The budget counts the decoded pixels.
        assert!(decode(&png, Color::Rgb, 100).is_err());
        let gif = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;";
        assert!(decode(gif, Color::Rgb, 1 << 20).is_err());
    }

    #[test]
    fn resize_pad_crop_letterbox() {
        let img = rgb(4, 8, |_, x| [(x * 30) as u8, 0, 0]);
        let half = resize(&img, 2, 4, Filter::Bilinear).unwrap();
        assert_eq!(half.shape(), &[2, 4, 3]);
        // Bilinear at half-pixel centres: destination x=0 reads source 0.5 -> (0 + 30) / 2.
        assert_eq!(half.data()[0], 15);
        let area = resize(&img, 2, 4, Filter::Area).unwrap();
        assert_eq!(area.data()[0], 15);
        let near = resize(&img, 8, 16, Filter::Nearest).unwrap();
        assert_eq!(near.shape(), &[8, 16, 3]);
        assert!(resize(&img, 0, 4, Filter::Bilinear).is_err());

        let padded = pad(&img, 1, 0, 0, 2, 9).unwrap();
        assert_eq!(padded.shape(), &[5, 10, 3]);
        assert_eq!(&padded.data()[..3], &[9, 9, 9]);
        assert_eq!(padded.data()[10 * 3], 0);

        let c = crop(&img, 1, 2, 2, 3).unwrap();
        assert_eq!(c.shape(), &[2, 3, 3]);
        assert_eq!(c.data()[0], 60);
        assert!(crop(&img, 3, 0, 2, 1).is_err());

        let (lb, info) = letterbox(&img, 8, 8, 114, Filter::Bilinear).unwrap();
        assert_eq!(lb.shape(), &[8, 8, 3]);
        assert_eq!(
            info,
            Letterbox {
                scale: 1.0,
                pad_top: 2,
                pad_left: 0
            }
        );
        assert_eq!(lb.data()[0], 114);
    }

    #[test]
    fn normalize_lays_out_channels() {
        let img = rgb(1, 2, |_, x| [x as u8 * 255, 0, 255]);
        let t = normalize(&img, Layout::Nchw, DataType::Fp32, 1.0 / 255.0, &[], &[]).unwrap();
        assert_eq!(t.shape(), &[1, 3, 1, 2]);
        assert_eq!(t.to_f32(), vec![0.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
        let t = normalize(
            &img,
            Layout::Nhwc,
            DataType::Fp32,
            1.0,
            &[0.0, 0.0, 255.0],
            &[1.0, 1.0, 2.0],
        )
        .unwrap();
        assert_eq!(t.shape(), &[1, 1, 2, 3]);
        assert_eq!(t.to_f32(), vec![0.0, 0.0, 0.0, 255.0, 0.0, 0.0]);
        let h = normalize(&img, Layout::Nchw, DataType::Fp16, 1.0 / 255.0, &[], &[]).unwrap();
        assert_eq!(h.dtype(), DataType::Fp16);
        assert!(normalize(&img, Layout::Nchw, DataType::Int32, 1.0, &[], &[]).is_err());
        assert!(normalize(&img, Layout::Nchw, DataType::Fp32, 1.0, &[1.0], &[]).is_err());
        assert!(normalize(
            &img,
            Layout::Nchw,
            DataType::Fp32,
            1.0,
            &[],
            &[0.0, 1.0, 1.0]
        )
        .is_err());
    }
}
