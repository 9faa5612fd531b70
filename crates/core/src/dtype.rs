//! The one table of tensor data types: wire names (`"FP32"`), config enum
//! values (`TYPE_FP32`) and element sizes.

use crate::config::pb;
use crate::error::{Error, Result};

/// A tensor element type, named as on the KServe v2 wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `BOOL`.
    Bool,
    /// `UINT8`.
    Uint8,
    /// `UINT16`.
    Uint16,
    /// `UINT32`.
    Uint32,
    /// `UINT64`.
    Uint64,
    /// `INT8`.
    Int8,
    /// `INT16`.
    Int16,
    /// `INT32`.
    Int32,
    /// `INT64`.
    Int64,
    /// `FP16`.
    Fp16,
    /// `FP32`.
    Fp32,
    /// `FP64`.
    Fp64,
    /// `BF16`.
    Bf16,
    /// Variable-length bytes; stored as 4-byte little-endian length + bytes per element.
    Bytes,
}

/// (type, wire name, config enum) — the single source of truth for conversions.
const TABLE: &[(DataType, &str, pb::DataType)] = &[
    (DataType::Bool, "BOOL", pb::DataType::TypeBool),
    (DataType::Uint8, "UINT8", pb::DataType::TypeUint8),
    (DataType::Uint16, "UINT16", pb::DataType::TypeUint16),
    (DataType::Uint32, "UINT32", pb::DataType::TypeUint32),
    (DataType::Uint64, "UINT64", pb::DataType::TypeUint64),
    (DataType::Int8, "INT8", pb::DataType::TypeInt8),
    (DataType::Int16, "INT16", pb::DataType::TypeInt16),
    (DataType::Int32, "INT32", pb::DataType::TypeInt32),
    (DataType::Int64, "INT64", pb::DataType::TypeInt64),
    (DataType::Fp16, "FP16", pb::DataType::TypeFp16),
    (DataType::Fp32, "FP32", pb::DataType::TypeFp32),
    (DataType::Fp64, "FP64", pb::DataType::TypeFp64),
    (DataType::Bf16, "BF16", pb::DataType::TypeBf16),
    (DataType::Bytes, "BYTES", pb::DataType::TypeString),
];

impl DataType {
    /// Every data type, in table order.
    pub fn all() -> impl Iterator<Item = DataType> {
        TABLE.iter().map(|e| e.0)
    }

    /// Parses a wire name such as `"FP32"`.
    pub fn from_wire(name: &str) -> Option<DataType> {
        TABLE.iter().find(|e| e.1 == name).map(|e| e.0)
    }

    /// The wire name, e.g. `"FP32"`.
    pub fn wire_name(self) -> &'static str {
        TABLE
            .iter()
            .find(|e| e.0 == self)
            .map(|e| e.1)
            .unwrap_or("INVALID")
    }

    /// Converts a config enum value (`TYPE_FP32`); `TYPE_INVALID` and unknown values fail.
    pub fn from_config(value: i32) -> Result<DataType> {
        TABLE
            .iter()
            .find(|e| e.2 as i32 == value)
            .map(|e| e.0)
            .ok_or_else(|| {
                Error::invalid_arg(format!("unsupported data type {}", config_name(value)))
            })
    }

    /// The config enum value for this type.
    pub fn to_config(self) -> pb::DataType {
        TABLE
            .iter()
            .find(|e| e.0 == self)
            .map(|e| e.2)
            .unwrap_or(pb::DataType::TypeInvalid)
    }

    /// Size of one element in bytes; `None` for BYTES.
    pub fn size(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }
}

/// The config spelling (`TYPE_FP32`) of a raw enum value, for messages.
pub fn config_name(value: i32) -> String {
    pb::DataType::try_from(value)
        .map(|d| d.as_str_name().to_string())
        .unwrap_or_else(|_| format!("TYPE_<{value}>"))
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.wire_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for dt in DataType::all() {
            assert_eq!(DataType::from_wire(dt.wire_name()), Some(dt));
            assert_eq!(DataType::from_config(dt.to_config() as i32).unwrap(), dt);
        }
        assert_eq!(DataType::from_wire("STRING"), None);
        assert!(DataType::from_config(0).is_err());
        assert_eq!(config_name(11), "TYPE_FP32");
    }
}
