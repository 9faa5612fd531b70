//! `config.pbtxt`: protobuf text format parsing, with errors that say
//! where and suggest the field meant, and rendering.

use prost_reflect::DynamicMessage;

use super::{model_config_descriptor, ModelConfig};
use crate::error::{Error, Result};

/// Parses the protobuf text format of a `config.pbtxt`.
///
/// Unknown fields and wrongly typed values are errors, never silently dropped.
pub fn parse_pbtxt(text: &str) -> Result<ModelConfig> {
    let (fixed, inserted) = add_list_colons(text);
    let msg = DynamicMessage::parse_text_format(model_config_descriptor(), &fixed)
        .map_err(|e| parse_error(&e, text, &inserted))?;
    msg.transcode_to::<ModelConfig>()
        .map_err(|e| Error::internal(format!("failed to convert parsed config: {e}")))
}

/// A parse error with where it is in the original text (`line 3, column 1`)
/// and, for a misspelt field or enum value, the closest valid name.
fn parse_error(
    e: &prost_reflect::text_format::ParseError,
    text: &str,
    inserted: &[usize],
) -> Error {
    use miette::Diagnostic;
    let at = e
        .labels()
        .and_then(|mut labels| labels.next())
        .map(|label| {
            // Offsets are in the text with the inserted colons.
            let offset = label.offset();
            let offset = offset - inserted.iter().filter(|&&p| p < offset).count();
            let before = &text[..offset.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!(" at line {line}, column {column}")
        })
        .unwrap_or_default();
    let message = e.to_string();
    let hint = suggestion(&message)
        .map(|s| format!(" (did you mean '{s}'?)"))
        .unwrap_or_default();
    Error::invalid_arg(format!("failed to parse config.pbtxt{at}: {message}{hint}"))
}

/// The valid name closest to the unknown one named in a parse error message
/// (`field 'X' not found for message 'M'`, `value 'X' was not found for enum 'E'`).
fn suggestion(message: &str) -> Option<String> {
    let quoted: Vec<&str> = message.split('\'').skip(1).step_by(2).collect();
    let (wrong, owner) = (*quoted.first()?, *quoted.get(1)?);
    let pool = model_config_descriptor().parent_pool().clone();
    let names: Vec<String> = if message.starts_with("field ") {
        pool.get_message_by_name(owner)?
            .fields()
            .map(|f| f.name().to_string())
            .collect()
    } else if message.starts_with("value ") {
        pool.get_enum_by_name(owner)?
            .values()
            .map(|v| v.name().to_string())
            .collect()
    } else {
        return None;
    };
    closest(wrong, &names)
}

/// The candidate most like `wrong`, if any is close enough to be a likely typo.
fn closest(wrong: &str, candidates: &[String]) -> Option<String> {
    let wrong_lower = wrong.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| {
            let score = strsim::jaro_winkler(&wrong_lower, &c.to_ascii_lowercase());
            (score, c)
        })
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c.clone())
}

/// Protobuf's text format lets a list of messages omit the colon
/// (`input [ { ... } ]`), and Triton configs rely on it; the parser we use
/// wants `input: [ ... ]`. Inserts the colon where a field name is directly
/// followed by `[`, leaving strings and comments alone; returns the text and
/// the byte offsets (in it) of the inserted colons.
pub(super) fn add_list_colons(text: &str) -> (String, Vec<usize>) {
    let mut inserted = Vec::new();
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    let mut last_significant: Option<char> = None;
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' => {
                out.push(c);
                while let Some(d) = chars.next() {
                    out.push(d);
                    if d == '\\' {
                        if let Some(e) = chars.next() {
                            out.push(e);
                        }
                    } else if d == c || d == '\n' {
                        break;
                    }
                }
                last_significant = Some(c);
            }
            '#' => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == '\n' {
                        break;
                    }
                }
            }
            '[' => {
                if last_significant.is_some_and(|p| p.is_ascii_alphanumeric() || p == '_') {
                    inserted.push(out.len());
                    out.push(':');
                }
                out.push(c);
                last_significant = Some(c);
            }
            c if c.is_whitespace() => out.push(c),
            c => {
                out.push(c);
                last_significant = Some(c);
            }
        }
    }
    (out, inserted)
}

/// Renders a config as protobuf text format (used in logs and docs).
pub fn to_pbtxt(config: &ModelConfig) -> String {
    let mut msg = DynamicMessage::new(model_config_descriptor());
    msg.transcode_from(config)
        .expect("prost message transcodes to its own descriptor");
    msg.to_text_format()
}
