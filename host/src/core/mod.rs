//! Protocol-neutral inference types shared by every frontend and backend:
//! data types, tensors, requests, responses, parameters, and the one place
//! where requests are validated against a model's configuration.

pub mod bytes_tensor;
pub mod classification;
pub mod dtype;
pub mod request;
pub mod tensor;
pub mod validate;

pub use dtype::DataType;
pub use request::{InferRequest, InferResponse, Parameter, Parameters, RequestedOutput};
pub use tensor::Tensor;
