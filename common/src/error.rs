//! Typed errors of `common`. Every variant carries what a user needs to find
//! the fault: the file, the line and the field where there is one.

use std::path::PathBuf;

/// Errors raised while reading, validating or writing embshard's files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The reason is in the message, not in a source: a chain printed in
    /// full (`{:#}`) would name it twice.
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// A CSV record or field is malformed or out of range (`field` empty:
    /// the whole record or header).
    #[error("{path}:{line}: {}{message}", in_field(field))]
    Csv {
        path: PathBuf,
        line: u64,
        field: String,
        message: String,
    },
    /// A JSON or TOML file does not parse or does not have the expected shape.
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A JSON document parses but one of its values is invalid.
    #[error("{path}: {location}: {message}")]
    Invalid {
        path: PathBuf,
        /// Where in the document, e.g. `tasks[3].tables[7]`.
        location: String,
        message: String,
    },
    /// A task cannot be satisfied (for instance its tables cannot fit memory).
    #[error("{context}: {message}")]
    Infeasible { context: String, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A setting that cannot work: which one, and why. Its message names the
/// setting and its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidSetting {
    /// The setting, as a configuration file writes it (`train.lambda`,
    /// `data.suites[2].devices`).
    pub key: String,
    pub message: String,
}

impl InvalidSetting {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> InvalidSetting {
        InvalidSetting {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            cause: source,
        }
    }
}

/// `field `name`: ` before a CSV error's message, nothing for a whole
/// record.
fn in_field(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("field `{field}`: ")
    }
}
