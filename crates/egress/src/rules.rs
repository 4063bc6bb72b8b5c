//! Egress list entries: an address or CIDR (left to the caller's address type), a
//! hostname, or a wildcard (`*.example.com`), and how a queried name meets the lists.

use std::net::IpAddr;

/// Longest hostname in presentation form (RFC 1035, less the root's dot).
const MAX_NAME: usize = 253;
/// Longest label.
const MAX_LABEL: usize = 63;

/// Why an entry of an egress list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid egress entry {entry:?}: {reason}")]
pub struct RuleError {
    pub entry: String,
    pub reason: String,
}

/// One entry of `allow_out` or `deny_out`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// An address or CIDR, as written: the caller parses it into its own type.
    Address(String),
    /// A hostname or wildcard.
    Name(NamePattern),
}

/// A hostname rule, lowercased and without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NamePattern {
    /// Exactly this name.
    Exact(String),
    /// `*.suffix`: any name below `suffix` (not `suffix` itself), at any depth.
    Below(String),
}

impl NamePattern {
    /// Whether `name` (lowercase, no trailing dot) matches.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            NamePattern::Exact(n) => n == name,
            NamePattern::Below(suffix) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }
}

impl std::fmt::Display for NamePattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NamePattern::Exact(n) => f.write_str(n),
            NamePattern::Below(s) => write!(f, "*.{s}"),
        }
    }
}

/// Classifies and checks one entry. Anything made of digits, dots, colons and a slash
/// is an address (the caller's parser names what is wrong with it); the rest must be a
/// hostname or `*.` followed by one.
pub fn parse_entry(raw: &str) -> Result<Entry, RuleError> {
    let err = |reason: &str| RuleError {
        entry: raw.to_owned(),
        reason: reason.to_owned(),
    };
    let s = raw.trim();
    if s.is_empty() {
        return Err(err("empty entry"));
    }
    let addressy = s
        .chars()
        .all(|c| c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '/'))
        && (s.contains('/') || s.contains(':') || s.parse::<IpAddr>().is_ok() || numeric(s));
    if addressy {
        return Ok(Entry::Address(s.to_owned()));
    }
    if !s.is_ascii() {
        return Err(err(
            "hostnames must be ASCII: write an internationalized name in its xn-- form",
        ));
    }
    let lower = s.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    let (wild, base) = match name.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, name),
    };
    if base == "*" || name == "*" {
        return Err(err(
            "a lone wildcard would match every name: allow 0.0.0.0/0, or leave allow_out empty",
        ));
    }
    if base.contains('*') {
        return Err(err(
            "a wildcard may only be the whole first label, as in *.example.com",
        ));
    }
    check_hostname(base).map_err(|r| err(&r))?;
    if numeric(base.rsplit('.').next().unwrap_or_default()) {
        return Err(err(
            "neither an address nor a hostname (a hostname's last label is not all digits)",
        ));
    }
    Ok(Entry::Name(if wild {
        NamePattern::Below(base.to_owned())
    } else {
        NamePattern::Exact(base.to_owned())
    }))
}

fn numeric(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.')
}

fn check_hostname(name: &str) -> Result<(), String> {
    if name.len() > MAX_NAME {
        return Err(format!("longer than {MAX_NAME} characters"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label (two dots in a row, or a leading dot)".into());
        }
        if label.len() > MAX_LABEL {
            return Err(format!(
                "label {label:?} is longer than {MAX_LABEL} characters"
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!(
                "character {c:?} is not allowed in a hostname (letters, digits, '-' and '_')"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label {label:?} starts or ends with '-'"));
        }
    }
    Ok(())
}

/// What the name lists say of a queried name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A deny pattern matches (deny wins over allow).
    Denied,
    /// An allow pattern matches.
    Allowed,
    /// No pattern matches.
    Unlisted,
}

/// The name patterns of one sandbox's egress lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameRules {
    pub allow: Vec<NamePattern>,
    pub deny: Vec<NamePattern>,
}

impl NameRules {
    /// Whether there is any name rule at all (the resolver is needed).
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// What the lists say of `name` (any case, with or without the trailing dot).
    pub fn verdict(&self, name: &str) -> Verdict {
        let lower = name.to_ascii_lowercase();
        let name = lower.strip_suffix('.').unwrap_or(&lower);
        if self.deny.iter().any(|p| p.matches(name)) {
            Verdict::Denied
        } else if self.allow.iter().any(|p| p.matches(name)) {
            Verdict::Allowed
        } else {
            Verdict::Unlisted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> NamePattern {
        match parse_entry(s).unwrap() {
            Entry::Name(p) => p,
            other => panic!("{s}: {other:?}"),
        }
    }

    fn reason(s: &str) -> String {
        parse_entry(s).unwrap_err().reason
    }

    #[test]
    fn addresses_are_left_to_the_caller() {
        for s in [
            "1.2.3.4",
            "10.0.0.0/8",
            "::1",
            "2001:db8::/32",
            "300.1.1.1",
            "1.2.3",
        ] {
            assert_eq!(parse_entry(s).unwrap(), Entry::Address(s.into()), "{s}");
        }
    }

    #[test]
    fn names_and_wildcards_are_normalized() {
        assert_eq!(
            name("API.Example.com."),
            NamePattern::Exact("api.example.com".into())
        );
        assert_eq!(
            name("*.Example.COM"),
            NamePattern::Below("example.com".into())
        );
        assert_eq!(name("localhost"), NamePattern::Exact("localhost".into()));
        assert_eq!(
            name("_dmarc.example.com"),
            NamePattern::Exact("_dmarc.example.com".into())
        );
        assert_eq!(
            name("deadbeef.cafe"),
            NamePattern::Exact("deadbeef.cafe".into())
        );
    }

    #[test]
    fn bad_patterns_say_why() {
        assert!(reason("").contains("empty"));
        assert!(reason("*").contains("every name"));
        assert!(reason("*.").contains("every name"));
        assert!(reason("a.*.example.com").contains("first label"));
        assert!(reason("*example.com").contains("first label"));
        assert!(reason("**.example.com").contains("first label"));
        assert!(reason("exa mple.com").contains("' '"));
        assert!(reason("a..b").contains("empty label"));
        assert!(reason("-a.com").contains("'-'"));
        assert!(reason(&format!("{}.com", "a".repeat(64))).contains("longer than 63"));
        assert!(reason(&format!("{}a", "a.".repeat(127))).contains("253"));
        assert!(reason("bücher.de").contains("xn--"));
        assert!(reason("host.123").contains("last label"));
        assert!(
            reason("http://example.com").contains("':'")
                || reason("http://example.com").contains("'/'")
        );
    }

    #[test]
    fn wildcards_match_below_not_at_the_name() {
        let p = name("*.example.com");
        assert!(p.matches("a.example.com"));
        assert!(p.matches("a.b.example.com"));
        assert!(!p.matches("example.com"));
        assert!(!p.matches("badexample.com"));
        assert!(!p.matches(".example.com"));
        let e = name("example.com");
        assert!(e.matches("example.com"));
        assert!(!e.matches("a.example.com"));
    }

    #[test]
    fn deny_wins_and_case_is_ignored() {
        let rules = NameRules {
            allow: vec![name("*.example.com")],
            deny: vec![name("bad.example.com")],
        };
        assert_eq!(rules.verdict("Good.Example.com."), Verdict::Allowed);
        assert_eq!(rules.verdict("BAD.example.com"), Verdict::Denied);
        assert_eq!(rules.verdict("example.org"), Verdict::Unlisted);
    }
}
