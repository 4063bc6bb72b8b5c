//! How an error is told: one line with every cause, the same in logs, wire messages and
//! API answers.

/// `e` and its sources, joined by `: `.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("open the layer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_is_told_in_order() {
        let e = Outer(std::io::Error::other("disk gone"));
        assert_eq!(error_chain(&e), "open the layer: disk gone");
    }
}
