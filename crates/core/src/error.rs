//! The one error type of the server, carrying Triton's error codes.
//!
//! Every failure inside Tern becomes an [`Error`] with a [`Code`]; frontends map
//! it to their wire status in exactly one place each (the server's
//! `frontend::http::status_code` and `frontend::grpc::grpc_status`).

use std::fmt;

/// Triton's error codes (`TRITONSERVER_Error_Code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// An unknown or unexpected failure.
    Unknown,
    /// A bug or an unexpected condition inside the server or a backend.
    Internal,
    /// Something that was asked for does not exist.
    NotFound,
    /// The request or configuration is malformed or inconsistent.
    InvalidArg,
    /// The target exists but cannot serve right now (not ready, unloading, queue full).
    Unavailable,
    /// A feature Tern does not support (yet).
    Unsupported,
    /// The thing to create already exists.
    AlreadyExists,
    /// The request was cancelled.
    Cancelled,
}

impl Code {
    /// Triton's spelling of the code, as used in logs and repository index reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Unknown => "Unknown",
            Code::Internal => "Internal",
            Code::NotFound => "Not found",
            Code::InvalidArg => "Invalid argument",
            Code::Unavailable => "Unavailable",
            Code::Unsupported => "Unsupported",
            Code::AlreadyExists => "Already exists",
            Code::Cancelled => "Cancelled",
        }
    }
}

/// A failure with a Triton error code and a message saying what was wrong and where.
#[derive(Debug, Clone, thiserror::Error)]
pub struct Error {
    /// Triton error code.
    pub code: Code,
    /// Human-readable message, returned to clients verbatim.
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Builds an error with the given code.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }
    /// `INVALID_ARG`.
    pub fn invalid_arg(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArg, message)
    }
    /// `NOT_FOUND`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }
    /// `UNAVAILABLE`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }
    /// `UNSUPPORTED`.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(Code::Unsupported, message)
    }
    /// `ALREADY_EXISTS`.
    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(Code::AlreadyExists, message)
    }
    /// `INTERNAL`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// Prefixes the message with context (`"model 'x': "`), keeping the code.
    pub fn context(mut self, prefix: impl fmt::Display) -> Self {
        self.message = format!("{prefix}: {}", self.message);
        self
    }

    /// Names the model a failure is about: `model '<model>': <message>`.
    pub fn for_model(self, model: &str) -> Self {
        self.context(format_args!("model '{model}'"))
    }

    /// Names the ensemble a step failure happened in, as Triton does
    /// (`in ensemble '<ensemble>', <message>`, the step's code kept); which
    /// step and model failed goes to the log.
    pub fn in_step(self, ensemble: &str, step: usize, model: &str) -> Self {
        tracing::debug!(
            ensemble,
            step,
            model,
            "ensemble step failed: {}",
            self.message
        );
        Error::new(
            self.code,
            format!("in ensemble '{ensemble}', {}", self.message),
        )
    }
}

/// [`Error`]'s context helpers on a `Result`.
pub trait ResultExt<T> {
    /// [`Error::for_model`] on the error.
    fn for_model(self, model: &str) -> Result<T>;
    /// [`Error::context`] on the error.
    fn context(self, prefix: impl fmt::Display) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn for_model(self, model: &str) -> Result<T> {
        self.map_err(|e| e.for_model(model))
    }

    fn context(self, prefix: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.context(prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_and_step_context_name_where() {
        let e = Error::unavailable("gone").for_model("m");
        assert_eq!(
            (e.code, e.message.as_str()),
            (Code::Unavailable, "model 'm': gone")
        );
        let e = Error::internal("boom").in_step("ens", 2, "net");
        assert_eq!(e.message, "in ensemble 'ens', boom");
        let r: Result<()> = Err(Error::invalid_arg("bad"));
        assert_eq!(r.for_model("x").unwrap_err().message, "model 'x': bad");
    }

    #[test]
    fn context_keeps_code() {
        let e = Error::invalid_arg("bad").context("model 'm'");
        assert_eq!(e.code, Code::InvalidArg);
        assert_eq!(e.to_string(), "model 'm': bad");
    }
}
