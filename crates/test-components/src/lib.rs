//! Paths of the test plugins compiled to WebAssembly components by this
//! crate's build script (see `build.rs`); for Rust tests only.

include!(concat!(env!("OUT_DIR"), "/components.rs"));
