//! The TCP listener against network clients: TLS with the token never in clear text, a
//! bound on concurrent connections, and slow-loris clients cut off. Loopback only.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const TOKEN: &str = "s3cret-token";

struct Tls {
    _dir: tempfile::TempDir,
    cert_pem: String,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    token: std::path::PathBuf,
}

fn tls_files() -> Tls {
    let dir = tempfile::tempdir().unwrap();
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert, key, token) = (
        dir.path().join("cert.pem"),
        dir.path().join("key.pem"),
        dir.path().join("token"),
    );
    let cert_pem = made.cert.pem();
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    std::fs::write(&token, TOKEN).unwrap();
    Tls {
        _dir: dir,
        cert_pem,
        cert,
        key,
        token,
    }
}

/// `GET path` over TLS trusting only `cert_pem`; returns the raw response.
fn https_get(addr: std::net::SocketAddr, cert_pem: &str, path: &str) -> String {
    use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = tls.read_to_string(&mut out);
    out
}

#[test]
fn tls_serves_the_api_and_plain_http_gets_nothing() {
    let t = tls_files();
    let d = TestDaemon::with(|c| {
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.token_file = Some(t.token.clone());
        c.tls_cert = Some(t.cert.clone());
        c.tls_key = Some(t.key.clone());
    });
    let addr = d.tcp.expect("tcp listener");
    let reply = https_get(addr, &t.cert_pem, "/v1/health");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"status\":\"ok\""), "{reply}");
    // A plain-HTTP client (one that would send its token in clear text) gets no answer.
    let mut plain = TcpStream::connect(addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = plain.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = Vec::new();
    let _ = plain.read_to_end(&mut buf);
    assert!(!String::from_utf8_lossy(&buf).contains("200 OK"), "{buf:?}");
}

#[test]
fn connections_are_bounded_and_slow_clients_cut_off() {
    let t = tls_files();
    let d = TestDaemon::with(|c| {
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.token_file = Some(t.token.clone());
        c.max_connections = 2;
        c.header_timeout_secs = 1;
    });
    let addr = d.tcp.expect("tcp listener");
    // Two slow-loris clients take both slots with half a request each...
    let mut slow: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for s in &mut slow {
        s.write_all(b"GET /v1/health HTTP/1.1\r\nHost:").unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    // ...so a third waits, and is served once the header timeout closed them.
    let started = Instant::now();
    let mut third = TcpStream::connect(addr).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let req = format!("GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n");
    third.write_all(req.as_bytes()).unwrap();
    let mut reply = String::new();
    let _ = third.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "it waited for a slot"
    );
    for mut s in slow {
        let mut buf = [0u8; 256];
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = s.read(&mut buf).unwrap_or(0);
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "closed: {text}");
    }
    // The API still answers on the socket meanwhile and afterwards.
    assert_eq!(d.client().get("/v1/health").0, hyper::StatusCode::OK);
}

#[test]
fn an_idle_connection_is_closed_http1_and_http2() {
    let t = tls_files();
    let d = TestDaemon::with(|c| {
        c.listen = Some("127.0.0.1:0".parse().unwrap());
        c.token_file = Some(t.token.clone());
        c.idle_timeout_secs = 1;
        c.header_timeout_secs = 2;
    });
    let addr = d.tcp.expect("tcp listener");
    // HTTP/1.1 kept alive after one request, then nothing.
    let mut h1 = TcpStream::connect(addr).unwrap();
    h1.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req =
        format!("GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n");
    h1.write_all(req.as_bytes()).unwrap();
    // HTTP/2 with prior knowledge that never sends a request (it would answer pings).
    let mut h2 = TcpStream::connect(addr).unwrap();
    h2.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    let started = Instant::now();
    for (what, s) in [("http/1.1", &mut h1), ("http/2", &mut h2)] {
        let mut all = Vec::new();
        let closed = s.read_to_end(&mut all).is_ok();
        assert!(closed, "{what}: still open after {:?}", started.elapsed());
        if what == "http/1.1" {
            assert!(
                String::from_utf8_lossy(&all).starts_with("HTTP/1.1 200"),
                "{what}"
            );
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "closed by the idle timeout"
    );
    assert_eq!(d.client().get("/v1/health").0, hyper::StatusCode::OK);
}
