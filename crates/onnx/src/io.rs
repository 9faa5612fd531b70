//! Where ONNX Runtime's inputs and outputs live, and how they move between
//! core tensors and ORT values with as few copies as possible:
//!
//! * a single request's input whose bytes are suitably aligned is handed to
//!   ORT in place (a view of the request buffer: HTTP body, gRPC message or
//!   shared-memory region);
//! * otherwise (a batch of several requests, a misaligned buffer) the input
//!   is gathered once into a recycled pool block: ordinary host memory for CPU
//!   instances, page-locked memory for GPU ones;
//! * on GPU instances the gathered block is then copied by DMA into a block
//!   of the GPU's device pool and handed to ORT as a device tensor, so the
//!   CUDA provider reads it where it is (when the device pool is off or
//!   cannot serve, ORT gets the host block and copies it itself);
//! * outputs over 16 KiB stay in the memory ORT produced them in (its arena)
//!   and are shared with the responses as `Bytes`, sliced per request of a
//!   batch; smaller ones are copied, which is cheaper than releasing the ORT
//!   value from another thread.
//!
//! BYTES tensors are converted to and from ORT string tensors (a copy each
//! way: ORT stores them as C++ strings).

use std::sync::Arc;

use bytes::Bytes;
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::SessionInputValue;
use ort::value::{
    DynTensor, DynTensorValueType, Tensor as OrtTensor, TensorElementType, TensorRefMut,
};

use tern_core::error::{Error, Result};
use tern_core::tensor::element_count;
use tern_core::{bytes_tensor, DataType, InferRequest, Tensor};
use tern_memory::pool::{Block, Pool, PoolKind};

/// ORT's element type for a Triton data type.
pub fn to_ort_type(dt: DataType) -> TensorElementType {
    match dt {
        DataType::Bool => TensorElementType::Bool,
        DataType::Uint8 => TensorElementType::Uint8,
        DataType::Uint16 => TensorElementType::Uint16,
        DataType::Uint32 => TensorElementType::Uint32,
        DataType::Uint64 => TensorElementType::Uint64,
        DataType::Int8 => TensorElementType::Int8,
        DataType::Int16 => TensorElementType::Int16,
        DataType::Int32 => TensorElementType::Int32,
        DataType::Int64 => TensorElementType::Int64,
        DataType::Fp16 => TensorElementType::Float16,
        DataType::Fp32 => TensorElementType::Float32,
        DataType::Fp64 => TensorElementType::Float64,
        DataType::Bf16 => TensorElementType::Bfloat16,
        DataType::Bytes => TensorElementType::String,
    }
}

/// The Triton data type of an ORT element type, if it has one.
pub fn from_ort_type(t: TensorElementType) -> Option<DataType> {
    DataType::all().find(|&d| to_ort_type(d) == t)
}

/// Where [`input`] puts a batch's input bytes.
pub struct Placement<'p> {
    /// Host memory to gather into.
    pub host: &'p Arc<Pool>,
    /// Whether a single request's aligned buffer may be used without gathering.
    pub in_place: bool,
    /// GPU instances: the device pool the gathered bytes are copied into.
    pub device: Option<&'p Arc<Pool>>,
}

/// Input `name` of the whole batch as one ORT value of `shape`: in place when
/// the placement allows it (one request, aligned data), else gathered into a
/// host block and, for a device placement, copied into a device block; the
/// blocks are pushed to `staging`.
///
/// # Safety
/// The value may borrow the requests' buffers and the staged blocks: `batch`
/// and `staging` must outlive it (the caller drops the value first).
pub unsafe fn input(
    batch: &[InferRequest],
    name: &str,
    shape: &[i64],
    place: &Placement<'_>,
    staging: &mut Vec<Block>,
) -> Result<SessionInputValue<'static>> {
    let first = batch[0]
        .input(name)
        .ok_or_else(|| Error::internal(format!("input '{name}' missing from the batch")))?;
    let dtype = first.dtype;
    let Some(size) = dtype.size() else {
        return strings_input(&gather_strings(batch, name)?, name, shape);
    };
    let ptr = first.data.as_ptr();
    if place.in_place && batch.len() == 1 {
        // SAFETY: forwarded from the caller (`staging` outlives the value).
        if let Some(value) = unsafe { device_view(place, &first.data, dtype, shape, name, staging) }
        {
            return value;
        }
        if (ptr as usize).is_multiple_of(size) {
            // SAFETY: validation guarantees the buffer holds exactly `shape` elements; the
            // caller keeps the request alive for as long as the value. ORT does not write to
            // inputs.
            return unsafe { view(ptr as *mut u8, dtype, shape, name, None) };
        }
    }
    let total: usize = batch
        .iter()
        .map(|r| r.input(name).map_or(0, |t| t.data.len()))
        .sum();
    let mut block = place.host.take(total)?;
    let buf = block.as_mut_slice();
    let mut at = 0;
    for r in batch {
        let t = r.input(name).ok_or_else(|| {
            Error::internal(format!("input '{name}' missing from a batched request"))
        })?;
        buf[at..at + t.data.len()].copy_from_slice(&t.data);
        at += t.data.len();
    }
    // SAFETY: forwarded from the caller; the device copy is synchronous, so `block` may go.
    if let Some(value) = unsafe { device_view(place, block.as_ref(), dtype, shape, name, staging) }
    {
        return value;
    }
    // SAFETY: the block holds exactly the gathered bytes for `shape` (validated sizes) and is
    // kept alive in `staging`; its address is aligned for every element type.
    let value = unsafe { view(block.ptr() as *mut u8, dtype, shape, name, None) }?;
    staging.push(block);
    Ok(value)
}

/// For a device placement: `bytes` copied into a block of the device pool
/// (pushed to `staging`) and viewed as a device tensor. `None` when there is
/// no device pool or it cannot serve (then ORT copies the host input itself:
/// slower, never a failed request).
///
/// # Safety
/// As for [`input`]: `staging` must outlive the value.
unsafe fn device_view(
    place: &Placement<'_>,
    bytes: &[u8],
    dtype: DataType,
    shape: &[i64],
    name: &str,
    staging: &mut Vec<Block>,
) -> Option<Result<SessionInputValue<'static>>> {
    let device = place.device?;
    let PoolKind::Device(id) = device.kind() else {
        return None;
    };
    let copied = device.take(bytes.len()).and_then(|block| {
        tern_memory::cuda::copy_to_device(id, block.ptr() as u64, bytes).map(|()| block)
    });
    match copied {
        Ok(block) => {
            // SAFETY: the device block holds the input's bytes (copied synchronously, so ORT's
            // stream sees them) and is kept alive in `staging`; device allocations are aligned
            // for every element type.
            let value = unsafe { view(block.ptr() as *mut u8, dtype, shape, name, Some(device)) };
            staging.push(block);
            Some(value)
        }
        Err(e) => {
            tracing::debug!("input '{name}': device pool unavailable ({e}); ORT copies it");
            None
        }
    }
}

/// A tensor view of memory at `ptr`: host memory, or device memory of the
/// GPU whose pool is `device`.
///
/// # Safety
/// `ptr` must hold `shape`'s elements of `dtype`, aligned for it, and outlive the view.
unsafe fn view(
    ptr: *mut u8,
    dtype: DataType,
    shape: &[i64],
    name: &str,
    device: Option<&Arc<Pool>>,
) -> Result<SessionInputValue<'static>> {
    let fail = |e: ort::Error| Error::internal(format!("input '{name}': {e}"));
    let (kind, id) = match device.map(|d| d.kind()) {
        Some(PoolKind::Device(id)) => (AllocationDevice::CUDA, id as i32),
        _ => (AllocationDevice::CPU, 0),
    };
    let info =
        MemoryInfo::new(kind, id, AllocatorType::Device, MemoryType::Default).map_err(fail)?;
    let ptr = ptr as *mut ort::sys::c_void;
    let shape = ort::value::Shape::new(shape.iter().copied());
    macro_rules! raw {
        ($t:ty) => {
            // SAFETY: forwarded from the caller.
            SessionInputValue::from(
                unsafe { TensorRefMut::<'static, $t>::from_raw(info, ptr, shape) }.map_err(fail)?,
            )
        };
    }
    Ok(match dtype {
        DataType::Bool => raw!(bool),
        DataType::Uint8 => raw!(u8),
        DataType::Uint16 => raw!(u16),
        DataType::Uint32 => raw!(u32),
        DataType::Uint64 => raw!(u64),
        DataType::Int8 => raw!(i8),
        DataType::Int16 => raw!(i16),
        DataType::Int32 => raw!(i32),
        DataType::Int64 => raw!(i64),
        DataType::Fp16 => raw!(half::f16),
        DataType::Bf16 => raw!(half::bf16),
        DataType::Fp32 => raw!(f32),
        DataType::Fp64 => raw!(f64),
        DataType::Bytes => {
            return Err(Error::internal(format!(
                "input '{name}': BYTES cannot be viewed in place"
            )))
        }
    })
}

/// The elements of input `name` across the batch, as UTF-8 strings.
fn gather_strings(batch: &[InferRequest], name: &str) -> Result<Vec<String>> {
    let mut strings = Vec::new();
    for r in batch {
        let t = r.input(name).ok_or_else(|| {
            Error::internal(format!("input '{name}' missing from a batched request"))
        })?;
        for (i, e) in bytes_tensor::decode(&t.data)?.into_iter().enumerate() {
            strings.push(ort_string(name, i, e)?.to_owned());
        }
    }
    Ok(strings)
}

/// Checks that every BYTES input of `request` can become an ORT string
/// tensor, so a batch can drop a bad request before running the others.
pub fn check_strings(request: &InferRequest) -> Result<()> {
    for t in request.inputs.iter().filter(|t| t.dtype == DataType::Bytes) {
        for (i, e) in bytes_tensor::decode(&t.data)?.into_iter().enumerate() {
            ort_string(&t.name, i, e)?;
        }
    }
    Ok(())
}

/// Element `index` of input `name` as ORT stores strings: UTF-8 C strings.
fn ort_string<'a>(name: &str, index: usize, e: &'a [u8]) -> Result<&'a str> {
    if let Some(at) = e.iter().position(|&b| b == 0) {
        return Err(Error::invalid_arg(format!(
            "input '{name}': element {index} has a NUL byte at position {at}; \
             ONNX string tensors cannot hold NUL bytes"
        )));
    }
    std::str::from_utf8(e).map_err(|_| {
        Error::invalid_arg(format!(
            "input '{name}': element {index} is not valid UTF-8, which ONNX string tensors require"
        ))
    })
}

/// An ORT string tensor.
fn strings_input(
    strings: &[String],
    name: &str,
    shape: &[i64],
) -> Result<SessionInputValue<'static>> {
    OrtTensor::from_string_array((shape.to_vec(), strings))
        .map(|v| SessionInputValue::from(v.upcast()))
        .map_err(|e| Error::internal(format!("input '{name}': {e}")))
}

/// An ORT output tensor seen as bytes: responses share ORT's buffer instead
/// of copying it, and it goes back to ORT's arena when the last one is sent.
struct OutputBytes {
    value: DynTensor,
    len: usize,
}

impl AsRef<[u8]> for OutputBytes {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: a CPU tensor of `len` bytes (checked against its shape and type when built),
        // kept alive by `self.value`.
        unsafe { std::slice::from_raw_parts(self.value.data_ptr() as *const u8, self.len) }
    }
}

/// Converts an ORT output to a core tensor (fixed-size types without a copy).
pub fn output(name: &str, value: ort::value::DynValue) -> Result<Tensor> {
    let fail = |e: ort::Error| Error::internal(format!("output '{name}': {e}"));
    let value = value.downcast::<DynTensorValueType>().map_err(fail)?;
    let shape: Vec<i64> = value.shape().to_vec();
    let ty = *value.data_type();
    let dtype = from_ort_type(ty).ok_or_else(|| {
        Error::unsupported(format!(
            "output '{name}': ONNX type {ty:?} is not supported"
        ))
    })?;
    let Some(size) = dtype.size() else {
        let (_, strings) = value.try_extract_strings().map_err(fail)?;
        return Ok(Tensor::new(
            name,
            dtype,
            shape,
            bytes_tensor::encode(&strings),
        ));
    };
    if !value.memory_info().is_cpu_accessible() {
        return Err(Error::internal(format!(
            "output '{name}' is not in CPU-accessible memory"
        )));
    }
    let len = element_count(&shape) * size;
    let out = OutputBytes { value, len };
    // Small outputs are copied so that the ORT value is released here, on the
    // instance thread: releasing it later from a frontend thread costs more
    // (ORT's allocator lock, shared with the running session) than the copy.
    let data = if len <= COPY_OUTPUT_BELOW {
        Bytes::copy_from_slice(out.as_ref())
    } else {
        Bytes::from_owner(out)
    };
    Ok(Tensor::new(name, dtype, shape, data))
}

/// Outputs up to this size are copied out of ORT instead of shared.
const COPY_OUTPUT_BELOW: usize = 16 * 1024;

pub use tern_core::tensor::scatter;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_table_is_complete() {
        for dt in DataType::all() {
            assert_eq!(from_ort_type(to_ort_type(dt)), Some(dt));
        }
    }

    #[test]
    fn device_placement_without_cuda_falls_back_to_host_memory() {
        assert!(
            std::env::var_os("ORT_DYLIB_PATH").is_some_and(|p| std::path::Path::new(&p).is_file()),
            "ORT_DYLIB_PATH does not name the ONNX Runtime library: run the tests through make (`make test-fast` fetches it)"
        );
        assert!(
            tern_memory::cuda::devices().is_empty(),
            "this test checks the no-CUDA fallback"
        );
        let request = |v: f32| InferRequest {
            inputs: vec![Tensor::new(
                "X",
                DataType::Fp32,
                vec![1, 2],
                [v, v + 1.0]
                    .iter()
                    .flat_map(|f| f.to_ne_bytes())
                    .collect::<Vec<u8>>(),
            )],
            ..Default::default()
        };
        let batch = [request(1.0), request(3.0)];
        let host = Pool::new(PoolKind::Host, 1 << 20);
        let device = Pool::new(PoolKind::Device(0), 1 << 20);
        let place = Placement {
            host: &host,
            in_place: true,
            device: Some(&device),
        };
        let mut staging = Vec::new();
        // SAFETY: `batch` and `staging` outlive the value (dropped first).
        let value = unsafe { input(&batch, "X", &[2, 2], &place, &mut staging) }.unwrap();
        drop(value);
        assert_eq!(device.fallbacks(), 1, "the device pool was tried");
        assert_eq!(device.used(), 0);
        assert_eq!(staging.len(), 1, "gathered into one host block");
        let want: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|f| f.to_ne_bytes())
            .collect();
        assert_eq!(staging[0].as_ref(), &want[..]);
        // A single aligned request still goes in place.
        let mut staging = Vec::new();
        // SAFETY: as above.
        let value = unsafe { input(&batch[..1], "X", &[1, 2], &place, &mut staging) }.unwrap();
        drop(value);
        assert!(staging.is_empty());
    }

    #[test]
    fn scatter_slices_fixed_size_and_reencodes_bytes() {
        let data: Vec<u8> = (0..24).collect();
        let t = Tensor::new("y", DataType::Int32, vec![3, 2], data);
        let parts = scatter(t.clone(), &[1, 2]).unwrap();
        assert_eq!(parts[0].shape, vec![1, 2]);
        assert_eq!(&parts[0].data[..], &(0..8).collect::<Vec<u8>>()[..]);
        assert_eq!(parts[1].shape, vec![2, 2]);
        assert_eq!(
            parts[1].data.as_ptr(),
            t.data[8..].as_ptr(),
            "a view, not a copy"
        );
        let s = Tensor::new(
            "s",
            DataType::Bytes,
            vec![3],
            bytes_tensor::encode(["a", "bb", "c"]),
        );
        let parts = scatter(s, &[2, 1]).unwrap();
        assert_eq!(
            bytes_tensor::decode(&parts[0].data).unwrap(),
            vec![b"a" as &[u8], b"bb"]
        );
        assert_eq!(
            bytes_tensor::decode(&parts[1].data).unwrap(),
            vec![b"c" as &[u8]]
        );
        let bad = Tensor::new("y", DataType::Int32, vec![2, 2], vec![0u8; 16]);
        assert!(scatter(bad, &[1, 2])
            .unwrap_err()
            .message
            .contains("batch size 3"));
    }

    #[test]
    fn strings_ort_cannot_hold_are_refused_per_request() {
        let req = |elements: &[&[u8]]| InferRequest {
            inputs: vec![Tensor::new(
                "T",
                DataType::Bytes,
                vec![elements.len() as i64],
                bytes_tensor::encode(elements.iter().copied()),
            )],
            ..Default::default()
        };
        assert!(check_strings(&req(&[b"ok", "é".as_bytes(), b""])).is_ok());
        let e = check_strings(&req(&[b"ok", b"a\0b"])).unwrap_err();
        assert!(
            e.message
                .contains("input 'T': element 1 has a NUL byte at position 1"),
            "{e}"
        );
        let e = check_strings(&req(&[b"\xff"])).unwrap_err();
        assert!(e.message.contains("element 0 is not valid UTF-8"), "{e}");
        assert!(gather_strings(&[req(&[b"x"]), req(&[b"\0"])], "T").is_err());
    }
}
