//! Labels: free-form key/value tags on sandboxes and snapshots, with the same rules
//! wherever they are given (create, update, fork, checkpoint).

use std::collections::BTreeMap;

/// Most labels one sandbox or snapshot carries.
pub const MAX_LABELS: usize = 64;
/// Longest label key.
pub const MAX_KEY: usize = 63;
/// Longest label value, in characters.
pub const MAX_VALUE: usize = 256;

/// A label that breaks the rules, in a sentence naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LabelError(pub String);

/// A key: 1 to 63 ASCII letters, digits and `.`, `_`, `-`, `/`.
pub fn check_key(key: &str) -> Result<(), LabelError> {
    let ok = !key.is_empty()
        && key.len() <= MAX_KEY
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(LabelError(format!(
            "Label key {key:?}: use 1 to {MAX_KEY} letters, digits, '.', '_', '-' or '/'"
        )))
    }
}

/// A value: at most 256 characters, none of them control characters.
pub fn check_value(key: &str, value: &str) -> Result<(), LabelError> {
    if value.chars().count() > MAX_VALUE || value.chars().any(char::is_control) {
        return Err(LabelError(format!(
            "Label {key}: its value must be at most {MAX_VALUE} characters, none of them control characters"
        )));
    }
    Ok(())
}

/// A whole set of labels: every key and value, and at most [`MAX_LABELS`] of them.
pub fn check(labels: &BTreeMap<String, String>) -> Result<(), LabelError> {
    if labels.len() > MAX_LABELS {
        return Err(LabelError(format!(
            "At most {MAX_LABELS} labels, not {}",
            labels.len()
        )));
    }
    for (key, value) in labels {
        check_key(key)?;
        check_value(key, value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn keys_values_and_counts_follow_the_rules() {
        assert!(check(&map(&[("app.kubernetes.io/name", "web"), ("run_1", "")])).is_ok());
        for bad in ["", "a b", "é", &"k".repeat(64)] {
            assert!(check(&map(&[(bad, "v")])).is_err(), "{bad:?}");
        }
        assert!(check(&map(&[("k", "line\nbreak")])).is_err());
        assert!(check(&map(&[("k", &"v".repeat(257))])).is_err());
        assert!(
            check(&map(&[("k", &"é".repeat(256))])).is_ok(),
            "characters, not bytes"
        );
        let many: BTreeMap<String, String> =
            (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(check(&many).unwrap_err().0.contains("At most 64 labels"));
    }
}
