//! Identifiers of sandboxes and snapshots.

/// A new id: `prefix`, a dash and 16 random hex digits.
pub fn random_id(prefix: &str) -> String {
    let mut b = [0u8; 8];
    // A failing system RNG leaves zeros; the time keeps ids distinct regardless.
    let _ = getrandom::getrandom(&mut b);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!(
        "{prefix}-{:016x}",
        u64::from_le_bytes(b) ^ t.rotate_left(32)
    )
}
