//! Memory outside the ordinary heap: CUDA devices and allocations
//! (`cuda`), the pinned and device staging pools (`pool`), and the system and
//! CUDA shared-memory regions clients register (`shm`).

pub mod cuda;
pub mod pool;
pub mod shm;
