//! [`Array`]: an n-dimensional array of one Triton data type, and the
//! operations that only move elements (reshape, transpose, slice, split,
//! concat) or convert them (cast, to and from `f64`/`f32`).

use bytes::Bytes;
use half::{bf16, f16};
use tern_core::error::{Error, Result};
use tern_core::DataType;

/// An n-dimensional array: row-major, little-endian elements of `dtype`
/// (any type but `BYTES`). Clones and reshapes share the bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    dtype: DataType,
    shape: Vec<usize>,
    data: Bytes,
}

/// Size in bytes of one element of `dtype` (`BYTES` is refused).
pub fn element_size(dtype: DataType) -> Result<usize> {
    dtype.size().ok_or_else(|| {
        Error::invalid_arg("arrays of BYTES are not supported: decode the strings first")
    })
}

/// Number of elements of `shape`, refusing overflow.
pub fn count(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::invalid_arg(format!("shape {shape:?} has too many elements")))
}

/// `shape` as unsigned dimensions (negative ones refused).
pub fn dims(shape: &[i64]) -> Result<Vec<usize>> {
    shape
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                Error::invalid_arg(format!("shape {shape:?} has a negative dimension"))
            })
        })
        .collect()
}

/// Checks `axis` against a rank.
pub fn check_axis(axis: usize, rank: usize) -> Result<()> {
    if axis >= rank {
        return Err(Error::invalid_arg(format!(
            "axis {axis} is out of range for an array of rank {rank}"
        )));
    }
    Ok(())
}

/// The array's shape split around `axis`: (elements before, length, elements after).
pub fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

macro_rules! decode_as {
    ($data:expr, $t:ty, $conv:expr) => {
        $data
            .chunks_exact(std::mem::size_of::<$t>())
            .map(|c| $conv(<$t>::from_le_bytes(c.try_into().unwrap())))
            .collect()
    };
}

macro_rules! encode_as {
    ($values:expr, $t:ty, $conv:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        let mut out = vec![0u8; $values.len() * N];
        for (c, &v) in out.chunks_exact_mut(N).zip($values) {
            let x: $t = $conv(v);
            c.copy_from_slice(&x.to_le_bytes());
        }
        out
    }};
}

impl Array {
    /// An array of `data` (its length must match `shape` and `dtype`).
    pub fn new(dtype: DataType, shape: Vec<usize>, data: Bytes) -> Result<Array> {
        let want = count(&shape)?
            .checked_mul(element_size(dtype)?)
            .ok_or_else(|| Error::invalid_arg("array too large"))?;
        if data.len() != want {
            return Err(Error::invalid_arg(format!(
                "{} array of shape {shape:?} needs {want} bytes of data, got {}",
                dtype.wire_name(),
                data.len()
            )));
        }
        Ok(Array { dtype, shape, data })
    }

    /// An array from a wire shape (`i64` dimensions).
    pub fn from_wire(dtype: DataType, shape: &[i64], data: Bytes) -> Result<Array> {
        Array::new(dtype, dims(shape)?, data)
    }

    /// An FP32 array.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Array {
        let data = encode_as!(values, f32, |v| v);
        Array {
            dtype: DataType::Fp32,
            shape,
            data: data.into(),
        }
    }

    /// An array of `dtype` from `f64` values (C-style conversion: floats to
    /// integers truncate toward zero and saturate, NaN becomes 0).
    pub fn from_f64(dtype: DataType, shape: Vec<usize>, values: &[f64]) -> Result<Array> {
        let data: Vec<u8> = match dtype {
            DataType::Bool => values.iter().map(|&v| (v != 0.0) as u8).collect(),
            DataType::Uint8 => values.iter().map(|&v| v as u8).collect(),
            DataType::Int8 => values.iter().map(|&v| (v as i8) as u8).collect(),
            DataType::Uint16 => encode_as!(values, u16, |v| v as u16),
            DataType::Uint32 => encode_as!(values, u32, |v| v as u32),
            DataType::Uint64 => encode_as!(values, u64, |v| v as u64),
            DataType::Int16 => encode_as!(values, i16, |v| v as i16),
            DataType::Int32 => encode_as!(values, i32, |v| v as i32),
            DataType::Int64 => encode_as!(values, i64, |v| v as i64),
            DataType::Fp16 => encode_as!(values, f16, f16::from_f64),
            DataType::Bf16 => encode_as!(values, bf16, bf16::from_f64),
            DataType::Fp32 => encode_as!(values, f32, |v| v as f32),
            DataType::Fp64 => encode_as!(values, f64, |v| v),
            DataType::Bytes => return Err(element_size(dtype).unwrap_err()),
        };
        Array::new(dtype, shape, data.into())
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Shape as the wire has it.
    pub fn wire_shape(&self) -> Vec<i64> {
        self.shape.iter().map(|&d| d as i64).collect()
    }

    /// The elements' bytes.
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size of the data in bytes.
    pub fn byte_len(&self) -> usize {
        self.data.len()
    }

    /// Whether the element type is floating point.
    pub fn is_float(&self) -> bool {
        is_float(self.dtype)
    }

    /// Every element as `f64`.
    pub fn to_f64(&self) -> Vec<f64> {
        let d = &self.data[..];
        match self.dtype {
            DataType::Bool | DataType::Uint8 => d.iter().map(|&v| v as f64).collect(),
            DataType::Int8 => d.iter().map(|&v| v as i8 as f64).collect(),
            DataType::Uint16 => decode_as!(d, u16, |v| v as f64),
            DataType::Uint32 => decode_as!(d, u32, |v| v as f64),
            DataType::Uint64 => decode_as!(d, u64, |v| v as f64),
            DataType::Int16 => decode_as!(d, i16, |v| v as f64),
            DataType::Int32 => decode_as!(d, i32, |v| v as f64),
            DataType::Int64 => decode_as!(d, i64, |v| v as f64),
            DataType::Fp16 => decode_as!(d, f16, |v: f16| v.to_f64()),
            DataType::Bf16 => decode_as!(d, bf16, |v: bf16| v.to_f64()),
            DataType::Fp32 => decode_as!(d, f32, |v| v as f64),
            DataType::Fp64 => decode_as!(d, f64, |v| v),
            DataType::Bytes => Vec::new(),
        }
    }

    /// Every element as `f32` (FP32 arrays without a conversion pass).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            DataType::Fp32 => decode_as!(&self.data[..], f32, |v| v),
            DataType::Uint8 => self.data.iter().map(|&v| v as f32).collect(),
            _ => self.to_f64().into_iter().map(|v| v as f32).collect(),
        }
    }

    /// The same elements with another shape; one dimension may be -1.
    pub fn reshape(&self, shape: &[i64]) -> Result<Array> {
        let wild = shape.iter().filter(|&&d| d == -1).count();
        if wild > 1 || shape.iter().any(|&d| d < -1) {
            return Err(Error::invalid_arg(format!(
                "cannot reshape to {shape:?}: dimensions must be >= 0, with at most one -1"
            )));
        }
        let known: usize = count(&dims(&shape.iter().map(|&d| d.max(1)).collect::<Vec<_>>())?)?;
        let n = self.len();
        let out: Vec<usize> = shape
            .iter()
            .map(|&d| {
                if d == -1 {
                    n.checked_div(known).unwrap_or(0)
                } else {
                    d as usize
                }
            })
            .collect();
        if count(&out)? != n {
            return Err(Error::invalid_arg(format!(
                "cannot reshape an array of shape {:?} ({n} elements) to {shape:?}",
                self.shape
            )));
        }
        Ok(Array {
            dtype: self.dtype,
            shape: out,
            data: self.data.clone(),
        })
    }

    /// Axes permuted: axis `i` of the result is axis `perm[i]` of `self`.
    pub fn transpose(&self, perm: &[usize]) -> Result<Array> {
        let rank = self.shape.len();
        let mut seen = vec![false; rank];
        if perm.len() != rank
            || perm
                .iter()
                .any(|&p| p >= rank || std::mem::replace(&mut seen[p], true))
        {
            return Err(Error::invalid_arg(format!(
                "transpose: {perm:?} is not a permutation of the {rank} axes of shape {:?}",
                self.shape
            )));
        }
        let size = element_size(self.dtype)?;
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        let src_strides = strides(&self.shape);
        let strides: Vec<usize> = perm.iter().map(|&p| src_strides[p]).collect();
        let out = match size {
            1 => gather::<1>(&self.data, &shape, &strides),
            2 => gather::<2>(&self.data, &shape, &strides),
            4 => gather::<4>(&self.data, &shape, &strides),
            8 => gather::<8>(&self.data, &shape, &strides),
            other => {
                return Err(Error::internal(format!(
                    "transpose: no element of {other} bytes"
                )))
            }
        };
        Array::new(self.dtype, shape, out.into())
    }

    /// Elements `start..end` with `step` along `axis`; negative `start` and
    /// `end` count from the end and both are clamped, as in Python.
    pub fn slice(&self, axis: usize, start: i64, end: i64, step: i64) -> Result<Array> {
        check_axis(axis, self.shape.len())?;
        if step <= 0 {
            return Err(Error::invalid_arg(format!(
                "slice: step must be positive, got {step}"
            )));
        }
        let len = self.shape[axis] as i64;
        let clamp = |i: i64| if i < 0 { (i + len).max(0) } else { i.min(len) };
        let (start, end) = (clamp(start), clamp(end));
        let picked: Vec<usize> = (start..end.max(start))
            .step_by(step as usize)
            .map(|i| i as usize)
            .collect();
        let size = element_size(self.dtype)?;
        let (outer, n, inner) = around(&self.shape, axis);
        let row = inner * size;
        let mut out = Vec::with_capacity(outer * picked.len() * row);
        for o in 0..outer {
            for &j in &picked {
                let at = (o * n + j) * row;
                out.extend_from_slice(&self.data[at..at + row]);
            }
        }
        let mut shape = self.shape.clone();
        shape[axis] = picked.len();
        Array::new(self.dtype, shape, out.into())
    }

    /// The elements converted to `dtype`.
    pub fn cast(&self, dtype: DataType) -> Result<Array> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        element_size(dtype)?;
        if dtype == DataType::Fp32 {
            return Ok(Array::from_f32(self.shape.clone(), &self.to_f32()));
        }
        Array::from_f64(dtype, self.shape.clone(), &self.to_f64())
    }

    /// Pieces of `sizes` along `axis`.
    pub fn split(&self, axis: usize, sizes: &[usize]) -> Result<Vec<Array>> {
        check_axis(axis, self.shape.len())?;
        let total: usize = sizes.iter().sum();
        if total != self.shape[axis] {
            return Err(Error::invalid_arg(format!(
                "split: sizes {sizes:?} add up to {total}, axis {axis} has length {}",
                self.shape[axis]
            )));
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                let piece = self.slice(axis, start as i64, (start + s) as i64, 1);
                start += s;
                piece
            })
            .collect()
    }

    /// Arrays of one type and matching shapes joined along `axis`.
    pub fn concat(arrays: &[&Array], axis: usize) -> Result<Array> {
        let first = arrays
            .first()
            .ok_or_else(|| Error::invalid_arg("concat: no arrays given"))?;
        check_axis(axis, first.shape.len())?;
        for a in arrays {
            let same_rest = a.shape.len() == first.shape.len()
                && a.shape
                    .iter()
                    .zip(&first.shape)
                    .enumerate()
                    .all(|(i, (x, y))| i == axis || x == y);
            if a.dtype != first.dtype || !same_rest {
                return Err(Error::invalid_arg(format!(
                    "concat along axis {axis}: {} {:?} does not match {} {:?}",
                    a.dtype.wire_name(),
                    a.shape,
                    first.dtype.wire_name(),
                    first.shape
                )));
            }
        }
        let size = element_size(first.dtype)?;
        let (outer, _, inner) = around(&first.shape, axis);
        let mut out = Vec::with_capacity(arrays.iter().map(|a| a.byte_len()).sum());
        for o in 0..outer {
            for a in arrays {
                let row = a.shape[axis] * inner * size;
                out.extend_from_slice(&a.data[o * row..(o + 1) * row]);
            }
        }
        let mut shape = first.shape.clone();
        shape[axis] = arrays.iter().map(|a| a.shape[axis]).sum();
        Array::new(first.dtype, shape, out.into())
    }
}

/// Whether `dtype` is floating point.
pub fn is_float(dtype: DataType) -> bool {
    matches!(
        dtype,
        DataType::Fp16 | DataType::Bf16 | DataType::Fp32 | DataType::Fp64
    )
}

/// Row-major strides (in elements) of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Calls `f` with the source offset of every element of `shape` in
/// row-major order, given the source strides of each axis.
pub fn for_each_index(shape: &[usize], strides: &[usize], mut f: impl FnMut(usize)) {
    for_each_pair(shape, strides, strides, |offset, _| f(offset));
}

/// Walks `shape` for two arrays read together ([`for_each_index`] is the
/// one-array case): calls `f` with
/// the offsets into each (`a_strides`, `b_strides`, 0 on broadcast axes) of
/// every index of `shape`, in C order.
pub fn for_each_pair(
    shape: &[usize],
    a_strides: &[usize],
    b_strides: &[usize],
    mut f: impl FnMut(usize, usize),
) {
    if shape.contains(&0) {
        return;
    }
    let rank = shape.len();
    if rank == 0 {
        f(0, 0);
        return;
    }
    let mut idx = vec![0usize; rank];
    let (mut a, mut b) = (0usize, 0usize);
    let (last, sa, sb) = (shape[rank - 1], a_strides[rank - 1], b_strides[rank - 1]);
    loop {
        // The innermost axis as a plain loop.
        for i in 0..last {
            f(a + i * sa, b + i * sb);
        }
        let mut axis = rank - 1;
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            idx[axis] += 1;
            a += a_strides[axis];
            b += b_strides[axis];
            if idx[axis] < shape[axis] {
                break;
            }
            a -= a_strides[axis] * shape[axis];
            b -= b_strides[axis] * shape[axis];
            idx[axis] = 0;
        }
    }
}

/// The `N`-byte elements of `data` at the offsets [`for_each_index`] gives
/// for `shape` read with `strides`, in that order.
fn gather<const N: usize>(data: &[u8], shape: &[usize], strides: &[usize]) -> Vec<u8> {
    let (items, _) = data.as_chunks::<N>();
    let mut out: Vec<[u8; N]> = Vec::with_capacity(items.len());
    for_each_index(shape, strides, |offset| out.push(items[offset]));
    out.into_flattened()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(a: &Array) -> Vec<f32> {
        a.to_f32()
    }

    fn iota(shape: Vec<usize>) -> Array {
        let n: usize = shape.iter().product();
        Array::from_f32(shape, &(0..n).map(|v| v as f32).collect::<Vec<_>>())
    }

    #[test]
    fn new_checks_the_data_size_and_refuses_bytes() {
        assert!(Array::new(DataType::Fp32, vec![2, 2], vec![0u8; 15].into()).is_err());
        assert!(Array::new(DataType::Bytes, vec![1], vec![0u8; 4].into()).is_err());
        assert!(Array::from_wire(DataType::Uint8, &[-1], Bytes::new()).is_err());
        assert_eq!(
            Array::new(DataType::Uint8, vec![0, 3], Bytes::new())
                .unwrap()
                .len(),
            0
        );
    }

    #[test]
    fn reshape_infers_one_dimension_and_shares_the_bytes() {
        let a = iota(vec![2, 3, 4]);
        let b = a.reshape(&[4, -1]).unwrap();
        assert_eq!(b.shape(), &[4, 6]);
        assert_eq!(b.data().as_ptr(), a.data().as_ptr());
        assert!(a.reshape(&[5, -1]).is_err());
        assert!(a.reshape(&[-1, -1]).is_err());
        assert!(a.reshape(&[-2, 12]).is_err());
    }

    #[test]
    fn transpose_matches_numpy() {
        let a = iota(vec![2, 3]);
        let t = a.transpose(&[1, 0]).unwrap();
        assert_eq!(t.shape(), &[3, 2]);
        assert_eq!(f32s(&t), vec![0., 3., 1., 4., 2., 5.]);
        // np.arange(24).reshape(2,3,4).transpose(2,0,1)[1] == [[1,5,9],[13,17,21]]
        let b = iota(vec![2, 3, 4]).transpose(&[2, 0, 1]).unwrap();
        assert_eq!(b.shape(), &[4, 2, 3]);
        assert_eq!(&f32s(&b)[6..12], &[1., 5., 9., 13., 17., 21.]);
        assert!(a.transpose(&[0, 0]).is_err());
        assert!(a.transpose(&[0]).is_err());
        // Every element size moves whole elements (the values survive a
        // round trip through each type).
        for dtype in [
            DataType::Uint8,
            DataType::Int16,
            DataType::Fp32,
            DataType::Fp64,
        ] {
            let c = iota(vec![2, 3, 4])
                .cast(dtype)
                .unwrap()
                .transpose(&[2, 0, 1])
                .unwrap();
            assert_eq!((c.dtype(), c.shape()), (dtype, &[4, 2, 3][..]));
            assert_eq!(&f32s(&c)[6..12], &[1., 5., 9., 13., 17., 21.], "{dtype:?}");
        }
    }

    #[test]
    fn slice_follows_python_indexing() {
        let a = iota(vec![2, 5]);
        let s = a.slice(1, -3, 100, 1).unwrap();
        assert_eq!(s.shape(), &[2, 3]);
        assert_eq!(f32s(&s), vec![2., 3., 4., 7., 8., 9.]);
        let s = a.slice(1, 0, 5, 2).unwrap();
        assert_eq!(f32s(&s), vec![0., 2., 4., 5., 7., 9.]);
        assert_eq!(a.slice(1, 4, 2, 1).unwrap().shape(), &[2, 0]);
        assert!(a.slice(2, 0, 1, 1).is_err());
        assert!(a.slice(0, 0, 1, 0).is_err());
    }

    #[test]
    fn cast_truncates_and_saturates_like_c() {
        let a = Array::from_f32(vec![4], &[-1.7, 2.9, 300.0, f32::NAN]);
        let u = a.cast(DataType::Uint8).unwrap();
        assert_eq!(&u.data()[..], &[0, 2, 255, 0]);
        let i = a.cast(DataType::Int32).unwrap();
        assert_eq!(i.to_f64(), vec![-1.0, 2.0, 300.0, 0.0]);
        let h = a.cast(DataType::Fp16).unwrap();
        assert_eq!(h.byte_len(), 8);
        assert_eq!(h.to_f64()[2], 300.0);
        assert!(a.cast(DataType::Bytes).is_err());
    }

    #[test]
    fn split_and_concat_are_inverse() {
        let a = iota(vec![2, 5, 3]);
        let parts = a.split(1, &[2, 3]).unwrap();
        assert_eq!(parts[0].shape(), &[2, 2, 3]);
        assert_eq!(parts[1].shape(), &[2, 3, 3]);
        let back = Array::concat(&[&parts[0], &parts[1]], 1).unwrap();
        assert_eq!(back, a);
        assert!(a.split(1, &[2, 2]).is_err());
        let other = Array::new(DataType::Uint8, vec![2, 5, 3], vec![0u8; 30].into()).unwrap();
        assert!(Array::concat(&[&a, &other], 1).is_err());
        assert!(Array::concat(&[], 0).is_err());
    }
}
