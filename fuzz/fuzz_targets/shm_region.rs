//! Shared-memory region descriptors and parameters: what a client sends to
//! register a system region (name, key, offset, byte size:
//! `SharedMemory::register_system`) and the `shared_memory_region` /
//! `_offset` / `_byte_size` parameters of an input or output
//! (`tern_memory::shm::parameters`, `SharedMemory::input`,
//! `output_target`, `write_outputs`), against a real registered region.
//!
//! Invariants: whatever is accepted lies inside its region (a registered
//! region inside its object, an input's bytes and an output's target inside
//! the region); data written to an accepted target reads back unchanged;
//! the parameters read back are the ones given.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tern_core::{DataType, InferResponse, Parameter, Parameters, RequestedOutput, Tensor};
use tern_fuzz::{shm as registry, REGION, REGION_BYTES};
use tern_memory::shm::{self, Kind, SharedMemory};

#[derive(Arbitrary, Debug)]
enum Value {
    Bool(bool),
    Int(i64),
    Double(f64),
    String(String),
}

#[derive(Arbitrary, Debug)]
enum Key {
    /// The fuzz object, with this many leading slashes.
    Ours(u8),
    /// Any other key (not opened when it names an existing object).
    Other(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    register: Option<(String, Key, u64, u64)>,
    params: Vec<(u8, Value)>,
    region_name: bool,
    output: Vec<u8>,
}

/// The parameter keys, so that most inputs use the ones that matter.
const KEYS: [&str; 5] = [
    "shared_memory_region",
    "shared_memory_offset",
    "shared_memory_byte_size",
    "shared_memory_other",
    "binary_data",
];

/// Size of the object registration is tried against.
const OBJECT_BYTES: u64 = 100;

fuzz_target!(|input: Input| {
    if let Some((name, key, offset, byte_size)) = &input.register {
        register(name, key, *offset, *byte_size);
    }
    let mut params = Parameters::new();
    for (k, v) in &input.params {
        let p = match v {
            Value::Bool(b) => Parameter::Bool(*b),
            Value::Int(i) => Parameter::Int(*i),
            Value::Double(d) => Parameter::Double(*d),
            Value::String(s) => Parameter::String(s.clone()),
        };
        params.insert(KEYS[usize::from(*k) % KEYS.len()].into(), p);
    }
    if input.region_name {
        params.insert(
            "shared_memory_region".into(),
            Parameter::String(REGION.into()),
        );
    }
    let shm = registry();
    let Ok(found) = shm::parameters(&params, "input 'x'") else {
        return;
    };
    let Some((region, offset, size)) = found else {
        assert!(!params.contains_key("shared_memory_region"));
        return;
    };
    assert_eq!(
        params.get("shared_memory_region"),
        Some(&Parameter::String(region.clone()))
    );
    assert_eq!(
        params.get("shared_memory_byte_size"),
        Some(&Parameter::Int(size as i64))
    );
    if let Ok(data) = shm.input("x", &region, offset, size) {
        assert_eq!(region, REGION);
        assert_eq!(data.len(), size);
        assert!(offset + size <= REGION_BYTES);
    }
    let Ok(Some(target)) = shm.output_target("y", &params, false) else {
        return;
    };
    assert!(target.offset + target.byte_size <= REGION_BYTES);
    let requested = [RequestedOutput {
        name: "y".into(),
        shm: Some(target.clone()),
        ..Default::default()
    }];
    let resp = InferResponse {
        outputs: vec![Tensor::new(
            "y",
            DataType::Uint8,
            vec![input.output.len() as i64],
            input.output.clone(),
        )],
        ..Default::default()
    };
    if shm::write_outputs(&resp, &requested).is_ok() {
        assert!(input.output.len() <= target.byte_size);
        let back = shm
            .input("y", REGION, target.offset, input.output.len())
            .expect("read back what was written");
        assert_eq!(&back[..], &input.output[..]);
    }
});

/// Registers `[offset, offset+byte_size)` of a fresh object (or of the key
/// given, when it names no existing object) in a registry of its own.
fn register(name: &str, key: &Key, offset: u64, byte_size: u64) {
    let object = format!("tern_fuzz_reg_{}", std::process::id());
    let key = match key {
        Key::Ours(slashes) => format!("{}{object}", "/".repeat(usize::from(*slashes % 4))),
        Key::Other(k) => {
            let file = k.trim_start_matches('/');
            let refused_before_open = file.is_empty()
                || file.contains('/')
                || file == "."
                || file == ".."
                || file.contains('\0');
            if !refused_before_open && std::path::Path::new("/dev/shm").join(file).exists() {
                return;
            }
            k.clone()
        }
    };
    let path = std::path::Path::new("/dev/shm").join(&object);
    std::fs::write(&path, [7u8; OBJECT_BYTES as usize]).expect("/dev/shm object");
    let shm = SharedMemory::new(true);
    let result = shm.register_system(name, &key, offset, byte_size);
    let _ = std::fs::remove_file(&path);
    if result.is_err() {
        return;
    }
    assert!(byte_size > 0 && offset + byte_size <= OBJECT_BYTES);
    let status = shm.status(Kind::System, Some(name)).expect("registered");
    assert_eq!(status.len(), 1);
    assert_eq!((status[0].offset, status[0].byte_size), (offset, byte_size));
    let data = shm
        .input("x", name, 0, byte_size as usize)
        .expect("the whole region reads");
    assert!(data.iter().all(|&b| b == 7));
    assert!(shm.input("x", name, 0, byte_size as usize + 1).is_err());
    shm.unregister(Kind::System, Some(name))
        .expect("unregister");
}
