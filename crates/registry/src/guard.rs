//! Where a registry may send the daemon, and to whom credentials go.
//!
//! A registry is hostile: its `WWW-Authenticate` challenge names the token service (the
//! realm) and its answers may redirect, and the daemon follows both from the host's own
//! network. So every connection of a pull is checked:
//!
//! - addresses in a guarded class (loopback, link-local with the cloud metadata address,
//!   private and other special-purpose ranges) are reached only when the registry itself
//!   is at an address of that same class (a loopback registry may use a loopback realm; a
//!   public one may send the daemon to no guarded address at all). Host names are checked
//!   after resolution, on every connection, so a name cannot be rebound onto one;
//! - a registry reached over TLS may not send the daemon to plain HTTP;
//! - credentials go to the registry's own host only (and, for a registry named by a
//!   domain, to that domain's hosts: `docker.io`'s token service is `auth.docker.io`),
//!   never to a realm or redirect target elsewhere; the HTTP client drops them on any
//!   redirect to another host.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::Url;

/// The guarded address classes: what a registry at a public address may not reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarded {
    Loopback,
    /// 169.254.0.0/16 (the cloud metadata address among them), fe80::/10.
    LinkLocal,
    /// RFC 1918, CGNAT, unique local IPv6.
    Private,
    /// Unspecified, "this network", benchmarking (198.18.0.0/15), documentation,
    /// multicast, broadcast, reserved.
    Special,
}

/// The guarded class of `ip`, if any (IPv4-mapped IPv6 addresses as their IPv4 address).
pub fn guarded(ip: IpAddr) -> Option<Guarded> {
    match ip {
        IpAddr::V4(v4) => guarded_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => guarded_v4(v4),
            None => guarded_v6(v6),
        },
    }
}

fn guarded_v4(ip: Ipv4Addr) -> Option<Guarded> {
    let o = ip.octets();
    if ip.is_loopback() {
        Some(Guarded::Loopback)
    } else if ip.is_link_local() {
        Some(Guarded::LinkLocal)
    } else if ip.is_private() || (o[0] == 100 && (o[1] & 0xc0) == 64) {
        Some(Guarded::Private)
    } else if o[0] == 0
        || o[0] >= 224
        || (o[0] == 198 && (o[1] & 0xfe) == 18)
        || ip.is_documentation()
        || (o[0] == 192 && o[1] == 0 && o[2] == 0)
    {
        Some(Guarded::Special)
    } else {
        None
    }
}

fn guarded_v6(ip: Ipv6Addr) -> Option<Guarded> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some(Guarded::Loopback)
    } else if first & 0xffc0 == 0xfe80 {
        Some(Guarded::LinkLocal)
    } else if first & 0xfe00 == 0xfc00 {
        Some(Guarded::Private)
    } else if ip.is_unspecified()
        || ip.is_multicast()
        || first == 0x2001 && ip.segments()[1] == 0xdb8
    {
        Some(Guarded::Special)
    } else {
        None
    }
}

/// What one pull may connect to: public addresses, and guarded ones of the registry's
/// own class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    registry: Option<Guarded>,
}

impl Reach {
    /// The reach of a registry at `addrs`: the class of the first guarded one, if any.
    pub fn of(addrs: &[IpAddr]) -> Reach {
        Reach {
            registry: addrs.iter().find_map(|a| guarded(*a)),
        }
    }

    pub fn allows(&self, ip: IpAddr) -> bool {
        match guarded(ip) {
            None => true,
            Some(class) => self.registry == Some(class),
        }
    }
}

/// A connection a registry asked for and the daemon refused (the message says why).
#[derive(Debug)]
pub struct Blocked(pub String);

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Blocked {}

/// Whether a request to `next` may be made after `previous` (the registry's base URL, or
/// the URL that redirected): http(s) only, never from TLS down to plain HTTP, and an
/// address literal only within `reach` (names are checked when resolved).
pub fn check_target(next: &Url, previous: &Url, reach: Reach) -> Result<(), Blocked> {
    if !matches!(next.scheme(), "http" | "https") {
        return Err(Blocked(format!("{next}: not an http(s) URL")));
    }
    if previous.scheme() == "https" && next.scheme() == "http" {
        return Err(Blocked(format!(
            "{next}: a registry reached over TLS may not send the daemon to plain HTTP"
        )));
    }
    let literal = match next.host() {
        Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
        Some(url::Host::Domain(_)) => None,
        None => return Err(Blocked(format!("{next}: no host"))),
    };
    match literal {
        Some(ip) if !reach.allows(ip) => Err(Blocked(refusal(next.as_str(), ip))),
        _ => Ok(()),
    }
}

fn refusal(what: &str, ip: IpAddr) -> String {
    let class = guarded(ip).map_or("guarded", |c| match c {
        Guarded::Loopback => "loopback",
        Guarded::LinkLocal => "link-local",
        Guarded::Private => "private",
        Guarded::Special => "special-purpose",
    });
    format!(
        "{what}: {ip} is a {class} address, which a registry not itself at such an address may not send the daemon to"
    )
}

/// The redirect policy of a pull: at most `max` redirects, each passing [`check_target`].
pub fn redirect_policy(reach: Reach, max: usize) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        let Some(previous) = attempt.previous().last().cloned() else {
            return attempt.follow();
        };
        if attempt.previous().len() > max {
            return attempt.error(Blocked(format!("more than {max} redirects")));
        }
        match check_target(attempt.url(), &previous, reach) {
            Ok(()) => attempt.follow(),
            Err(b) => attempt.error(b),
        }
    })
}

/// Resolves names for a pull, keeping only addresses within its reach.
pub struct Resolver {
    pub reach: Reach,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (reach, host) = (self.reach, name.as_str().to_string());
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept: Vec<SocketAddr> = all
                .iter()
                .filter(|a| reach.allows(a.ip()))
                .copied()
                .collect();
            match (kept.is_empty(), all.first()) {
                (true, Some(first)) => Err(Box::new(Blocked(refusal(&host, first.ip())))
                    as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// Whether credentials for the registry `name` (as references spell it: `docker.io`,
/// `ghcr.io`, `10.0.0.5:5000`), reached at `host`, may be sent to `url`: its host is the
/// registry's, or, for a registry named by a domain of at least two labels, a host under
/// that domain.
pub fn credentials_may_go_to(url: &Url, name: &str, host: &str) -> bool {
    let Some(target) = url
        .host_str()
        .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
    else {
        return false;
    };
    let bare = |s: &str| {
        let s = s.trim_start_matches('[');
        let s = match s.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') => h,
            _ => s,
        };
        s.trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase()
    };
    let (name, host) = (bare(name), bare(host));
    let target = target
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if target == host || target == name {
        return true;
    }
    let domain = name.parse::<IpAddr>().is_err() && name.contains('.');
    domain && target.ends_with(&format!(".{name}"))
}

/// The `realm` and `service` of a `WWW-Authenticate: Bearer …` challenge; `None` when the
/// header is no Bearer challenge. Parameters are `key=token` or `key="quoted"` (with `\`
/// escapes), comma separated; a malformed one ends the parse.
pub fn bearer_challenge(header: &str) -> Option<(String, Option<String>)> {
    let rest = header.trim_start();
    let (scheme, params) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let (mut realm, mut service) = (None, None);
    for (k, v) in challenge_params(params) {
        if k.eq_ignore_ascii_case("realm") {
            realm = Some(v);
        } else if k.eq_ignore_ascii_case("service") {
            service = Some(v);
        }
    }
    Some((realm?, service))
}

fn challenge_params(mut s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        let Some((key, rest)) = s.split_once('=') else {
            return out;
        };
        let key = key.trim().to_string();
        let rest = rest.trim_start();
        let (value, tail) = match rest.strip_prefix('"') {
            Some(quoted) => match unquote(quoted) {
                Some(parsed) => parsed,
                None => return out,
            },
            None => {
                let end = rest.find(',').unwrap_or(rest.len());
                (rest[..end].trim().to_string(), &rest[end..])
            }
        };
        out.push((key, value));
        s = tail;
    }
}

/// A quoted string's value (after its opening quote) and what follows its closing quote.
fn unquote(s: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &s[i + 1..])),
            '\\' => value.push(chars.next()?.1),
            c => value.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn guarded_classes() {
        for (a, c) in [
            ("127.0.0.1", Some(Guarded::Loopback)),
            ("::1", Some(Guarded::Loopback)),
            ("::ffff:127.0.0.2", Some(Guarded::Loopback)),
            ("169.254.169.254", Some(Guarded::LinkLocal)),
            ("fe80::1", Some(Guarded::LinkLocal)),
            ("10.1.2.3", Some(Guarded::Private)),
            ("172.16.0.1", Some(Guarded::Private)),
            ("192.168.1.1", Some(Guarded::Private)),
            ("100.64.0.1", Some(Guarded::Private)),
            ("fd00::1", Some(Guarded::Private)),
            ("198.18.0.1", Some(Guarded::Special)),
            ("0.0.0.0", Some(Guarded::Special)),
            ("224.0.0.1", Some(Guarded::Special)),
            ("255.255.255.255", Some(Guarded::Special)),
            ("8.8.8.8", None),
            ("2606:4700::1", None),
        ] {
            assert_eq!(guarded(ip(a)), c, "{a}");
        }
    }

    #[test]
    fn a_registry_reaches_public_addresses_and_its_own_class_only() {
        let public = Reach::of(&[ip("203.0.114.1")]);
        assert!(public.allows(ip("203.0.114.9")));
        for a in [
            "127.0.0.1",
            "169.254.169.254",
            "10.0.0.1",
            "198.18.0.1",
            "::1",
        ] {
            assert!(!public.allows(ip(a)), "{a}");
        }
        let local = Reach::of(&[ip("127.0.0.1")]);
        assert!(local.allows(ip("127.0.0.2")) && local.allows(ip("203.0.114.9")));
        assert!(!local.allows(ip("169.254.169.254")) && !local.allows(ip("10.0.0.1")));
    }

    #[test]
    fn targets_are_checked_for_scheme_and_address() {
        let reach = Reach::of(&[ip("203.0.114.1")]);
        let https = Url::parse("https://registry.example/v2/").unwrap();
        let http = Url::parse("http://registry.example/v2/").unwrap();
        let ok = |u: &str, prev: &Url| check_target(&Url::parse(u).unwrap(), prev, reach);
        assert!(ok("https://cdn.example/blob", &https).is_ok());
        assert!(ok("http://cdn.example/blob", &http).is_ok());
        let e = ok("http://cdn.example/blob", &https).unwrap_err();
        assert!(e.0.contains("plain HTTP"), "{e}");
        for bad in [
            "http://127.0.0.1:9/x",
            "http://169.254.169.254/latest",
            "http://[::1]/x",
            "http://10.0.0.1/x",
        ] {
            assert!(ok(bad, &http).is_err(), "{bad}");
        }
        assert!(ok("file:///etc/passwd", &http).is_err());
    }

    #[test]
    fn credentials_go_to_the_registrys_host_or_domain_only() {
        let u = |s: &str| Url::parse(s).unwrap();
        let may = credentials_may_go_to;
        assert!(may(
            &u("https://auth.docker.io/token"),
            "docker.io",
            "index.docker.io"
        ));
        assert!(may(&u("https://ghcr.io/token"), "ghcr.io", "ghcr.io"));
        assert!(may(
            &u("http://127.0.0.1:9999/token"),
            "127.0.0.1:5000",
            "127.0.0.1:5000"
        ));
        assert!(!may(
            &u("http://127.0.0.2/token"),
            "127.0.0.1:5000",
            "127.0.0.1:5000"
        ));
        assert!(!may(&u("https://evil.example/token"), "ghcr.io", "ghcr.io"));
        assert!(!may(
            &u("https://ghcr.io.evil.example/t"),
            "ghcr.io",
            "ghcr.io"
        ));
        assert!(!may(&u("https://xghcr.io/t"), "ghcr.io", "ghcr.io"));
        assert!(!may(
            &u("https://other.localhost/t"),
            "localhost:5000",
            "localhost:5000"
        ));
        assert!(may(&u("http://[::1]:1/t"), "[::1]:5000", "[::1]:5000"));
    }

    #[test]
    fn bearer_challenges_parse_and_hostile_ones_do_not_panic() {
        let (realm, service) = bearer_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="x""#,
        )
        .unwrap();
        assert_eq!(realm, "https://auth.docker.io/token");
        assert_eq!(service.as_deref(), Some("registry.docker.io"));
        let (realm, _) = bearer_challenge(r#"bearer realm=http://a/b, service=x"#).unwrap();
        assert_eq!(realm, "http://a/b");
        let (realm, _) = bearer_challenge(r#"Bearer realm="a\"b""#).unwrap();
        assert_eq!(realm, "a\"b");
        assert!(bearer_challenge(r#"Basic realm="x""#).is_none());
        for bad in [
            "",
            "Bearer",
            "Bearer realm",
            "Bearer realm=\"open",
            "Bearer =,=,\"",
            "Bearer realm=\"\\",
        ] {
            assert!(bearer_challenge(bad).is_none(), "{bad}");
        }
    }
}
