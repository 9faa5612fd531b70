//! The CUDA driver calls (`cudarc`, `libcuda` opened at run time).

use std::sync::Mutex;

use cudarc::driver::{result, sys};

use super::{devices, require, GpuInfo};
use tern_core::error::{Error, Result};

/// Finds the CUDA devices through the driver.
pub(super) fn discover() -> std::result::Result<Vec<GpuInfo>, String> {
    // SAFETY: only probes whether the library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err("the NVIDIA driver library (libcuda.so) was not found".into());
    }
    let e = |what: &str, err: cudarc::driver::DriverError| format!("{what}: {err}");
    result::init().map_err(|err| e("cuInit failed", err))?;
    let count = result::device::get_count().map_err(|err| e("cuDeviceGetCount", err))?;
    let mut out = Vec::new();
    for i in 0..count {
        let dev = result::device::get(i).map_err(|err| e("cuDeviceGet", err))?;
        let attr = |a| unsafe { result::device::get_attribute(dev, a) }.unwrap_or(0);
        use sys::CUdevice_attribute::*;
        let uuid = result::device::get_uuid(dev)
            .map(|u| format_uuid(&u.bytes))
            .unwrap_or_default();
        out.push(GpuInfo {
            index: i as usize,
            name: result::device::get_name(dev).unwrap_or_default(),
            uuid,
            compute_capability: (
                attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            ),
            // SAFETY: `dev` is a valid device handle.
            total_memory: unsafe { result::device::total_mem(dev) }.unwrap_or(0),
            integrated: attr(CU_DEVICE_ATTRIBUTE_INTEGRATED) == 1,
        });
    }
    Ok(out)
}

fn format_uuid(b: &[std::ffi::c_char; 16]) -> String {
    let h: Vec<String> = b.iter().map(|x| format!("{:02x}", *x as u8)).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// Makes `device`'s primary context current on the calling thread (the
/// context ONNX Runtime's CUDA provider uses too). Contexts are retained once
/// and kept for the life of the process.
pub fn bind_thread(device: usize) -> Result<()> {
    require("this operation")?;
    static CONTEXTS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let mut ctxs = CONTEXTS.lock().expect("context table poisoned");
    let ctx = match ctxs.iter().find(|(d, _)| *d == device) {
        Some((_, c)) => *c as sys::CUcontext,
        None => {
            if device >= devices().len() {
                return Err(Error::invalid_arg(format!(
                    "GPU {device} does not exist ({} GPU(s) present)",
                    devices().len()
                )));
            }
            let dev = result::device::get(device as i32).map_err(driver_error)?;
            // SAFETY: `dev` is valid; the retained context is never released.
            let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(driver_error)?;
            ctxs.push((device, ctx as usize));
            ctx
        }
    };
    drop(ctxs);
    // SAFETY: `ctx` is a retained primary context.
    unsafe { result::ctx::set_current(ctx) }.map_err(driver_error)
}

fn driver_error(e: cudarc::driver::DriverError) -> Error {
    Error::internal(format!("CUDA driver error: {e}"))
}

/// Page-locked host memory (`cuMemHostAlloc`); freed with [`free_pinned`].
pub fn alloc_pinned(len: usize) -> Result<*mut u8> {
    require("pinned memory")?;
    // Portable pinned memory serves every context, but the call needs a current one.
    bind_thread(0)?;
    // SAFETY: plain allocation; the pointer is freed by `free_pinned`.
    unsafe { result::malloc_host(len, sys::CU_MEMHOSTALLOC_PORTABLE) }
        .map(|p| p as *mut u8)
        .map_err(driver_error)
}

/// Frees memory from [`alloc_pinned`].
///
/// # Safety
/// `ptr` must come from `alloc_pinned` and not be used afterwards.
pub unsafe fn free_pinned(ptr: *mut u8) {
    if bind_thread(0).is_err() {
        return;
    }
    if let Err(e) = result::free_host(ptr as *mut std::ffi::c_void) {
        tracing::warn!("cuMemFreeHost failed: {e}");
    }
}

/// Device memory on `device` (`cuMemAlloc`); freed with [`free_device`].
pub fn alloc_device(device: usize, len: usize) -> Result<u64> {
    bind_thread(device)?;
    // SAFETY: plain allocation in the current (bound) context.
    unsafe { result::malloc_sync(len) }.map_err(driver_error)
}

/// Frees memory from [`alloc_device`].
///
/// # Safety
/// `ptr` must come from `alloc_device(device, _)` and not be used afterwards.
pub unsafe fn free_device(device: usize, ptr: u64) {
    if bind_thread(device).is_ok() {
        if let Err(e) = result::free_sync(ptr) {
            tracing::warn!("cuMemFree failed: {e}");
        }
    }
}

/// Copies host bytes to device memory; the bytes are on the device when it
/// returns.
///
/// `cuMemcpyHtoD` from pageable memory may return once the bytes are staged,
/// before the DMA lands, and ONNX Runtime's streams (or another process, for
/// CUDA IPC memory) are not ordered after the legacy stream the copy ran on,
/// so the legacy stream is synchronized after the copy.
pub fn copy_to_device(device: usize, dst: u64, src: &[u8]) -> Result<()> {
    bind_thread(device)?;
    // SAFETY: the caller owns `dst` with at least `src.len()` bytes.
    unsafe { result::memcpy_htod_sync(dst, src) }.map_err(driver_error)?;
    // SAFETY: the null stream is the context's legacy default stream, always valid.
    unsafe { result::stream::synchronize(std::ptr::null_mut()) }.map_err(driver_error)
}

/// Copies device memory to host bytes (synchronously).
pub fn copy_from_device(device: usize, dst: &mut [u8], src: u64) -> Result<()> {
    bind_thread(device)?;
    // SAFETY: the caller guarantees `src` holds at least `dst.len()` bytes.
    unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(driver_error)
}

/// Device memory of another process, opened from a `cudaIpcMemHandle_t`.
pub struct IpcMemory {
    device: usize,
    ptr: u64,
    len: usize,
}

impl IpcMemory {
    /// Opens `raw_handle` (the 64 handle bytes) on `device_id`, checking that
    /// the allocation really holds `len` bytes.
    pub fn open(raw_handle: &[u8], device_id: i64, len: usize) -> Result<IpcMemory> {
        require("CUDA shared memory")?;
        let gpus = devices();
        let Some(gpu) = usize::try_from(device_id).ok().and_then(|d| gpus.get(d)) else {
            return Err(Error::invalid_arg(format!(
                "device_id {device_id} does not exist ({} GPU(s) present)",
                gpus.len()
            )));
        };
        if gpu.integrated {
            return Err(Error::unsupported(format!(
                "CUDA shared memory is not supported on integrated GPU {} ({}): CUDA IPC is unavailable there; \
                 use system shared memory",
                gpu.index, gpu.name
            )));
        }
        if raw_handle.len() != 64 {
            return Err(Error::invalid_arg(format!(
                "raw_handle must be the 64 bytes of a cudaIpcMemHandle_t, got {} bytes",
                raw_handle.len()
            )));
        }
        let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
        for (d, s) in handle.reserved.iter_mut().zip(raw_handle) {
            *d = *s as std::ffi::c_char;
        }
        bind_thread(gpu.index)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `handle` is a full handle; the pointer is closed in Drop.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .result()
        .map_err(|e| Error::invalid_arg(format!("failed to open CUDA IPC handle: {e}")))?;
        let mut base: sys::CUdeviceptr = 0;
        let mut size: usize = 0;
        // SAFETY: `ptr` was just opened in the current context.
        let range = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }.result();
        let mem = IpcMemory {
            device: gpu.index,
            ptr,
            len,
        };
        match range {
            Ok(()) if (ptr - base) as usize + len <= size => Ok(mem),
            Ok(()) => Err(Error::invalid_arg(format!(
                "byte_size {len} exceeds the {} byte(s) of the CUDA allocation",
                size - (ptr - base) as usize
            ))),
            Err(e) => Err(driver_error(e)),
        }
    }

    /// Copies `[offset, offset+len)` to the host (bounds checked by the caller).
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        debug_assert!(offset + len <= self.len);
        let mut out = vec![0u8; len];
        if len > 0 {
            copy_from_device(self.device, &mut out, self.ptr + offset as u64)?;
        }
        Ok(out)
    }

    /// Copies `data` to `offset` (bounds checked by the caller).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        debug_assert!(offset + data.len() <= self.len);
        if data.is_empty() {
            return Ok(());
        }
        copy_to_device(self.device, self.ptr + offset as u64, data)
    }

    /// The device this memory is on.
    pub fn device(&self) -> usize {
        self.device
    }
}

impl Drop for IpcMemory {
    fn drop(&mut self) {
        if bind_thread(self.device).is_ok() {
            // SAFETY: `ptr` was opened by cuIpcOpenMemHandle and is not used after this.
            if let Err(e) = unsafe { sys::cuIpcCloseMemHandle(self.ptr) }.result() {
                tracing::warn!("cuIpcCloseMemHandle failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_everything_reports_unsupported() {
        if super::super::unavailable_reason().is_none() {
            // With a device the same calls succeed.
            assert!(!devices().is_empty());
            assert!(bind_thread(0).is_ok());
            let p = alloc_pinned(16).expect("pinned memory with a CUDA device");
            // SAFETY: allocated just above and not used after.
            unsafe { free_pinned(p) };
            return;
        }
        assert!(devices().is_empty());
        assert_eq!(
            IpcMemory::open(&[0; 64], 0, 16).err().unwrap().code,
            tern_core::error::Code::Unsupported
        );
        assert!(alloc_pinned(16).is_err());
        assert!(bind_thread(0).is_err());
    }

    #[test]
    fn uuid_format() {
        let b: [std::ffi::c_char; 16] = [0x12; 16];
        assert_eq!(format_uuid(&b), "GPU-12121212-1212-1212-1212-121212121212");
    }
}
