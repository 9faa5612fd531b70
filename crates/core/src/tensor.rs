//! A tensor: name, data type, shape and a byte buffer in native (little-endian)
//! layout; BYTES tensors use the length-prefixed encoding.

use bytes::Bytes;

use super::{bytes_tensor, DataType};
use crate::error::{Error, Result};

/// A named tensor with its data.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Tensor name as the model declares it.
    pub name: String,
    /// Element type.
    pub dtype: DataType,
    /// Full shape, including the batch dimension when the model batches.
    pub shape: Vec<i64>,
    /// Raw little-endian element data (BYTES: length-prefixed elements).
    pub data: Bytes,
}

impl Tensor {
    /// Creates a tensor.
    pub fn new(
        name: impl Into<String>,
        dtype: DataType,
        shape: Vec<i64>,
        data: impl Into<Bytes>,
    ) -> Self {
        Tensor {
            name: name.into(),
            dtype,
            shape,
            data: data.into(),
        }
    }

    /// Number of elements the shape describes (negative dims count as zero).
    pub fn element_count(&self) -> usize {
        element_count(&self.shape)
    }

    /// Checks that the data length matches the shape and data type.
    pub fn check_data_size(&self) -> Result<()> {
        self.check_size_as("input")
    }

    /// [`Tensor::check_data_size`], naming the tensor as `role` ("input", "output") in errors.
    pub fn check_size_as(&self, role: &str) -> Result<()> {
        let expected = self.element_count();
        match self.dtype.size() {
            Some(size) => {
                let bytes = expected.saturating_mul(size);
                if self.data.len() != bytes {
                    return Err(Error::invalid_arg(format!(
                        "unexpected total byte size {} for {role} '{}', expecting {}",
                        self.data.len(),
                        self.name,
                        bytes
                    )));
                }
            }
            None => {
                let n = bytes_tensor::count(&self.data)
                    .map_err(|e| e.context(format!("{role} '{}'", self.name)))?;
                if n != expected {
                    return Err(Error::invalid_arg(format!(
                        "expected {} string elements for {role} '{}', got {}",
                        expected, self.name, n
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Number of elements of a shape; negative dims count as zero. Saturates at
/// `usize::MAX` instead of wrapping, so an absurd shape never matches real
/// data (wire shapes are refused earlier by `validate::input_header`).
pub fn element_count(shape: &[i64]) -> usize {
    shape
        .iter()
        .fold(1usize, |n, &d| n.saturating_mul(d.max(0) as usize))
}

/// Formats a shape as Triton does in messages: `[2,16]`.
pub fn shape_str(shape: &[i64]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_size_checks() {
        let t = Tensor::new("x", DataType::Int32, vec![2, 2], vec![0u8; 16]);
        assert!(t.check_data_size().is_ok());
        let t = Tensor::new("x", DataType::Int32, vec![2, 2], vec![0u8; 15]);
        assert!(t
            .check_data_size()
            .unwrap_err()
            .message
            .contains("expecting 16"));
        let t = Tensor::new("s", DataType::Bytes, vec![2], bytes_tensor::encode(["a"]));
        assert!(t
            .check_data_size()
            .unwrap_err()
            .message
            .contains("expected 2 string"));
        assert_eq!(shape_str(&[-1, 16]), "[-1,16]");
        assert_eq!(element_count(&[]), 1);
    }

    #[test]
    fn absurd_shapes_saturate_instead_of_wrapping() {
        // 8 * 2^61 elements would wrap to 0 and match empty data.
        assert_eq!(element_count(&[8, 1 << 61]), usize::MAX);
        let t = Tensor::new("x", DataType::Fp32, vec![8, 1 << 61], Vec::new());
        assert!(t.check_data_size().is_err());
        // 2^62 FP32 elements: the byte size would wrap to 0.
        let t = Tensor::new("x", DataType::Fp32, vec![1 << 62], Vec::new());
        assert!(t.check_data_size().is_err());
        assert_eq!(element_count(&[1 << 40, 1 << 40, 0]), 0);
    }
}
