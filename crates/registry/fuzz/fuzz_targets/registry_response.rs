//! What a registry answers a pull, from a hostile registry:
//! - a manifest or index body (first byte even): parsed and checked as the pull does, or
//!   refused with an error, deterministically; every digest the pull would fetch (and so
//!   name a file in the blob store by) is `sha256:` and 64 lowercase hex digits, every
//!   declared size is one a descriptor of the body states, and the platforms an index is
//!   said to offer are bounded by the body;
//! - a `WWW-Authenticate` header (odd): a Bearer challenge's realm and service are taken
//!   from the header and no longer than it, anything else is no challenge; and a
//!   challenge written from any realm and service (quoted, escaped) reads back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use registry::fuzzing::{bearer_challenge, manifest, Plan};
use registry::Digest;

fn safe_digest(d: &Digest) {
    let s = d.as_str();
    let hex = s.strip_prefix("sha256:").expect("sha256 digest");
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "digest {s:?}"
    );
}

fn check_manifest(body: &[u8]) {
    let plan = manifest(body);
    assert_eq!(plan, manifest(body), "not deterministic");
    match plan {
        Ok(Plan::Image { config, layers }) => {
            for (d, size) in std::iter::once(&config).chain(&layers) {
                safe_digest(d);
                assert!(*size <= i64::MAX as u64);
            }
        }
        Ok(Plan::Index { next, offered }) => {
            if let Some(d) = next {
                safe_digest(&d);
            }
            // At most 16 platforms named, each from the body: "os/arch, ".
            assert!(offered.len() <= body.len() + 16 * 3 + 4, "{offered}");
        }
        Err(_) => {}
    }
}

fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn check_challenge(header: &str) {
    if let Some((realm, service)) = bearer_challenge(header) {
        assert!(header
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("bearer"));
        assert!(realm.len() <= header.len());
        assert!(service.map_or(0, |s| s.len()) <= header.len());
    }
    // A challenge written from any two values reads them back.
    let (realm, service) = header.split_once('\n').unwrap_or((header, ""));
    let written = format!(
        "Bearer realm={},service={},scope={}",
        quote(realm),
        quote(service),
        quote("repository:x:pull")
    );
    assert_eq!(
        bearer_challenge(&written),
        Some((realm.to_string(), Some(service.to_string()))),
        "{written:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        check_manifest(rest);
    } else if let Ok(header) = std::str::from_utf8(rest) {
        check_challenge(header);
    }
});
