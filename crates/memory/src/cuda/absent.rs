//! The CUDA entry points of a build without the `cuda` feature: discovery
//! finds no device and says why; every operation is unsupported.

use super::GpuInfo;
use tern_core::error::{Error, Result};

const NO_CUDA: &str = "this build has no CUDA support (built without the 'cuda' feature)";

fn unsupported<T>(what: &str) -> Result<T> {
    Err(Error::unsupported(format!("{what} needs CUDA: {NO_CUDA}")))
}

/// Finds no device: the build has no driver code.
pub(super) fn discover() -> std::result::Result<Vec<GpuInfo>, String> {
    Err(NO_CUDA.into())
}

/// Unsupported in this build.
pub fn bind_thread(_device: usize) -> Result<()> {
    unsupported("this operation")
}

/// Unsupported in this build.
pub fn alloc_pinned(_len: usize) -> Result<*mut u8> {
    unsupported("pinned memory")
}

/// Nothing to free: [`alloc_pinned`] never succeeds in this build.
///
/// # Safety
/// Always safe here; the signature matches the CUDA build.
pub unsafe fn free_pinned(_ptr: *mut u8) {}

/// Unsupported in this build.
pub fn alloc_device(_device: usize, _len: usize) -> Result<u64> {
    unsupported("device memory")
}

/// Nothing to free: [`alloc_device`] never succeeds in this build.
///
/// # Safety
/// Always safe here; the signature matches the CUDA build.
pub unsafe fn free_device(_device: usize, _ptr: u64) {}

/// Unsupported in this build.
pub fn copy_to_device(_device: usize, _dst: u64, _src: &[u8]) -> Result<()> {
    unsupported("device memory")
}

/// Unsupported in this build.
pub fn copy_from_device(_device: usize, _dst: &mut [u8], _src: u64) -> Result<()> {
    unsupported("device memory")
}

/// CUDA shared memory, which this build cannot open (the type has no values).
pub struct IpcMemory {
    never: std::convert::Infallible,
}

impl IpcMemory {
    /// Unsupported in this build.
    pub fn open(_raw_handle: &[u8], _device_id: i64, _len: usize) -> Result<IpcMemory> {
        unsupported("CUDA shared memory")
    }

    /// Never called: no `IpcMemory` exists in this build.
    pub fn read(&self, _offset: usize, _len: usize) -> Result<Vec<u8>> {
        match self.never {}
    }

    /// Never called: no `IpcMemory` exists in this build.
    pub fn write(&self, _offset: usize, _data: &[u8]) -> Result<()> {
        match self.never {}
    }

    /// Never called: no `IpcMemory` exists in this build.
    pub fn device(&self) -> usize {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::{devices, unavailable_reason};
    use super::*;

    #[test]
    fn a_build_without_cuda_says_so_everywhere() {
        assert!(devices().is_empty());
        let why = unavailable_reason().unwrap();
        assert!(why.contains("without the 'cuda' feature"), "{why}");
        let e = IpcMemory::open(&[0; 64], 0, 16).err().unwrap();
        assert_eq!(e.code, tern_core::error::Code::Unsupported);
        assert!(
            e.message.contains("built without the 'cuda' feature"),
            "{e}"
        );
        assert!(alloc_pinned(16).is_err() && bind_thread(0).is_err());
    }
}
