//! The shared-memory extensions: system (`/dev/shm`) and CUDA (IPC handle)
//! regions that clients register by name, and the reads and writes that
//! inference requests make through them.
//!
//! Regions are reference counted: unregistering removes the name at once, but
//! a request already holding the region keeps its mapping alive until it is
//! done, so an unregister during traffic never leaves a dangling pointer.
//! Every offset and size is checked against the region before any access.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use crate::cuda::IpcMemory;
use tern_core::error::{Error, Result};
use tern_core::request::{OutputRegion, OutputTarget};
use tern_core::{InferResponse, Parameter, Parameters, RequestedOutput};

/// Where a registered region's memory lives.
enum Memory {
    /// A mapping of a POSIX shared-memory object.
    System(memmap2::MmapRaw),
    /// A CUDA allocation of another process, opened from its IPC handle.
    Cuda(IpcMemory),
}

/// A registered region.
pub struct Region {
    /// Name the client registered it under.
    pub name: String,
    /// System regions: the shm key and the offset into the object.
    pub key: String,
    /// System regions: offset of the region in the shm object.
    pub offset: u64,
    /// CUDA regions: the device.
    pub device_id: i64,
    /// Usable bytes.
    pub byte_size: usize,
    memory: Memory,
}

// SAFETY: the mapping / device pointer is owned by the region and only accessed
// through bounds-checked copies; the memory itself is shared with the client by design.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    /// Bounds check of a tensor in the region, with the errors of Triton's
    /// `SharedMemoryManager::GetMemoryInfo` (its words first, the numbers after).
    fn check(&self, offset: usize, len: usize, what: &str) -> Result<()> {
        let size = self.byte_size;
        if offset >= size {
            return Err(Error::invalid_arg(format!(
                "Invalid offset for shared memory region: '{}' ({what}: offset {offset}, region of {size} bytes)",
                self.name
            )));
        }
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::invalid_arg(format!(
                "Invalid offset + byte size for shared memory region: '{}' ({what}: offset {offset} + byte size \
                 {len} is past the end of the region's {size} bytes)",
                self.name
            )));
        }
        Ok(())
    }

    /// The bytes `[offset, offset+len)`. System regions are not copied: the
    /// returned buffer keeps the mapping alive.
    fn read(self: &Arc<Self>, offset: usize, len: usize, what: &str) -> Result<Bytes> {
        self.check(offset, len, what)?;
        match &self.memory {
            Memory::System(_) => Ok(Bytes::from_owner(Slice {
                region: self.clone(),
                offset,
                len,
            })),
            Memory::Cuda(m) => Ok(m.read(offset, len)?.into()),
        }
    }

    /// Copies `data` to `offset`.
    fn copy_in(&self, offset: usize, data: &[u8], what: &str) -> Result<()> {
        self.check(offset, data.len(), what)?;
        match &self.memory {
            Memory::System(map) => {
                // SAFETY: bounds checked above; the mapping is writable and lives as long as `self`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        map.as_mut_ptr().add(offset),
                        data.len(),
                    )
                };
                Ok(())
            }
            Memory::Cuda(m) => m.write(offset, data),
        }
    }
}

impl OutputRegion for Region {
    fn name(&self) -> &str {
        &self.name
    }

    fn write(&self, offset: usize, data: &[u8], what: &str) -> Result<()> {
        self.copy_in(offset, data, what)
    }
}

/// A zero-copy view of part of a system region, owned by a `Bytes`.
struct Slice {
    region: Arc<Region>,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for Slice {
    fn as_ref(&self) -> &[u8] {
        match &self.region.memory {
            // SAFETY: `offset + len` was checked against the mapping, which the Arc keeps alive.
            Memory::System(map) => unsafe {
                std::slice::from_raw_parts(map.as_ptr().add(self.offset), self.len)
            },
            Memory::Cuda(_) => &[],
        }
    }
}

/// Which registry a call is about.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// `/v2/systemsharedmemory`.
    System,
    /// `/v2/cudasharedmemory`.
    Cuda,
}

impl Kind {
    /// The kind as Triton's messages name it.
    fn label(self) -> &'static str {
        match self {
            Kind::System => "system",
            Kind::Cuda => "cuda",
        }
    }

    /// The kind as Triton's "registered as ... shared memory" message names it.
    fn title(self) -> &'static str {
        match self {
            Kind::System => "system",
            Kind::Cuda => "CUDA",
        }
    }

    fn other(self) -> Kind {
        match self {
            Kind::System => Kind::Cuda,
            Kind::Cuda => Kind::System,
        }
    }
}

/// The error for a register or unregister call while client shared memory is off
/// (the wording of the Triton releases that have `--allow-client-shm`).
pub const DISABLED: &str =
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.";

/// Status of one region, as the status calls report it.
#[derive(Debug)]
pub struct RegionStatus {
    /// Region name.
    pub name: String,
    /// System: shm key.
    pub key: String,
    /// System: offset in the object.
    pub offset: u64,
    /// CUDA: device.
    pub device_id: i64,
    /// Size in bytes.
    pub byte_size: u64,
}

/// Both registries, and whether clients may use them at all (`--allow-client-shm`).
pub struct SharedMemory {
    allowed: bool,
    system: RwLock<BTreeMap<String, Arc<Region>>>,
    cuda: RwLock<BTreeMap<String, Arc<Region>>>,
}

impl SharedMemory {
    /// Empty registries; `allowed` = `--allow-client-shm`.
    pub fn new(allowed: bool) -> Self {
        SharedMemory {
            allowed,
            system: RwLock::default(),
            cuda: RwLock::default(),
        }
    }

    fn map(&self, kind: Kind) -> &RwLock<BTreeMap<String, Arc<Region>>> {
        match kind {
            Kind::System => &self.system,
            Kind::Cuda => &self.cuda,
        }
    }

    /// Refuses registering, unregistering and using regions unless
    /// `--allow-client-shm` is on (status calls just report no regions).
    pub fn check_allowed(&self) -> Result<()> {
        if self.allowed {
            Ok(())
        } else {
            Err(Error::unsupported(DISABLED))
        }
    }

    /// Refuses a name already registered, of either kind, as Triton's single
    /// registry does (checked before the costly open, and again on insert).
    fn check_free(&self, name: &str) -> Result<()> {
        self.check_allowed()?;
        let taken = |kind| self.map(kind).read().expect("poisoned").contains_key(name);
        if taken(Kind::System) || taken(Kind::Cuda) {
            return Err(already_in_manager(name));
        }
        Ok(())
    }

    fn insert(&self, kind: Kind, region: Region) -> Result<()> {
        // Both locks, always system first.
        let mut system = self.system.write().expect("shm registry poisoned");
        let mut cuda = self.cuda.write().expect("shm registry poisoned");
        if system.contains_key(&region.name) || cuda.contains_key(&region.name) {
            return Err(already_in_manager(&region.name));
        }
        let map = match kind {
            Kind::System => &mut system,
            Kind::Cuda => &mut cuda,
        };
        tracing::info!(
            region = %region.name,
            kind = kind.label(),
            bytes = region.byte_size,
            "registered shared memory region"
        );
        map.insert(region.name.clone(), Arc::new(region));
        Ok(())
    }

    /// Registers `[offset, offset+byte_size)` of the POSIX shm object `key`.
    pub fn register_system(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<()> {
        self.check_free(name)?;
        let file_name = key.strip_prefix('/').unwrap_or(key);
        if file_name.is_empty() || file_name.contains('/') || file_name == ".." {
            return Err(Error::invalid_arg(format!(
                "shared memory region '{name}': invalid key '{key}' (expected '/name')"
            )));
        }
        let path = std::path::Path::new("/dev/shm").join(file_name);
        // As glibc's shm_open: a symlink planted in /dev/shm is not followed.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| {
                Error::invalid_arg(format!(
                    "Unable to open shared memory region: '{key}' (region '{name}'): {e}"
                ))
            })?;
        let meta = file.metadata().map_err(|e| {
            Error::invalid_arg(format!(
                "Unable to open shared memory region: '{key}' (region '{name}'): {e}"
            ))
        })?;
        if !meta.is_file() {
            return Err(Error::invalid_arg(format!(
                "shared memory region '{name}': '{key}' is not a shared memory object"
            )));
        }
        let file_len = meta.len();
        if byte_size == 0
            || offset
                .checked_add(byte_size)
                .is_none_or(|end| end > file_len)
        {
            return Err(Error::invalid_arg(format!(
                "failed to register shared memory region '{name}': invalid args (offset {offset} + \
                 byte size {byte_size} is outside shm object '{key}' of {file_len} bytes)"
            )));
        }
        let map = memmap2::MmapOptions::new()
            .offset(offset)
            .len(byte_size as usize)
            .map_raw(&file)
            .map_err(|e| {
                Error::internal(format!(
                    "shared memory region '{name}': mapping '{key}' failed: {e}"
                ))
            })?;
        self.insert(
            Kind::System,
            Region {
                name: name.into(),
                key: key.into(),
                offset,
                device_id: 0,
                byte_size: byte_size as usize,
                memory: Memory::System(map),
            },
        )
    }

    /// Registers a CUDA region from its serialized `cudaIpcMemHandle_t`.
    pub fn register_cuda(
        &self,
        name: &str,
        raw_handle: &[u8],
        device_id: i64,
        byte_size: u64,
    ) -> Result<()> {
        self.check_free(name)?;
        let memory = IpcMemory::open(raw_handle, device_id, byte_size as usize)
            .map_err(|e| e.context(format!("CUDA shared memory region '{name}'")))?;
        self.insert(
            Kind::Cuda,
            Region {
                name: name.into(),
                key: String::new(),
                offset: 0,
                device_id,
                byte_size: byte_size as usize,
                memory: Memory::Cuda(memory),
            },
        )
    }

    /// Unregisters one region (`Some`) or all of a kind. Unknown names are not an error (as in Triton).
    pub fn unregister(&self, kind: Kind, name: Option<&str>) -> Result<()> {
        self.check_allowed()?;
        let mut map = self.map(kind).write().expect("shm registry poisoned");
        match name {
            Some(n) => {
                if map.remove(n).is_some() {
                    tracing::info!(
                        region = n,
                        kind = kind.label(),
                        "unregistered shared memory region"
                    );
                }
            }
            None => map.clear(),
        }
        Ok(())
    }

    /// Status of one region or all of a kind. With client shared memory off
    /// nothing can be registered, so this reports no regions rather than an error.
    pub fn status(&self, kind: Kind, name: Option<&str>) -> Result<Vec<RegionStatus>> {
        if let Some(n) = name {
            // One lock at a time (`insert` takes both, in its own order).
            let has = |k: Kind| self.map(k).read().expect("poisoned").contains_key(n);
            if has(kind.other()) && !has(kind) {
                return Err(Error::not_found(format!(
                    "The region named '{n}' is registered as {} shared memory, not {} shared memory",
                    kind.other().title(),
                    kind.title()
                )));
            }
        }
        let map = self.map(kind).read().expect("shm registry poisoned");
        let render = |r: &Region| RegionStatus {
            name: r.name.clone(),
            key: r.key.clone(),
            offset: r.offset,
            device_id: r.device_id,
            byte_size: r.byte_size as u64,
        };
        match name {
            Some(n) => map.get(n).map(|r| vec![render(r)]).ok_or_else(|| {
                Error::not_found(format!(
                    "Unable to find {} shared memory region: '{n}'",
                    kind.label()
                ))
            }),
            None => Ok(map.values().map(|r| render(r)).collect()),
        }
    }

    fn find(&self, name: &str) -> Result<Arc<Region>> {
        self.check_allowed()?;
        let found = self
            .system
            .read()
            .expect("poisoned")
            .get(name)
            .cloned()
            .or_else(|| self.cuda.read().expect("poisoned").get(name).cloned());
        found.ok_or_else(|| {
            Error::invalid_arg(format!("Unable to find shared memory region: '{name}'"))
        })
    }

    /// The data of input `input` from `region` (`shared_memory_offset`/`byte_size` parameters).
    pub fn input(
        &self,
        input: &str,
        region: &str,
        offset: usize,
        byte_size: usize,
    ) -> Result<Bytes> {
        let r = self.find(region)?;
        r.read(offset, byte_size, &format!("input '{input}'"))
    }

    /// The shared-memory target an output's parameters ask for, if any
    /// (classification results cannot go to shared memory).
    pub fn output_target(
        &self,
        output: &str,
        params: &Parameters,
        classification: bool,
    ) -> Result<Option<OutputTarget>> {
        if !params.keys().any(|k| k.starts_with("shared_memory_")) {
            return Ok(None);
        }
        let what = format!("output '{output}'");
        let Some((region, offset, size)) = parameters(params, &what)? else {
            return Ok(None);
        };
        if classification {
            return Err(Error::invalid_arg(format!(
                "{what}: classification results cannot be written to shared memory"
            )));
        }
        self.output(output, &region, offset, size).map(Some)
    }

    /// Resolves the target of an output written to shared memory.
    pub fn output(
        &self,
        output: &str,
        region: &str,
        offset: usize,
        byte_size: usize,
    ) -> Result<OutputTarget> {
        let r = self.find(region)?;
        r.check(offset, byte_size, &format!("output '{output}'"))?;
        Ok(OutputTarget {
            region: r,
            offset,
            byte_size,
        })
    }
}

fn already_in_manager(name: &str) -> Error {
    Error::already_exists(format!("shared memory region '{name}' already in manager"))
}

/// Writes the outputs the client asked to receive in shared memory. An
/// output larger than its target fails the request (nothing partial is written).
pub fn write_outputs(resp: &InferResponse, requested: &[RequestedOutput]) -> Result<()> {
    for r in requested {
        let Some(target) = &r.shm else { continue };
        let Some(t) = resp.outputs.iter().find(|t| t.name == r.name) else {
            continue;
        };
        if t.data.len() > target.byte_size {
            return Err(Error::invalid_arg(format!(
                "shared memory size specified with the request for output '{}' ({} bytes) should be at \
                 least {} bytes to hold the results",
                r.name,
                target.byte_size,
                t.data.len()
            )));
        }
    }
    for r in requested {
        let Some(target) = &r.shm else { continue };
        if let Some(t) = resp.outputs.iter().find(|t| t.name == r.name) {
            target
                .region
                .write(target.offset, &t.data, &format!("output '{}'", r.name))?;
        }
    }
    Ok(())
}

/// Reads the `shared_memory_region` / `_offset` / `_byte_size` parameters of
/// an input or output; `None` when the tensor does not use shared memory.
pub fn parameters(params: &Parameters, what: &str) -> Result<Option<(String, usize, usize)>> {
    let region = match params.get("shared_memory_region") {
        None => {
            if params.contains_key("shared_memory_byte_size")
                || params.contains_key("shared_memory_offset")
            {
                return Err(Error::invalid_arg(format!(
                    "{what}: 'shared_memory_byte_size'/'shared_memory_offset' given without 'shared_memory_region'"
                )));
            }
            return Ok(None);
        }
        Some(Parameter::String(s)) => s.clone(),
        Some(_) => {
            return Err(Error::invalid_arg(format!(
                "{what}: 'shared_memory_region' must be a string"
            )))
        }
    };
    let int = |key: &str, required: bool| -> Result<usize> {
        match params.get(key) {
            None if !required => Ok(0),
            None => Err(Error::invalid_arg(format!(
                "{what}: 'shared_memory_region' requires '{key}'"
            ))),
            Some(Parameter::Int(n)) if *n >= 0 => Ok(*n as usize),
            Some(_) => Err(Error::invalid_arg(format!(
                "{what}: '{key}' must be a non-negative integer"
            ))),
        }
    };
    Ok(Some((
        region,
        int("shared_memory_offset", false)?,
        int("shared_memory_byte_size", true)?,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::{DataType, Tensor};

    fn object(len: usize) -> (String, std::path::PathBuf) {
        let key = format!("/tern_test_{}_{}", std::process::id(), rand_suffix());
        let path = std::path::Path::new("/dev/shm").join(&key[1..]);
        std::fs::write(&path, (0..len).map(|i| i as u8).collect::<Vec<u8>>()).unwrap();
        (key, path)
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    #[test]
    fn symlinks_and_non_files_in_dev_shm_are_refused() {
        let shm = SharedMemory::new(true);
        let (_, target) = object(64);
        let link = format!("/tern_test_{}_{}", std::process::id(), rand_suffix());
        let link_path = std::path::Path::new("/dev/shm").join(&link[1..]);
        std::os::unix::fs::symlink(&target, &link_path).unwrap();
        let e = shm.register_system("l", &link, 0, 8).unwrap_err();
        assert!(
            e.message.contains("Unable to open shared memory region"),
            "{e}"
        );
        let dir = format!("/tern_test_{}_{}", std::process::id(), rand_suffix());
        let dir_path = std::path::Path::new("/dev/shm").join(&dir[1..]);
        std::fs::create_dir(&dir_path).unwrap();
        assert!(shm.register_system("d", &dir, 0, 8).is_err());
        for p in [&link_path, &target] {
            std::fs::remove_file(p).unwrap();
        }
        std::fs::remove_dir(&dir_path).unwrap();
    }

    #[test]
    fn register_read_write_and_bounds() {
        let shm = SharedMemory::new(true);
        let (key, path) = object(64);
        shm.register_system("r", &key, 8, 32).unwrap();
        assert_eq!(
            shm.register_system("r", &key, 0, 8).unwrap_err().code,
            tern_core::error::Code::AlreadyExists
        );
        let b = shm.input("x", "r", 4, 4).unwrap();
        assert_eq!(&b[..], &[12, 13, 14, 15]);
        assert!(shm
            .input("x", "r", 30, 4)
            .unwrap_err()
            .message
            .starts_with("Invalid offset + byte size for shared memory region: 'r'"));
        for offset in [32, usize::MAX] {
            assert!(shm
                .input("x", "r", offset, 4)
                .unwrap_err()
                .message
                .starts_with("Invalid offset for shared memory region: 'r'"));
        }
        assert!(shm
            .input("x", "r", 4, usize::MAX)
            .unwrap_err()
            .message
            .starts_with("Invalid offset + byte size for shared memory region: 'r'"));
        assert_eq!(
            shm.input("x", "nope", 0, 4).unwrap_err().message,
            "Unable to find shared memory region: 'nope'"
        );
        assert!(shm
            .output("y", "r", 28, 8)
            .unwrap_err()
            .message
            .starts_with("Invalid offset + byte size for shared memory region: 'r'"));
        let target = shm.output("y", "r", 0, 8).unwrap();
        let resp = InferResponse {
            outputs: vec![Tensor::new("y", DataType::Uint8, vec![4], vec![9u8; 4])],
            ..Default::default()
        };
        let req = vec![RequestedOutput {
            name: "y".into(),
            shm: Some(target),
            ..Default::default()
        }];
        write_outputs(&resp, &req).unwrap();
        assert_eq!(&std::fs::read(&path).unwrap()[8..12], &[9, 9, 9, 9]);
        let small = shm.output("y", "r", 0, 2).unwrap();
        let req = vec![RequestedOutput {
            name: "y".into(),
            shm: Some(small),
            ..Default::default()
        }];
        assert_eq!(
            write_outputs(&resp, &req).unwrap_err().message,
            "shared memory size specified with the request for output 'y' (2 bytes) should be at \
             least 4 bytes to hold the results"
        );
        // A read outlives unregistration.
        shm.unregister(Kind::System, Some("r")).unwrap();
        assert_eq!(&b[..], &[12, 13, 14, 15]);
        let e = shm.status(Kind::System, Some("r")).unwrap_err();
        assert_eq!(e.code, tern_core::error::Code::NotFound);
        assert_eq!(e.message, "Unable to find system shared memory region: 'r'");
        assert_eq!(
            shm.status(Kind::Cuda, Some("r")).unwrap_err().message,
            "Unable to find cuda shared memory region: 'r'"
        );
        // Unregistering an unknown name succeeds silently, as in Triton.
        shm.unregister(Kind::System, Some("r")).unwrap();
        assert!(shm
            .register_system("big", &key, 0, 65)
            .unwrap_err()
            .message
            .starts_with("failed to register shared memory region 'big': invalid args"));
        assert!(shm
            .register_system("missing", "/tern_no_such_object_here", 0, 1)
            .unwrap_err()
            .message
            .starts_with("Unable to open shared memory region: '/tern_no_such_object_here'"));
        assert!(shm.register_system("bad", "/../etc", 0, 1).is_err());
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn disabled_reports_no_regions_and_refuses_the_rest() {
        let shm = SharedMemory::new(false);
        for kind in [Kind::System, Kind::Cuda] {
            assert!(shm.status(kind, None).unwrap().is_empty());
            assert_eq!(
                shm.status(kind, Some("r")).unwrap_err().code,
                tern_core::error::Code::NotFound
            );
            let e = shm.unregister(kind, None).unwrap_err();
            assert_eq!(e.code, tern_core::error::Code::Unsupported);
            assert_eq!(e.message, DISABLED);
        }
        let e = shm.register_system("r", "/x", 0, 8).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (tern_core::error::Code::Unsupported, DISABLED)
        );
        assert_eq!(
            shm.register_cuda("r", &[0; 64], 0, 8).unwrap_err().message,
            DISABLED
        );
        assert_eq!(shm.input("x", "r", 0, 1).unwrap_err().message, DISABLED);
    }

    #[test]
    fn names_are_unique_across_kinds() {
        let shm = SharedMemory::new(true);
        let (key, path) = object(16);
        shm.register_system("r", &key, 0, 16).unwrap();
        // The CUDA registry refuses the name before it touches CUDA.
        let e = shm.register_cuda("r", &[0; 64], 0, 16).unwrap_err();
        assert_eq!(e.message, "shared memory region 'r' already in manager");
        assert_eq!(
            shm.status(Kind::Cuda, Some("r")).unwrap_err().message,
            "The region named 'r' is registered as system shared memory, not CUDA shared memory"
        );
        // Unregistering it as the other kind leaves it alone, as in Triton.
        shm.unregister(Kind::Cuda, Some("r")).unwrap();
        assert_eq!(shm.status(Kind::System, Some("r")).unwrap().len(), 1);
        shm.unregister(Kind::System, None).unwrap();
        std::fs::remove_file(path).unwrap();
    }
}
