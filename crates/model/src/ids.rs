//! Identifiers and the randomness behind them: one generator, whose failure is an error
//! (never zeros or a guess).

/// The system's random number generator failed.
#[derive(Debug, thiserror::Error)]
#[error("the system random number generator failed: {0}")]
pub struct IdError(#[from] getrandom::Error);

/// `N` bytes from the system's random number generator.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], IdError> {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b)?;
    Ok(b)
}

/// A new id: `prefix`, a dash and `2 * N` random lowercase hex digits.
pub fn random_id<const N: usize>(prefix: &str) -> Result<String, IdError> {
    let hex: String = random_bytes::<N>()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(format!("{prefix}-{hex}"))
}

/// A new sandbox id: `sb-` and 16 random hex digits.
pub fn new_sandbox_id() -> Result<String, IdError> {
    random_id::<8>("sb")
}

/// A new snapshot id: `snap-` and 16 random hex digits.
pub fn new_snapshot_id() -> Result<String, IdError> {
    random_id::<8>("snap")
}

/// Whether `id` looks like a snapshot id (so it can name files and refs safely).
pub fn valid_snapshot_id(id: &str) -> bool {
    id.len() > 5
        && id.len() <= 64
        && id.starts_with("snap-")
        && id[5..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_their_prefix_and_differ() {
        let a = new_sandbox_id().unwrap();
        assert!(a.starts_with("sb-") && a.len() == 19, "{a}");
        assert_ne!(a, new_sandbox_id().unwrap());
        assert_eq!(random_id::<3>("x").unwrap().len(), 8);
    }

    #[test]
    fn snapshot_ids_are_valid() {
        let id = new_snapshot_id().unwrap();
        assert!(valid_snapshot_id(&id), "{id}");
        assert_ne!(id, new_snapshot_id().unwrap());
        for bad in [
            "",
            "snap-",
            "sb-1",
            "snap-../x",
            "snap-a/b",
            &"snap-x".repeat(20),
        ] {
            assert!(!valid_snapshot_id(bad), "{bad}");
        }
    }
}
