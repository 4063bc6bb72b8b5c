//! The sandbox's fork identity: written to `<identity dir>/fork` as shell-style
//! `KEY=value` lines, exported to later processes, and mixed into the kernel's entropy.

use std::io::Write;
use std::path::Path;

use proto::agent::{AgentError, Identity};

use super::errors::{invalid, io_error};

const MAX_SEED: usize = 4096;
const MAX_ID: usize = 256;

fn check_id(what: &str, v: &str) -> Result<(), AgentError> {
    let ok = v.len() <= MAX_ID
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
    ok.then_some(()).ok_or_else(|| {
        invalid(format!(
            "{what} {v:?} must be up to {MAX_ID} of [A-Za-z0-9-_.:]"
        ))
    })
}

pub fn validate(id: &Identity) -> Result<(), AgentError> {
    check_id("sandbox id", &id.sandbox_id)?;
    if let Some(p) = &id.parent_snapshot_id {
        check_id("parent snapshot id", p)?;
    }
    if id.seed.len() > MAX_SEED {
        return Err(invalid(format!("seed is longer than {MAX_SEED} bytes")));
    }
    if id
        .env
        .iter()
        .any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
    {
        return Err(invalid("invalid environment variable in identity"));
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The variables that describe the identity itself.
fn fork_vars(id: &Identity) -> Vec<(String, String)> {
    let mut env = vec![
        ("SANDFORK_SANDBOX_ID".to_string(), id.sandbox_id.clone()),
        ("SANDFORK_FORK_INDEX".to_string(), id.fork_index.to_string()),
        ("SANDFORK_FORK_SEED".to_string(), hex(&id.seed)),
    ];
    if let Some(p) = &id.parent_snapshot_id {
        env.push(("SANDFORK_PARENT_SNAPSHOT_ID".to_string(), p.clone()));
    }
    env
}

/// The variables every process started after `SetIdentity` sees.
pub fn env_of(id: &Identity) -> Vec<(String, String)> {
    fork_vars(id)
        .into_iter()
        .chain(id.env.iter().cloned())
        .collect()
}

/// Writes `dir/fork` atomically and reseeds `/dev/urandom` (best effort).
pub fn apply(id: &Identity, dir: &Path) -> Result<(), AgentError> {
    validate(id)?;
    let file = dir.join("fork");
    let what = file.to_string_lossy().into_owned();
    std::fs::create_dir_all(dir).map_err(|e| io_error(&what, &e))?;
    let body: String = fork_vars(id)
        .iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect();
    let tmp = dir.join(".fork.tmp");
    std::fs::write(&tmp, body)
        .and_then(|()| std::fs::rename(&tmp, &file))
        .map_err(|e| io_error(&what, &e))?;
    if !id.seed.is_empty() {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/urandom")
            .and_then(|mut f| f.write_all(&id.seed));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample() -> Identity {
        Identity {
            sandbox_id: "sb-1".into(),
            fork_index: 2,
            seed: vec![0xde, 0xad],
            parent_snapshot_id: None,
            env: vec![("X".into(), "1".into())],
        }
    }

    #[test]
    fn writes_the_fork_file() {
        let dir = tempfile::tempdir().unwrap();
        apply(&sample(), dir.path()).unwrap();
        let body = std::fs::read_to_string(dir.path().join("fork")).unwrap();
        assert_eq!(
            body,
            "SANDFORK_SANDBOX_ID=sb-1\nSANDFORK_FORK_INDEX=2\nSANDFORK_FORK_SEED=dead\n"
        );
    }

    #[test]
    fn rejects_injection() {
        let bad = Identity {
            sandbox_id: "a\nB=c".into(),
            ..sample()
        };
        assert!(validate(&bad).is_err());
    }
}
