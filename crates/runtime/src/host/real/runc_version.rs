//! Which runc runs sandboxes, and whether it has the container-escape fixes sandfork
//! relies on: the leaked-fd breakout of 2024 (CVE-2024-21626, fixed in 1.1.12), the mount
//! races of 2024 (CVE-2024-45310, 1.1.14) and 2025 (CVE-2025-31133, -52565, -52881: masked
//! paths, /dev/console and procfs writes; fixed in 1.2.8, 1.3.3 and 1.4.0). `scripts/setup`
//! builds one into /usr/local/sbin when the system's is older (Debian 12 ships 1.1.5).

use std::path::Path;
use std::process::Command;

use crate::error::{Error, Result};

/// Where setup installs its runc; preferred over the system's.
const LOCAL: &str = "/usr/local/sbin/runc";

/// The runc binary to run: `SANDFORK_RUNC`, else /usr/local/sbin/runc when present, else
/// `runc` from `PATH`.
pub fn binary() -> std::ffi::OsString {
    if let Some(p) = std::env::var_os("SANDFORK_RUNC") {
        return p;
    }
    if Path::new(LOCAL).exists() {
        return LOCAL.into();
    }
    "runc".into()
}

/// Whether runc version `v` (`major.minor.patch`) has every fix above.
pub fn has_fixes(v: (u32, u32, u32)) -> bool {
    match v {
        (1, 2, p) => p >= 8,
        (1, 3, p) => p >= 3,
        (1, minor, _) => minor >= 4,
        (major, _, _) => major >= 2,
    }
}

/// Parses the version out of `runc --version` ("runc version 1.3.6+ds1" and more lines).
pub fn parse(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.lines().next()?.strip_prefix("runc version ")?;
    let v = v
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()?;
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// Refuses to run sandboxes with a runc that lacks a fix (the daemon checks at start).
pub fn check() -> Result<()> {
    let bin = binary();
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .map_err(|e| Error::Command {
            command: format!("{} --version", bin.to_string_lossy()),
            detail: e.to_string(),
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    match parse(&text) {
        Some(v) if has_fixes(v) => Ok(()),
        found => {
            Err(Error::Unsupported(format!(
            "{} is runc {}, which lacks container-escape fixes (CVE-2024-21626, CVE-2024-45310, \
             CVE-2025-31133/52565/52881): sandfork needs runc 1.2.8, 1.3.3, 1.4.0 or newer \
             (scripts/setup builds one into {LOCAL}; SANDFORK_RUNC names another)",
            bin.to_string_lossy(),
            found.map_or_else(|| "of an unknown version".into(), |(a, b, c)| format!("{a}.{b}.{c}"))
        )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_the_fixed_ones_pass() {
        assert_eq!(
            parse("runc version 1.3.6+ds1\ncommit: x\n"),
            Some((1, 3, 6))
        );
        assert_eq!(parse("runc version 1.1.5+ds1\n"), Some((1, 1, 5)));
        assert_eq!(parse("runc version 1.4.0-rc.3\n"), Some((1, 4, 0)));
        assert_eq!(parse("crun version 1.8\n"), None);
        for ok in [(1, 2, 8), (1, 3, 3), (1, 3, 6), (1, 4, 0), (2, 0, 0)] {
            assert!(has_fixes(ok), "{ok:?}");
        }
        for bad in [(1, 1, 5), (1, 1, 15), (1, 2, 7), (1, 3, 2), (1, 0, 0)] {
            assert!(!has_fixes(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_runc_in_use_has_the_fixes() {
        check().unwrap();
    }
}
