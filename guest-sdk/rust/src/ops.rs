//! Native pre/post-processing kernels (`tern:plugin/ops`, since 0.1.2):
//! image decoding, resizing and normalisation, tensor maths and detection
//! post-processing, run by the host at native speed on [`Array`]s it holds.
//!
//! ```ignore
//! use tern_plugin::ops::{self, Array, Color, Filter, Layout};
//!
//! let img = ops::decode_image(&jpeg_bytes, Color::Rgb)?;           // HWC u8
//! let (boxed, info) = ops::letterbox(&img, 640, 640, 114, Filter::Bilinear)?;
//! let x = ops::normalize(&boxed, Layout::Nchw, DataType::Fp32, 1.0 / 255.0, &[], &[])?;
//! ops::set_output(0, "images", &x)?;   // the pixels never enter the plugin
//! ```
//!
//! Every array counts against the plugin's memory cap; failures are
//! [`Error`]s with Triton's codes.

pub use crate::bindings::tern::plugin::ops::{
    convert_color, crop, decode_image, iou, letterbox, nms, normalize, pad, probe_image, resize,
    set_output, yolo_decode, Array, BinaryOp, Color, Detection, Filter, ImageInfo, Layout,
    LetterboxInfo, ReduceOp, UnaryOp, YoloLayout,
};
use crate::{DataType, Element, Error};

impl Array {
    /// An array of `values` with `shape`.
    pub fn of<T: Element>(shape: &[i64], values: &[T]) -> Result<Array, Error> {
        let mut data = Vec::with_capacity(values.len() * T::SIZE);
        T::write_all(values, &mut data);
        Array::from_data(T::DTYPE, shape, &data)
    }

    /// The elements as `T` (the array must be of `T`'s type; cast first).
    pub fn values<T: Element>(&self) -> Result<Vec<T>, Error> {
        if self.datatype() != T::DTYPE {
            return Err(Error {
                code: crate::ErrorCode::InvalidArg,
                message: format!(
                    "array is {:?}, not {:?}: cast it first",
                    self.datatype(),
                    T::DTYPE
                ),
            });
        }
        Ok(T::read_all(&self.data()))
    }

    /// The array as an FP32 vector (cast on the host if needed).
    pub fn to_f32(&self) -> Result<Vec<f32>, Error> {
        match self.datatype() {
            DataType::Fp32 => self.values(),
            _ => self.cast(DataType::Fp32)?.values(),
        }
    }
}
