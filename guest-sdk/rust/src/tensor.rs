//! Tensor helpers: typed views and constructors, BYTES strings, and the
//! batch helpers that gather an input across a request list and split an
//! output back per request.

use crate::{DataType, Error, Request, Response, Tensor};

/// A fixed-size element type with its Triton data type.
pub trait Element: Copy + Default + 'static {
    /// The matching Triton type.
    const DTYPE: DataType;
    /// Size in bytes.
    const SIZE: usize = std::mem::size_of::<Self>();
    /// Reads one element from little-endian bytes.
    fn read(b: &[u8]) -> Self;
    /// Appends one element as little-endian bytes.
    fn write(self, out: &mut Vec<u8>);
    /// Appends many elements as little-endian bytes (one copy for numbers).
    fn write_all(data: &[Self], out: &mut Vec<u8>) {
        for &v in data {
            v.write(out);
        }
    }
    /// Reads little-endian bytes (a whole number of elements) into a vector.
    fn read_all(bytes: &[u8]) -> Vec<Self> {
        bytes.chunks_exact(Self::SIZE).map(Self::read).collect()
    }
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
            fn read(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element size"))
            }
            fn write(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn write_all(data: &[Self], out: &mut Vec<u8>) {
                if cfg!(target_endian = "little") {
                    // SAFETY: a number type has no padding, and on a little-endian
                    // target its memory is its little-endian encoding.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(
                            data.as_ptr().cast::<u8>(),
                            std::mem::size_of_val(data),
                        )
                    };
                    out.extend_from_slice(bytes);
                } else {
                    for &v in data {
                        v.write(out);
                    }
                }
            }
            fn read_all(bytes: &[u8]) -> Vec<Self> {
                let n = bytes.len() / Self::SIZE;
                if !cfg!(target_endian = "little") {
                    return bytes.chunks_exact(Self::SIZE).map(Self::read).collect();
                }
                let mut out = Vec::<$t>::with_capacity(n);
                // SAFETY: the vector has room for `n` elements, every bit pattern is a
                // valid number, and the source may be unaligned (byte copy).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        out.as_mut_ptr().cast::<u8>(),
                        n * Self::SIZE,
                    );
                    out.set_len(n);
                }
                out
            }
        }
    };
}
element!(u8, Uint8);
element!(u16, Uint16);
element!(u32, Uint32);
element!(u64, Uint64);
element!(i8, Int8);
element!(i16, Int16);
element!(i32, Int32);
element!(i64, Int64);
element!(f32, Fp32);
element!(f64, Fp64);

impl Element for bool {
    const DTYPE: DataType = DataType::Bool;
    fn read(b: &[u8]) -> Self {
        b[0] != 0
    }
    fn write(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
}

fn element_count(shape: &[i64]) -> usize {
    shape.iter().map(|&d| d.max(0) as usize).product()
}

impl Tensor {
    /// A tensor from typed values; `shape` must describe `data.len()` elements.
    pub fn from_vec<T: Element>(name: impl Into<String>, shape: Vec<i64>, data: Vec<T>) -> Tensor {
        let mut bytes = Vec::with_capacity(data.len() * T::SIZE);
        T::write_all(&data, &mut bytes);
        Tensor {
            name: name.into(),
            datatype: T::DTYPE,
            shape,
            data: bytes,
        }
    }

    /// A BYTES tensor from strings (or byte strings).
    pub fn from_strings<S: AsRef<[u8]>>(
        name: impl Into<String>,
        shape: Vec<i64>,
        items: &[S],
    ) -> Tensor {
        let mut data = Vec::new();
        for s in items {
            let s = s.as_ref();
            data.extend_from_slice(&(s.len() as u32).to_le_bytes());
            data.extend_from_slice(s);
        }
        Tensor {
            name: name.into(),
            datatype: DataType::Bytes,
            shape,
            data,
        }
    }

    /// Number of elements.
    pub fn element_count(&self) -> usize {
        element_count(&self.shape)
    }

    /// The values, copied out; errors when the data type differs.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, Error> {
        self.expect_dtype(T::DTYPE)?;
        Ok(T::read_all(&self.data))
    }

    /// The values without copying (little-endian hosts, which wasm is);
    /// errors when the data type differs or the buffer is not aligned.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], Error> {
        self.expect_dtype(T::DTYPE)?;
        if T::DTYPE == DataType::Bool {
            return Err(Error::invalid_arg(
                "BOOL tensors have no slice view; use to_vec::<bool>()",
            ));
        }
        let (head, body, tail) = unsafe { self.data.align_to::<T>() };
        if !head.is_empty() || !tail.is_empty() {
            return Err(Error::internal(format!(
                "tensor '{}' data is not aligned for {:?}; use to_vec()",
                self.name,
                T::DTYPE
            )));
        }
        Ok(body)
    }

    /// The elements of a BYTES tensor.
    pub fn strings(&self) -> Result<Vec<&[u8]>, Error> {
        self.expect_dtype(DataType::Bytes)?;
        let mut out = Vec::new();
        let mut rest = &self.data[..];
        while !rest.is_empty() {
            if rest.len() < 4 {
                return Err(Error::invalid_arg(format!(
                    "tensor '{}': truncated BYTES element",
                    self.name
                )));
            }
            let n = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
            if rest.len() < 4 + n {
                return Err(Error::invalid_arg(format!(
                    "tensor '{}': truncated BYTES element",
                    self.name
                )));
            }
            out.push(&rest[4..4 + n]);
            rest = &rest[4 + n..];
        }
        Ok(out)
    }

    /// The elements of a BYTES tensor as UTF-8 text.
    pub fn texts(&self) -> Result<Vec<&str>, Error> {
        self.strings()?
            .into_iter()
            .map(|b| {
                std::str::from_utf8(b).map_err(|_| {
                    Error::invalid_arg(format!(
                        "tensor '{}' holds a string that is not UTF-8",
                        self.name
                    ))
                })
            })
            .collect()
    }

    /// Renames the tensor (an input passed through as an output).
    pub fn renamed(mut self, name: impl Into<String>) -> Tensor {
        self.name = name.into();
        self
    }

    fn expect_dtype(&self, want: DataType) -> Result<(), Error> {
        if self.datatype != want {
            return Err(Error::invalid_arg(format!(
                "tensor '{}' is {:?}, not {:?}",
                self.name, self.datatype, want
            )));
        }
        Ok(())
    }
}

/// One input gathered across a request list: the values of all requests,
/// concatenated along the batch dimension.
#[derive(Debug, Clone)]
pub struct Batch<T> {
    /// All values, request after request.
    pub data: Vec<T>,
    /// Each request's batch size (its first dimension).
    pub sizes: Vec<usize>,
    /// The dimensions after the batch dimension (the same for every request).
    pub inner: Vec<i64>,
}

impl<T> Batch<T> {
    /// Total batch size.
    pub fn total(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// Splits a batched output (`total()` rows of `inner` shape each) back
    /// into one tensor per request, in request order.
    pub fn split<U: Element>(
        &self,
        name: &str,
        data: Vec<U>,
        inner: &[i64],
    ) -> Result<Vec<Tensor>, Error> {
        let row = element_count(inner);
        if data.len() != row * self.total() {
            return Err(Error::internal(format!(
                "output '{name}': {} values for a batch of {} rows of {row}",
                data.len(),
                self.total()
            )));
        }
        let mut out = Vec::with_capacity(self.sizes.len());
        let mut it = data.into_iter();
        for &n in &self.sizes {
            let mut shape = vec![n as i64];
            shape.extend_from_slice(inner);
            out.push(Tensor::from_vec(
                name,
                shape,
                it.by_ref().take(n * row).collect(),
            ));
        }
        Ok(out)
    }
}

/// Gathers input `name` of every request into one batch (for models with
/// `max_batch_size > 0`, whose inputs start with the batch dimension).
pub fn gather<T: Element>(requests: &[Request], name: &str) -> Result<Batch<T>, Error> {
    let mut batch = Batch {
        data: Vec::new(),
        sizes: Vec::with_capacity(requests.len()),
        inner: Vec::new(),
    };
    for (i, r) in requests.iter().enumerate() {
        let t = r.input(name)?;
        let Some((&n, inner)) = t.shape.split_first() else {
            return Err(Error::invalid_arg(format!(
                "input '{name}' has no batch dimension"
            )));
        };
        if i == 0 {
            batch.inner = inner.to_vec();
        } else if inner != batch.inner.as_slice() {
            return Err(Error::invalid_arg(format!(
                "input '{name}': requests in one batch have different shapes ({:?} vs {:?})",
                inner, batch.inner
            )));
        }
        batch.sizes.push(n.max(0) as usize);
        batch.data.extend(t.to_vec::<T>()?);
    }
    Ok(batch)
}

/// Turns a batch-wide result into one result per request: the responses on
/// success, or the error repeated for every request.
pub fn per_request(n: usize, result: Result<Vec<Response>, Error>) -> Vec<Result<Response, Error>> {
    match result {
        Ok(responses) if responses.len() == n => responses.into_iter().map(Ok).collect(),
        Ok(responses) => (0..n)
            .map(|_| {
                Err(Error::internal(format!(
                    "{} responses for {n} requests",
                    responses.len()
                )))
            })
            .collect(),
        Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CorrelationId;

    fn req(t: Tensor) -> Request {
        Request {
            id: String::new(),
            inputs: vec![t],
            requested_outputs: vec![],
            parameters: vec![],
            correlation_id: CorrelationId::None,
            flags: 0,
        }
    }

    #[test]
    fn typed_round_trip_and_strings() {
        let t = Tensor::from_vec("x", vec![2], vec![1.5f32, -2.0]);
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.5, -2.0]);
        assert!(t.to_vec::<i32>().is_err());
        let s = Tensor::from_strings("s", vec![2], &["ab", ""]);
        assert_eq!(s.texts().unwrap(), vec!["ab", ""]);
        let mut bad = s.clone();
        bad.data.pop();
        assert!(bad.strings().is_err());
    }

    #[test]
    fn gather_and_split() {
        let r1 = req(Tensor::from_vec("IN", vec![1, 2], vec![1i32, 2]));
        let r2 = req(Tensor::from_vec("IN", vec![2, 2], vec![3i32, 4, 5, 6]));
        let b = gather::<i32>(&[r1.clone(), r2], "IN").unwrap();
        assert_eq!(
            (b.data.clone(), b.sizes.clone(), b.inner.clone()),
            (vec![1, 2, 3, 4, 5, 6], vec![1, 2], vec![2])
        );
        let doubled: Vec<i32> = b.data.iter().map(|v| v * 2).collect();
        let outs = b.split("OUT", doubled, &[2]).unwrap();
        assert_eq!(outs[0].shape, vec![1, 2]);
        assert_eq!(outs[1].to_vec::<i32>().unwrap(), vec![6, 8, 10, 12]);
        assert!(b.split("OUT", vec![1i32], &[2]).is_err());
        let odd = req(Tensor::from_vec("IN", vec![1, 3], vec![1i32, 2, 3]));
        assert!(gather::<i32>(&[r1, odd], "IN").is_err());
    }
}
