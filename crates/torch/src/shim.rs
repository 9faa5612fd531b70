//! The C++ shim (`shim/shim.cpp`): what LibTorch offers that tch does not.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

use crate::naming::{parse_signature, Signature};

extern "C" {
    fn tern_torch_forward_schema(path: *const c_char, error: *mut *mut c_char) -> *mut c_char;
    fn tern_torch_free(p: *mut c_char);
    fn tern_torch_inference_mode_enter() -> *mut c_void;
    fn tern_torch_inference_mode_exit(guard: *mut c_void);
    fn tern_torch_set_executor_mode(profiling: c_int);
    fn tern_torch_set_cudnn(enabled: c_int);
    fn tern_torch_empty_cuda_cache() -> c_int;
    fn tern_torch_cuda_linked() -> c_int;
}

/// Takes ownership of a malloc'd C string from the shim.
fn take(p: *mut c_char) -> String {
    // SAFETY: the shim returns NUL-terminated strings from malloc; freed once here.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    unsafe { tern_torch_free(p) };
    s
}

/// Reads the forward signature of the TorchScript module in `path` (loaded on the CPU).
pub fn forward_signature(path: &Path) -> Result<Signature, String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| "the path contains a NUL byte".to_string())?;
    let mut error: *mut c_char = std::ptr::null_mut();
    // SAFETY: valid C string in, owned strings out.
    let out = unsafe { tern_torch_forward_schema(c.as_ptr(), &mut error) };
    if out.is_null() {
        return Err(if error.is_null() {
            "unknown error".into()
        } else {
            take(error)
        });
    }
    parse_signature(&take(out))
}

/// `c10::InferenceMode` on the current thread while alive.
pub struct InferenceMode(*mut c_void);

impl InferenceMode {
    /// Enters inference mode on this thread.
    pub fn enter() -> Self {
        // SAFETY: returns an owned guard (or NULL), released in Drop on the same thread.
        InferenceMode(unsafe { tern_torch_inference_mode_enter() })
    }
}

impl Drop for InferenceMode {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the guard came from enter() and is released once.
            unsafe { tern_torch_inference_mode_exit(self.0) }
        }
    }
}

/// Chooses the profiling (true) or the legacy (false) JIT executor, process-wide.
pub fn set_executor_mode(profiling: bool) {
    // SAFETY: sets a global flag.
    unsafe { tern_torch_set_executor_mode(profiling as c_int) }
}

/// Lets LibTorch use cuDNN or not (`DISABLE_CUDNN`), process-wide.
pub fn set_cudnn(enabled: bool) {
    // SAFETY: sets a global flag.
    unsafe { tern_torch_set_cudnn(enabled as c_int) }
}

/// Releases the CUDA caching allocator's unused memory; false in a build without CUDA.
pub fn empty_cuda_cache() -> bool {
    // SAFETY: no arguments; catches C++ exceptions.
    unsafe { tern_torch_empty_cuda_cache() != 0 }
}

/// Whether this build links LibTorch's CUDA library (the `cuda` feature).
pub fn cuda_linked() -> bool {
    // SAFETY: no arguments.
    unsafe { tern_torch_cuda_linked() != 0 }
}
