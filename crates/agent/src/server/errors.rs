//! Maps OS errors to the protocol's error kinds, with messages naming the path.

use std::io;

use nix::errno::Errno;
use proto::agent::{AgentError, ErrorKind};

pub fn kind_of(e: &io::Error) -> ErrorKind {
    match e.raw_os_error().map(Errno::from_raw) {
        Some(Errno::ENOENT) => ErrorKind::NotFound,
        Some(Errno::EACCES | Errno::EPERM | Errno::EROFS) => ErrorKind::PermissionDenied,
        // A directory in the way (or not empty): the host answers both as a conflict.
        Some(Errno::EISDIR | Errno::ENOTEMPTY) => ErrorKind::IsADirectory,
        Some(Errno::ENOTDIR) => ErrorKind::NotADirectory,
        Some(Errno::EEXIST) => ErrorKind::AlreadyExists,
        Some(Errno::EINVAL | Errno::ENAMETOOLONG | Errno::ELOOP) => ErrorKind::InvalidInput,
        Some(Errno::EFBIG) => ErrorKind::TooLarge,
        _ => ErrorKind::Other,
    }
}

/// `"{what}: {description}"`, e.g. `"/bin/nope: no such file or directory"`.
pub fn io_error(what: &str, e: &io::Error) -> AgentError {
    let desc = match e.raw_os_error() {
        Some(code) => lowercase_first(Errno::from_raw(code).desc()),
        None => e.to_string(),
    };
    AgentError::new(kind_of(e), format!("{what}: {desc}"))
}

fn lowercase_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

pub fn invalid(message: impl Into<String>) -> AgentError {
    AgentError::new(ErrorKind::InvalidInput, message)
}

/// Checks a path from the host: absolute, no NUL, bounded length.
pub fn check_path(path: &str) -> Result<&std::path::Path, AgentError> {
    if !path.starts_with('/') || path.contains('\0') || path.len() > 4096 {
        return Err(invalid(format!(
            "path {path:?} must be absolute, without NUL bytes"
        )));
    }
    Ok(std::path::Path::new(path))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn maps_kinds_and_messages() {
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        let a = io_error("/bin/nope", &e);
        assert_eq!(a.kind, ErrorKind::NotFound);
        assert_eq!(a.message, "/bin/nope: no such file or directory");
        assert_eq!(
            kind_of(&io::Error::from_raw_os_error(libc::EISDIR)),
            ErrorKind::IsADirectory
        );
        assert!(check_path("relative").is_err());
        assert!(check_path("/a\0b").is_err());
        assert!(check_path("/ok").is_ok());
    }
}
