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
use tern_core::messages;
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
    /// Bounds check of a tensor in the region, with the errors of current
    /// Triton's `SharedMemoryManager::GetMemoryInfo`, word for word.
    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset >= self.byte_size {
            return Err(messages::shm_invalid_offset(&self.name));
        }
        let Some(end) = offset.checked_add(len) else {
            return Err(messages::shm_offset_overflow(&self.name, len, offset));
        };
        if end > self.byte_size {
            return Err(messages::shm_invalid_offset_size(&self.name));
        }
        Ok(())
    }

    /// The bytes `[offset, offset+len)`. System regions are not copied: the
    /// returned buffer keeps the mapping alive.
    fn read(self: &Arc<Self>, offset: usize, len: usize) -> Result<Bytes> {
        self.check(offset, len)?;
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
    fn copy_in(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
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

    fn write(&self, offset: usize, data: &[u8], _what: &str) -> Result<()> {
        self.copy_in(offset, data)
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

    /// Registers `[offset, offset+byte_size)` of the POSIX shm object `key`,
    /// checking as current Triton does: the key (before the name), the name,
    /// then the object.
    pub fn register_system(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<()> {
        self.check_allowed()?;
        let file_name = check_key(name, key)?;
        self.check_free(name)?;
        let file = open_object(key, file_name)?;
        let file_len = file
            .metadata()
            .map_err(|_| messages::shm_invalid_region(key))?
            .len();
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
        self.check_allowed()?;
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
        found.ok_or_else(|| messages::shm_unknown_region(name))
    }

    /// The data of an input from `region` (`shared_memory_offset`/`byte_size`
    /// parameters); Triton's errors do not name the input.
    pub fn input(
        &self,
        _input: &str,
        region: &str,
        offset: usize,
        byte_size: usize,
    ) -> Result<Bytes> {
        self.find(region)?.read(offset, byte_size)
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

    /// Resolves the target of an output written to shared memory; Triton's
    /// errors do not name the output.
    pub fn output(
        &self,
        _output: &str,
        region: &str,
        offset: usize,
        byte_size: usize,
    ) -> Result<OutputTarget> {
        let r = self.find(region)?;
        r.check(offset, byte_size)?;
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

/// Current Triton's `ValidateSharedMemoryKey`: a key that is empty or only
/// slashes, or names the Python backend's reserved objects, is refused
/// (`INVALID_ARG`). Returns the object's name in `/dev/shm` (the key without
/// its leading slashes, as glibc's `shm_open` reads it).
fn check_key<'k>(name: &str, key: &'k str) -> Result<&'k str> {
    let file_name = key.trim_start_matches('/');
    if file_name.is_empty() {
        return Err(messages::shm_invalid_key(name, key));
    }
    if file_name.starts_with(messages::RESERVED_SHM_PREFIX) {
        return Err(messages::shm_reserved_key(name, key));
    }
    Ok(file_name)
}

/// Opens the shm object `/dev/shm/<file_name>` for reading and writing, as
/// glibc's `shm_open` does: a name with an inner `/`, `.` or `..`, a symlink
/// planted in /dev/shm and anything but a file fail, all with Triton's
/// `INTERNAL` "Unable to open shared memory region".
fn open_object(key: &str, file_name: &str) -> Result<std::fs::File> {
    if file_name.contains('/') || file_name == "." || file_name == ".." {
        return Err(messages::shm_open_failed(key));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(std::path::Path::new("/dev/shm").join(file_name))
        .map_err(|e| {
            tracing::debug!(key, error = %e, "shm_open failed");
            messages::shm_open_failed(key)
        })?;
    match file.metadata() {
        Ok(meta) if !meta.is_file() => Err(messages::shm_open_failed(key)),
        _ => Ok(file),
    }
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
            return Err(messages::shm_output_too_small(
                &r.name,
                target.byte_size,
                t.data.len(),
            ));
        }
    }
    for r in requested {
        let Some(target) = &r.shm else { continue };
        if let Some(t) = resp.outputs.iter().find(|t| t.name == r.name) {
            target.region.write(target.offset, &t.data, &r.name)?;
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
    use tern_core::error::Code;
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
        assert_eq!(
            (e.code, e.message),
            (
                Code::Internal,
                format!("Unable to open shared memory region: '{link}'")
            )
        );
        let dir = format!("/tern_test_{}_{}", std::process::id(), rand_suffix());
        let dir_path = std::path::Path::new("/dev/shm").join(&dir[1..]);
        std::fs::create_dir(&dir_path).unwrap();
        let e = shm.register_system("d", &dir, 0, 8).unwrap_err();
        assert_eq!(
            e.message,
            format!("Unable to open shared memory region: '{dir}'")
        );
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
            Code::AlreadyExists
        );
        let b = shm.input("x", "r", 4, 4).unwrap();
        assert_eq!(&b[..], &[12, 13, 14, 15]);
        let err = |r: Result<Bytes>| {
            let e = r.unwrap_err();
            (e.code, e.message)
        };
        let past_end = (
            Code::InvalidArg,
            "Invalid offset + byte size for shared memory region: 'r'".to_string(),
        );
        assert_eq!(err(shm.input("x", "r", 30, 4)), past_end);
        for offset in [32, usize::MAX] {
            assert_eq!(
                err(shm.input("x", "r", offset, 4)),
                (
                    Code::InvalidArg,
                    "Invalid offset for shared memory region: 'r'".to_string()
                )
            );
        }
        assert_eq!(err(shm.input("x", "r", 31, 2)), past_end);
        assert_eq!(
            err(shm.input("x", "r", 4, usize::MAX)).1,
            "Integer overflow detected: byte_size (18446744073709551615) + offset (4) exceeds \
             maximum value (18446744073709551615) for region 'r'"
        );
        assert_eq!(
            err(shm.input("x", "nope", 0, 4)),
            (
                Code::NotFound,
                "Unable to find shared memory region: 'nope'".to_string()
            )
        );
        let e = shm.output("y", "nope", 0, 8).err().unwrap();
        assert_eq!(e.code, Code::NotFound);
        let e = shm.output("y", "r", 28, 8).err().unwrap();
        assert_eq!((e.code, e.message), past_end);
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
        let e = write_outputs(&resp, &req).unwrap_err();
        assert_eq!(e.code, Code::Internal);
        assert_eq!(
            e.message,
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
        let e = shm
            .register_system("missing", "/tern_no_such_object_here", 0, 1)
            .unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                Code::Internal,
                "Unable to open shared memory region: '/tern_no_such_object_here'"
            )
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn keys_are_checked_as_current_triton_does() {
        let shm = SharedMemory::new(true);
        let (key, path) = object(16);
        let err = |name: &str, key: &str| {
            let e = shm.register_system(name, key, 0, 8).unwrap_err();
            (e.code, e.message)
        };
        for bad in ["", "/", "///"] {
            assert_eq!(
                err("r", bad),
                (
                    Code::InvalidArg,
                    format!("cannot register shared memory region 'r' - invalid shm key '{bad}'")
                )
            );
        }
        for reserved in [
            "/triton_python_backend_shm_region_7",
            "//triton_python_backend_shm_region_x",
        ] {
            assert_eq!(
                err("r", reserved),
                (
                    Code::InvalidArg,
                    format!(
                        "cannot register shared memory region 'r' with key '{reserved}' as the key \
                         contains the reserved prefix 'triton_python_backend_shm_region_'"
                    )
                )
            );
        }
        // What shm_open refuses: Triton's INTERNAL "Unable to open".
        for refused in ["/../etc", "/a/b", "/..", "."] {
            assert_eq!(
                err("r", refused),
                (
                    Code::Internal,
                    format!("Unable to open shared memory region: '{refused}'")
                )
            );
        }
        // Leading slashes are skipped, as glibc does; no slash at all works too.
        shm.register_system("r", &format!("//{}", &key[1..]), 0, 8)
            .unwrap();
        shm.register_system("r2", &key[1..], 8, 8).unwrap();
        // The key is checked before the name: a taken name with a bad key
        // gets the key's error; with a good key, the name's.
        assert_eq!(err("r", "").0, Code::InvalidArg);
        assert_eq!(err("r", "/nope_not_there").0, Code::AlreadyExists);
        assert_eq!(err("r", &key).0, Code::AlreadyExists);
        shm.unregister(Kind::System, None).unwrap();
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
