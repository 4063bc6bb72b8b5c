//! Registries on this machine's loopback: Docker reaches one over plain HTTP without
//! being told to, and so does sandfork, but only after seeing it answer HTTP (a loopback
//! registry serving TLS is still reached over verified TLS).

use std::net::IpAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the probe waits for the registry to connect and answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The host and port of `registry` (`host[:port]`, `[v6]:port`) when the host is
/// loopback (`localhost`, 127.0.0.0/8, `::1`); plain HTTP's port 80 when none is given.
fn loopback_addr(registry: &str) -> Option<(String, u16)> {
    let (host, port) = match registry.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, p.parse().ok()?),
        _ => (registry, 80),
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare == "localhost" || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    loopback.then(|| (bare.to_string(), port))
}

/// Whether `registry` is on loopback and answers the registry API's base request
/// (`GET /v2/`: 200, or 401 asking for credentials) over plain HTTP. A TLS server's
/// answer to plain HTTP (a 400, or an alert) does not count.
pub async fn speaks_plain_http(registry: &str) -> bool {
    let Some((host, port)) = loopback_addr(registry) else {
        return false;
    };
    tokio::time::timeout(PROBE_TIMEOUT, probe(&host, port))
        .await
        .unwrap_or(false)
}

async fn probe(host: &str, port: u16) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect((host, port)).await else {
        return false;
    };
    let ask = format!("GET /v2/ HTTP/1.0\r\nHost: {host}\r\n\r\n");
    if s.write_all(ask.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    if s.read_exact(&mut head).await.is_err() {
        return false;
    }
    // "HTTP/1.1 200" or "HTTP/1.1 401"
    head.starts_with(b"HTTP/") && matches!(&head[9..12], b"200" | b"401")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_are_probed() {
        assert_eq!(
            loopback_addr("127.0.0.1:5000"),
            Some(("127.0.0.1".into(), 5000))
        );
        assert_eq!(
            loopback_addr("localhost:5000"),
            Some(("localhost".into(), 5000))
        );
        assert_eq!(loopback_addr("[::1]:5000"), Some(("::1".into(), 5000)));
        assert_eq!(loopback_addr("localhost"), Some(("localhost".into(), 80)));
        assert_eq!(loopback_addr("registry.example:5000"), None);
        assert_eq!(loopback_addr("198.18.0.1:5000"), None);
        assert_eq!(loopback_addr("docker.io"), None);
    }

    /// A listener on loopback that answers one connection with `reply`; its address.
    async fn answering(reply: &'static [u8]) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(reply).await;
        });
        addr
    }

    #[tokio::test]
    async fn a_plain_http_listener_is_told_from_anything_else() {
        let registry = answering(b"HTTP/1.0 401 Unauthorized\r\n\r\n").await;
        assert!(speaks_plain_http(&registry).await);
        // What a TLS server answers to plain HTTP, and a TLS alert.
        let https = answering(
            b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n",
        )
        .await;
        assert!(!speaks_plain_http(&https).await);
        let tls = answering(&[0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46]).await;
        assert!(!speaks_plain_http(&tls).await);
    }
}
