//! The machine-readable kinds of the API's errors: one list, from which the OpenAPI
//! document's `ErrorCode` schema, docs/api.md's table and both SDKs' code tables come
//! (`sdk/python/src/sandfork/_codes.py` and `sdk/typescript/src/codes.ts` are generated
//! from [`ErrorCode::ALL`] by this crate's tests: `SANDFORK_BLESS=1 cargo test -p
//! sandfork-api-types error_codes` writes them, and the test fails while they differ).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The kind of an API error, as its `code` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// A request the router cannot take (e.g. a method a route does not have).
    BadRequest,
    /// Malformed JSON, an unknown field, a bad value or query.
    InvalidArgument,
    /// The command could not start (e.g. no such program).
    ExecFailed,
    /// No credentials, or the wrong ones.
    Unauthorized,
    /// Credentials that do not open this (a port's access token of another sandbox).
    Forbidden,
    /// No such sandbox, image, snapshot, process, path or route.
    NotFound,
    /// The wrong lifecycle state, a name taken, a path that is a directory.
    Conflict,
    /// A wait ran out of time.
    TimedOut,
    /// A body over the daemon's limit, or an import past `max_import_bytes`.
    TooLarge,
    /// A combination that cannot work, or a feature sandfork lacks.
    Unsupported,
    /// Admission refused: the message names what is full.
    OverCapacity,
    /// Nothing answered on a sandbox's port.
    BadGateway,
    /// A registry was unreachable, refused the credentials, or sent what fails its digest.
    RegistryError,
    /// An object of the cluster's object store failed its hash.
    Integrity,
    /// A disk is full (the host's or the sandbox's own).
    InsufficientStorage,
    /// Shutting down, or the sandbox's agent is unreachable.
    Unavailable,
    /// The host failed (runc, CRIU, a disk).
    RuntimeError,
    /// A bug, or the state database failed.
    Internal,
}

impl ErrorCode {
    /// Every code, in the order of their statuses.
    pub const ALL: [ErrorCode; 18] = [
        ErrorCode::BadRequest,
        ErrorCode::InvalidArgument,
        ErrorCode::ExecFailed,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::TimedOut,
        ErrorCode::Conflict,
        ErrorCode::TooLarge,
        ErrorCode::Unsupported,
        ErrorCode::OverCapacity,
        ErrorCode::Internal,
        ErrorCode::RuntimeError,
        ErrorCode::BadGateway,
        ErrorCode::RegistryError,
        ErrorCode::Integrity,
        ErrorCode::Unavailable,
        ErrorCode::InsufficientStorage,
    ];

    /// The code as the wire says it.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::ExecFailed => "exec_failed",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::TimedOut => "timed_out",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::OverCapacity => "over_capacity",
            ErrorCode::BadGateway => "bad_gateway",
            ErrorCode::RegistryError => "registry_error",
            ErrorCode::Integrity => "integrity",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::RuntimeError => "runtime_error",
            ErrorCode::Internal => "internal",
        }
    }

    /// The HTTP status the daemon answers it with.
    pub const fn status(self) -> u16 {
        match self {
            ErrorCode::BadRequest | ErrorCode::InvalidArgument | ErrorCode::ExecFailed => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::TimedOut => 408,
            ErrorCode::Conflict => 409,
            ErrorCode::TooLarge => 413,
            ErrorCode::Unsupported => 422,
            ErrorCode::OverCapacity => 429,
            ErrorCode::Internal | ErrorCode::RuntimeError => 500,
            ErrorCode::BadGateway | ErrorCode::RegistryError | ErrorCode::Integrity => 502,
            ErrorCode::Unavailable => 503,
            ErrorCode::InsufficientStorage => 507,
        }
    }

    /// The code `s` names, if any.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn codes_round_trip_and_each_is_listed_once() {
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(c.as_str()), Some(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
        }
        let mut names: Vec<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }

    fn python() -> String {
        let mut out = String::from(
            "\"\"\"The API's error codes and the HTTP status of each. Generated from the daemon's\n\
             `api_types::ErrorCode` by `SANDFORK_BLESS=1 cargo test -p sandfork-api-types\n\
             error_codes`: do not edit.\"\"\"\n\nfrom typing import Dict\n\n\
             ERROR_STATUS: Dict[str, int] = {\n",
        );
        for c in ErrorCode::ALL {
            out.push_str(&format!("    \"{}\": {},\n", c.as_str(), c.status()));
        }
        out.push_str("}\n");
        out
    }

    fn typescript() -> String {
        let mut out = String::from(
            "/** The API's error codes and the HTTP status of each. Generated from the daemon's\n \
             * `api_types::ErrorCode` by `SANDFORK_BLESS=1 cargo test -p sandfork-api-types\n \
             * error_codes`: do not edit. */\n\nexport const ERROR_STATUS: Readonly<Record<string, number>> = {\n",
        );
        for c in ErrorCode::ALL {
            out.push_str(&format!("  {}: {},\n", c.as_str(), c.status()));
        }
        out.push_str("};\n");
        out
    }

    /// docs/api.md's table of errors names every code.
    #[test]
    fn the_api_docs_list_every_code() {
        let doc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/api.md");
        let doc = std::fs::read_to_string(doc).unwrap();
        for c in ErrorCode::ALL {
            let row = format!("| {} | `{}`", c.status(), c.as_str());
            let shared = format!("`{}` /", c.as_str());
            assert!(
                doc.contains(&row)
                    || doc.contains(&shared)
                    || doc.contains(&format!("/ `{}`", c.as_str())),
                "docs/api.md's error table lacks {} ({})",
                c.as_str(),
                c.status()
            );
        }
    }

    /// The SDKs' code tables are what this list makes of them.
    #[test]
    fn error_codes_are_generated_into_both_sdks() {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let files = [
            (repo.join("sdk/python/src/sandfork/_codes.py"), python()),
            (repo.join("sdk/typescript/src/codes.ts"), typescript()),
        ];
        let bless = std::env::var_os("SANDFORK_BLESS").is_some();
        for (path, want) in files {
            if bless {
                std::fs::write(&path, &want).unwrap();
            }
            let got = std::fs::read_to_string(&path).unwrap_or_default();
            assert_eq!(
                got,
                want,
                "{} is not what api_types::ErrorCode makes of it: SANDFORK_BLESS=1 cargo test -p sandfork-api-types error_codes",
                path.display()
            );
        }
    }
}
