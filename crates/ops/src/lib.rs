//! Native kernels for plugins' pre- and post-processing, behind the
//! `tern:plugin/ops` WIT interface: an n-dimensional [`Array`] (row-major,
//! little-endian, shared bytes so reshapes copy nothing), tensor maths
//! ([`math`]), image decoding, colour conversion, resizing and
//! normalisation ([`image`]) and YOLO-style detection post-processing
//! ([`detect`]).
//!
//! The kernels know nothing about wasmtime: the plugin host (`tern-wasm`)
//! holds the arrays for a plugin, counts their bytes against its memory cap
//! and maps these functions onto the WIT interface. Every function checks
//! its arguments and returns [`tern_core::error::Error`] (`invalid-arg`, or
//! `unavailable` for a size over the caller's budget) instead of panicking.

pub mod array;
pub mod detect;
pub mod image;
pub mod math;

pub use array::Array;
