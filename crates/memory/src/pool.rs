//! Buffer pools: page-locked host memory for GPU staging
//! (`--pinned-memory-pool-byte-size`), device memory per GPU
//! (`--cuda-memory-pool-byte-size`), and ordinary host memory for request
//! bodies and CPU input batches (`--host-memory-pool-byte-size`).
//!
//! A pool hands out blocks rounded up to a power of two and keeps returned
//! blocks for reuse, so steady traffic allocates nothing. Blocks are created
//! lazily up to the configured byte size (an edge device does not pay for a
//! pool it never uses); past it, a request gets a direct allocation (ordinary
//! memory for the pinned pool, `cuMemAlloc` for a device pool) and is never
//! failed for lack of pool space.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::cuda;
use tern_core::error::Result;

/// Which memory a pool holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// Page-locked host memory.
    Pinned,
    /// Device memory on this GPU.
    Device(usize),
    /// Ordinary host memory (64-byte aligned).
    Host,
}

/// One pool.
pub struct Pool {
    kind: PoolKind,
    capacity: usize,
    reserved: AtomicUsize,
    used: AtomicUsize,
    fallbacks: AtomicU64,
    free: Mutex<HashMap<usize, Vec<usize>>>,
}

/// Smallest block handed out.
const MIN_BLOCK: usize = 4096;

/// A block of pool memory (or a direct allocation when the pool is full).
pub struct Block {
    pool: Arc<Pool>,
    ptr: usize,
    class: usize,
    len: usize,
    origin: Origin,
}

enum Origin {
    Pooled,
    Direct,
    /// 8-byte aligned, so any element type can be read in place.
    Heap(#[allow(dead_code)] Vec<u64>),
}

// SAFETY: a block exclusively owns its memory until dropped.
unsafe impl Send for Block {}

impl Block {
    /// Host pointer (pinned pool) or device pointer (device pool).
    pub fn ptr(&self) -> usize {
        self.ptr
    }

    /// Requested length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the memory came from the pool (as opposed to a fallback allocation).
    pub fn pooled(&self) -> bool {
        matches!(self.origin, Origin::Pooled)
    }

    /// Host blocks only: the bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.assert_host();
        // SAFETY: a host block of at least `len` bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }

    /// Host blocks only: a shared, immutable view that returns the block to
    /// its pool when the last clone is dropped (no copy).
    pub fn freeze(self) -> bytes::Bytes {
        self.assert_host();
        bytes::Bytes::from_owner(self)
    }

    fn assert_host(&self) {
        assert!(
            !matches!(self.pool.kind, PoolKind::Device(_)),
            "device memory is not addressable"
        );
    }
}

impl AsRef<[u8]> for Block {
    fn as_ref(&self) -> &[u8] {
        self.assert_host();
        // SAFETY: a host block of at least `len` bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        match self.origin {
            Origin::Pooled => {
                self.pool.used.fetch_sub(self.class, Ordering::Relaxed);
                self.pool
                    .free
                    .lock()
                    .expect("pool poisoned")
                    .entry(self.class)
                    .or_default()
                    .push(self.ptr);
            }
            Origin::Direct => match self.pool.kind {
                // SAFETY: a direct allocation owned by this block.
                PoolKind::Pinned => unsafe { cuda::free_pinned(self.ptr as *mut u8) },
                PoolKind::Device(d) => unsafe { cuda::free_device(d, self.ptr as u64) },
                PoolKind::Host => unreachable!("host fallbacks are heap vectors"),
            },
            Origin::Heap(_) => {}
        }
    }
}

impl Pool {
    /// An empty pool of `capacity` bytes (blocks are allocated as needed).
    pub fn new(kind: PoolKind, capacity: usize) -> Arc<Pool> {
        Arc::new(Pool {
            kind,
            capacity,
            reserved: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
            fallbacks: AtomicU64::new(0),
            free: Mutex::new(HashMap::new()),
        })
    }

    /// Which memory the pool holds.
    pub fn kind(&self) -> PoolKind {
        self.kind
    }

    /// Configured size in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes handed out right now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes allocated from the system so far (in use or cached).
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Requests served by a direct allocation because the pool was full.
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }

    /// A block of at least `len` bytes.
    pub fn take(self: &Arc<Self>, len: usize) -> Result<Block> {
        let class = len.max(MIN_BLOCK).next_power_of_two();
        let cached = self
            .free
            .lock()
            .expect("pool poisoned")
            .get_mut(&class)
            .and_then(|v| v.pop());
        let block = |ptr, origin| Block {
            pool: self.clone(),
            ptr,
            class,
            len,
            origin,
        };
        if let Some(ptr) = cached {
            self.used.fetch_add(class, Ordering::Relaxed);
            return Ok(block(ptr, Origin::Pooled));
        }
        let fits = self
            .reserved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                (r + class <= self.capacity).then_some(r + class)
            })
            .is_ok();
        if fits {
            match self.alloc(class) {
                Ok(ptr) => {
                    self.used.fetch_add(class, Ordering::Relaxed);
                    return Ok(block(ptr, Origin::Pooled));
                }
                Err(e) => {
                    self.reserved.fetch_sub(class, Ordering::Relaxed);
                    tracing::debug!("pool {:?}: allocation failed, falling back: {e}", self.kind);
                }
            }
        }
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        match self.kind {
            PoolKind::Pinned | PoolKind::Host => {
                let mut v = vec![0u64; len.div_ceil(8)];
                let ptr = v.as_mut_ptr() as usize;
                Ok(block(ptr, Origin::Heap(v)))
            }
            PoolKind::Device(d) => Ok(block(
                cuda::alloc_device(d, len.max(1))? as usize,
                Origin::Direct,
            )),
        }
    }

    fn alloc(&self, len: usize) -> Result<usize> {
        match self.kind {
            PoolKind::Pinned => cuda::alloc_pinned(len).map(|p| p as usize),
            PoolKind::Device(d) => cuda::alloc_device(d, len).map(|p| p as usize),
            PoolKind::Host => {
                let layout = std::alloc::Layout::from_size_align(len, HOST_ALIGN)
                    .map_err(|e| tern_core::error::Error::internal(format!("host pool: {e}")))?;
                // SAFETY: `layout` has a non-zero size (classes are at least MIN_BLOCK). Zeroed
                // once so the bytes are always initialised; pool blocks are never freed but
                // recycled for the life of the process.
                let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
                if ptr.is_null() {
                    Err(tern_core::error::Error::internal(
                        "host pool: out of memory".to_string(),
                    ))
                } else {
                    Ok(ptr as usize)
                }
            }
        }
    }
}

/// The process's pools.
pub struct Pools {
    /// Page-locked staging memory; `None` without CUDA (staging uses ordinary memory).
    pub pinned: Option<Arc<Pool>>,
    /// One device pool per GPU, by ordinal.
    pub device: Vec<Arc<Pool>>,
    /// Ordinary memory for request bodies and CPU input batches (capacity 0:
    /// every take is a plain allocation).
    pub host: Arc<Pool>,
}

/// The pinned, host and CUDA memory pools' sizes and use.
impl tern_core::prometheus::Families for Pools {
    fn render(&self, out: &mut String) {
        use tern_core::prometheus::{header, labels, sample};
        let pools = self;
        let pinned = pools.pinned.as_ref();
        for (name, help, value) in [
            (
                "nv_pinned_memory_pool_total_bytes",
                "Pinned memory pool total memory size, in bytes",
                pinned.map_or(0, |p| p.capacity()),
            ),
            (
                "nv_pinned_memory_pool_used_bytes",
                "Pinned memory pool used memory size, in bytes",
                pinned.map_or(0, |p| p.used()),
            ),
            (
                "tern_host_memory_pool_total_bytes",
                "Recycled host memory pool size (--host-memory-pool-byte-size), in bytes",
                pools.host.capacity(),
            ),
            (
                "tern_host_memory_pool_used_bytes",
                "Host memory pool bytes in use by requests",
                pools.host.used(),
            ),
        ] {
            header(out, name, "gauge", help);
            sample(out, name, "", value as f64);
        }
        if !pools.device.is_empty() {
            for (name, help, pick) in [
                (
                    "tern_cuda_memory_pool_total_bytes",
                    "CUDA memory pool size per GPU, in bytes",
                    Pool::capacity as fn(&Pool) -> usize,
                ),
                (
                    "tern_cuda_memory_pool_used_bytes",
                    "CUDA memory pool bytes in use per GPU",
                    Pool::used,
                ),
                (
                    "tern_cuda_memory_pool_reserved_bytes",
                    "CUDA memory pool bytes allocated from the GPU so far (in use or cached) per GPU",
                    Pool::reserved,
                ),
            ] {
                header(out, name, "gauge", help);
                for (i, p) in pools.device.iter().enumerate() {
                    sample(
                        out,
                        name,
                        &labels(&[("gpu", i.to_string())]),
                        pick(p) as f64,
                    );
                }
            }
        }
    }
}

static POOLS: OnceLock<Pools> = OnceLock::new();

/// Sets the pool sizes (once, at startup). `cuda_sizes` lists `(gpu, bytes)`
/// overrides of the 64 MiB default; GPUs not listed get the default.
pub fn configure(
    pinned_bytes: usize,
    host_bytes: usize,
    cuda_sizes: &[(usize, usize)],
) -> &'static Pools {
    POOLS.get_or_init(|| {
        let gpus = cuda::devices();
        let pinned = if gpus.is_empty() || pinned_bytes == 0 {
            if pinned_bytes > 0 {
                tracing::info!(
                    "pinned memory pool unavailable without CUDA; GPU staging is not used"
                );
            }
            None
        } else {
            Some(Pool::new(PoolKind::Pinned, pinned_bytes))
        };
        let device = gpus
            .iter()
            .map(|g| {
                let size = cuda_sizes
                    .iter()
                    .find(|(i, _)| *i == g.index)
                    .map(|(_, s)| *s)
                    .unwrap_or(DEFAULT_CUDA_POOL);
                Pool::new(PoolKind::Device(g.index), size)
            })
            .collect();
        Pools {
            pinned,
            device,
            host: Pool::new(PoolKind::Host, host_bytes),
        }
    })
}

/// The pools (defaults when [`configure`] was never called).
pub fn pools() -> &'static Pools {
    configure(DEFAULT_PINNED_POOL, DEFAULT_HOST_POOL, &[])
}

/// Triton's default `--pinned-memory-pool-byte-size`.
pub const DEFAULT_PINNED_POOL: usize = 256 << 20;
/// Triton's default `--cuda-memory-pool-byte-size` per GPU.
pub const DEFAULT_CUDA_POOL: usize = 64 << 20;
/// Default `--host-memory-pool-byte-size`.
pub const DEFAULT_HOST_POOL: usize = 64 << 20;
/// Alignment of host pool blocks (a cache line; enough for any element type and SIMD loads).
const HOST_ALIGN: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_kind_takes_pinned_blocks_or_falls_back_to_heap_without_cuda() {
        let pool = Pool::new(PoolKind::Pinned, 1 << 20);
        let mut b = pool.take(100).unwrap();
        b.as_mut_slice()[99] = 7;
        if cuda::unavailable_reason().is_none() {
            // With CUDA the block comes from the pinned pool.
            assert!(b.pooled());
            assert_eq!(pool.fallbacks(), 0);
            assert!(pool.reserved() > 0);
        } else {
            assert!(!b.pooled());
            assert_eq!(pool.fallbacks(), 1);
            assert_eq!(pool.used(), 0);
            assert_eq!(pool.reserved(), 0);
        }
    }

    #[test]
    fn host_blocks_are_aligned_and_recycled_through_bytes() {
        let pool = Pool::new(PoolKind::Host, 16 << 10);
        let mut b = pool.take(5000).unwrap();
        assert!(b.pooled());
        assert_eq!(b.ptr() % HOST_ALIGN, 0);
        let first = b.ptr();
        b.as_mut_slice()[4999] = 9;
        let bytes = b.freeze();
        let view = bytes.slice(4990..);
        drop(bytes);
        assert_eq!(view[9], 9);
        assert_eq!(pool.used(), 8192, "still held by the slice");
        drop(view);
        assert_eq!(pool.used(), 0);
        let again = pool.take(6000).unwrap();
        assert_eq!(again.ptr(), first, "the freed block is reused");
        // Past the capacity: a heap fallback, 8-byte aligned, never an error.
        let big = pool.take(64 << 10).unwrap();
        assert!(!big.pooled());
        assert_eq!(big.ptr() % 8, 0);
        assert_eq!(pool.fallbacks(), 1);
        assert_eq!(pool.reserved(), 8192);
    }
}
