//! PyTorch backend (`backend: "pytorch"`, `platform: "pytorch_libtorch"`,
//! default file `model.pt`): TorchScript modules through LibTorch with `tch`,
//! following Triton's PyTorch backend — its naming rules ([`naming`]), its
//! parameters ([`params`]), its type table and its error texts — with a few
//! gaps closed (see docs/configuration.md, "PyTorch models").
//!
//! One module per instance (or per device with `ENABLE_WEIGHT_SHARING`);
//! a batch runs as one `forward` call with the requests' inputs gathered
//! along the batch dimension and the outputs split back per request.

#[cfg(feature = "libtorch")]
mod backend;
#[cfg(feature = "libtorch")]
pub mod convert;
pub mod naming;
pub mod params;
#[cfg(feature = "libtorch")]
pub mod shim;

#[cfg(feature = "libtorch")]
pub use backend::{status, TorchBackend, LIBTORCH_VERSION};
