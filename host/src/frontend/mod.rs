//! Wire frontends. They only translate between their protocol and the core
//! types; validation and execution live in `core` and `scheduler`.

pub mod http;
