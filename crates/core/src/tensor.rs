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

/// Splits a batched output back into one tensor per request (`rows` = each
/// request's batch size); fixed-size types as views of the same buffer.
pub fn scatter(t: Tensor, rows: &[usize]) -> Result<Vec<Tensor>> {
    if rows.len() == 1 {
        return Ok(vec![t]);
    }
    let total: usize = rows.iter().sum();
    if t.shape.first().map(|&d| d as usize) != Some(total) {
        return Err(Error::internal(format!(
            "output '{}' has shape {:?}, whose first dimension is not the batch size {total}",
            t.name, t.shape
        )));
    }
    let mut out = Vec::with_capacity(rows.len());
    let part_shape = |r: usize| {
        let mut shape = t.shape.clone();
        shape[0] = r as i64;
        shape
    };
    match t.dtype.size() {
        Some(_) => {
            let row_bytes = t.data.len().checked_div(total).unwrap_or(0);
            let mut at = 0;
            for &r in rows {
                let data = t.data.slice(at..at + r * row_bytes);
                out.push(Tensor::new(t.name.clone(), t.dtype, part_shape(r), data));
                at += r * row_bytes;
            }
        }
        None => {
            let elements = bytes_tensor::decode(&t.data)?;
            let per_row = elements.len().checked_div(total).unwrap_or(0);
            let mut at = 0;
            for &r in rows {
                let data = bytes_tensor::encode(&elements[at..at + r * per_row]);
                out.push(Tensor::new(t.name.clone(), t.dtype, part_shape(r), data));
                at += r * per_row;
            }
        }
    }
    Ok(out)
}

/// Shape of an output whose backend shape was `reshape`: the config dims,
/// with a variable dim resolved from the element count.
pub fn unreshape(dims: &[i64], batch: Option<i64>, elements: usize) -> Vec<i64> {
    let mut shape: Vec<i64> = batch.into_iter().chain(dims.iter().copied()).collect();
    let fixed: i64 = shape.iter().filter(|&&d| d >= 0).product::<i64>().max(1);
    if let Some(pos) = shape.iter().position(|&d| d < 0) {
        shape[pos] = elements as i64 / fixed;
        for d in shape.iter_mut().skip(pos + 1) {
            if *d < 0 {
                *d = 1;
            }
        }
    }
    shape
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
    fn unreshape_resolves_variable_dims() {
        assert_eq!(unreshape(&[1], Some(3), 3), vec![3, 1]);
        assert_eq!(unreshape(&[-1, 4], None, 12), vec![3, 4]);
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
