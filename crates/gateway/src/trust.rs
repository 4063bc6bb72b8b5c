//! The cluster's trust: who may join it and who may receive its calls.
//!
//! `sandfork cluster init DIR` makes the cluster's secrets once:
//!
//! ```text
//! DIR/ca.pem, DIR/ca.key     the cluster's certificate authority (keep ca.key off the nodes)
//! DIR/ray.token              Ray's token: every Ray process of the cluster needs it
//! DIR/node.token             the nodes' API token, which only the gateway presents
//! DIR/gateway.pem, .key      the gateway's client certificate, which nodes ask for
//! ```
//!
//! and `sandfork cluster issue DIR NAME --ip IP` a node's certificate (`NAME.pem`,
//! `NAME.key`), naming the node (`--node-name`) and its addresses. A node serves its API
//! with it (`--tls-cert`, `--tls-key`); the gateway (`--node-ca DIR/ca.pem`) speaks to a
//! node only over TLS, and only when the node's certificate chains to the cluster's
//! authority *and* names the node Ray reports: joining Ray and labelling oneself a
//! sandfork node is not enough to receive a create, its secrets or the node token. The
//! other way round, a node with `cluster_ca` asks every TCP client for a certificate the
//! authority issued for client use: only the gateway's has that use (nodes' certificates
//! serve only), so a node that turned hostile, though it holds the node token, cannot call
//! another node's API.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use tokio_rustls::TlsConnector;

/// The authority's certificate, in the cluster directory.
pub const CA_CERT: &str = "ca.pem";
/// The authority's key.
pub const CA_KEY: &str = "ca.key";
/// Ray's token.
pub const RAY_TOKEN: &str = "ray.token";
/// The nodes' API token.
pub const NODE_TOKEN: &str = "node.token";
/// The gateway's client certificate and its key.
pub const GATEWAY_CERT: &str = "gateway.pem";
pub const GATEWAY_KEY: &str = "gateway.key";
/// The authority's name (its certificate is made again from its key to sign with).
const CA_NAME: &str = "sandfork cluster authority";

/// Why the cluster's trust could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} already holds a cluster authority: a second one would split the cluster")]
    Exists(PathBuf),
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("{path}: no {what} in it")]
    Missing { path: PathBuf, what: &'static str },
    #[error("{0:?} is not a node name a certificate can carry (letters, digits, '-' and '.')")]
    BadName(String),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrustError + '_ {
    move |source| TrustError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `data` to a new file `path` of mode `mode` (never over an existing one).
fn write_new(path: &Path, data: &[u8], mode: u32) -> Result<(), TrustError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io(path))?;
    f.write_all(data).map_err(io(path))
}

fn random_token() -> Result<String, TrustError> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(io(Path::new("/dev/urandom")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn authority_params() -> Result<CertificateParams, TrustError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // Ten years: the authority outlives its nodes' certificates.
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    Ok(params)
}

/// Makes the cluster's authority and tokens in `dir` (created, mode 0700).
pub fn init(dir: &Path) -> Result<(), TrustError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
    if dir.join(CA_KEY).exists() || dir.join(CA_CERT).exists() {
        return Err(TrustError::Exists(dir.to_path_buf()));
    }
    let key = KeyPair::generate()?;
    let cert = authority_params()?.self_signed(&key)?;
    write_new(&dir.join(CA_KEY), key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&dir.join(CA_CERT), cert.pem().as_bytes(), 0o644)?;
    for name in [RAY_TOKEN, NODE_TOKEN] {
        if !dir.join(name).exists() {
            new_token(&dir.join(name))?;
        }
    }
    issue_gateway(dir, &cert, &key)
}

/// The gateway's client certificate: for client use only, so no node can present it.
fn issue_gateway(dir: &Path, ca: &rcgen::Certificate, ca_key: &KeyPair) -> Result<(), TrustError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "sandfork gateway");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.not_after = rcgen::date_time_ymd(2035, 1, 1);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca, ca_key)?;
    write_new(
        &dir.join(GATEWAY_KEY),
        key.serialize_pem().as_bytes(),
        0o600,
    )?;
    write_new(&dir.join(GATEWAY_CERT), cert.pem().as_bytes(), 0o644)
}

/// Writes a new random token (64 hex digits) to `path` (mode 0600; never over a file).
pub fn new_token(path: &Path) -> Result<(), TrustError> {
    write_new(path, random_token()?.as_bytes(), 0o600)
}

/// Whether `name` can be a certificate's DNS name (and so a TLS server name).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && !l.starts_with('-') && !l.ends_with('-'))
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// Issues node `name`'s certificate, for its addresses `ips`, signed by the authority in
/// `dir`; returns the certificate's and the key's paths (`NAME.pem`, `NAME.key`).
pub fn issue(dir: &Path, name: &str, ips: &[IpAddr]) -> Result<(PathBuf, PathBuf), TrustError> {
    if !valid_name(name) || name == "ca" {
        return Err(TrustError::BadName(name.into()));
    }
    let key_path = dir.join(CA_KEY);
    let pem = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
    let ca_key = KeyPair::from_pem(&pem)?;
    let ca = authority_params()?.self_signed(&ca_key)?;
    let mut params = CertificateParams::new(vec![name.to_string()])?;
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params.distinguished_name.push(DnType::CommonName, name);
    // Serving only: a node's certificate never opens another node's API.
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_after = rcgen::date_time_ymd(2035, 1, 1);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    let (cert_path, node_key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    write_new(&node_key, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&cert_path, cert.pem().as_bytes(), 0o644)?;
    Ok((cert_path, node_key))
}

/// The gateway's client certificate and key (PEM files).
#[derive(Debug, Clone)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ClientCert {
    /// The gateway's certificate beside the authority's `ca` (`cluster init` makes both),
    /// when it is there.
    pub fn beside(ca: &Path) -> Option<ClientCert> {
        let dir = ca.parent()?;
        let c = ClientCert {
            cert: dir.join(GATEWAY_CERT),
            key: dir.join(GATEWAY_KEY),
        };
        (c.cert.exists() && c.key.exists()).then_some(c)
    }
}

/// A TLS client that trusts the authority in `ca` (a PEM file) and nothing else, and
/// presents `client` when the server asks for a certificate.
pub fn connector(ca: &Path, client: Option<&ClientCert>) -> Result<TlsConnector, TrustError> {
    let bytes = std::fs::read(ca).map_err(io(ca))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &bytes[..]).flatten() {
        roots.add(cert)?;
    }
    if roots.is_empty() {
        return Err(TrustError::Missing {
            path: ca.to_path_buf(),
            what: "PEM certificate",
        });
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match client {
        None => config.with_no_client_auth(),
        Some(c) => {
            let (certs, key) = read_pair(c)?;
            config.with_client_auth_cert(certs, key)?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

type Pair = (
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
);

fn read_pair(c: &ClientCert) -> Result<Pair, TrustError> {
    let bytes = std::fs::read(&c.cert).map_err(io(&c.cert))?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut &bytes[..]).flatten().collect();
    if certs.is_empty() {
        return Err(TrustError::Missing {
            path: c.cert.clone(),
            what: "PEM certificate",
        });
    }
    let bytes = std::fs::read(&c.key).map_err(io(&c.key))?;
    let key = rustls_pemfile::private_key(&mut &bytes[..])
        .ok()
        .flatten()
        .ok_or_else(|| TrustError::Missing {
            path: c.key.clone(),
            what: "PEM private key",
        })?;
    Ok((certs, key))
}

/// The TLS name a node's certificate must carry: its node name.
pub fn server_name(node: &str) -> Option<rustls::pki_types::ServerName<'static>> {
    if !valid_name(node) {
        return None;
    }
    rustls::pki_types::ServerName::try_from(node.to_string()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A TLS server on loopback with `cert`/`key` that answers one byte per connection;
    /// with `client_ca`, as a cluster's node: it asks for the gateway's certificate.
    async fn server(cert: &Path, key: &Path, client_ca: Option<&Path>) -> std::net::SocketAddr {
        let acceptor = sandfork_http::listen::tls_acceptor(cert, key, client_ca).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let _ = tls.write_all(b"!").await;
                        let _ = tls.shutdown().await;
                    }
                });
            }
        });
        addr
    }

    async fn reaches_as(
        ca: &Path,
        client: Option<&ClientCert>,
        addr: std::net::SocketAddr,
        name: &str,
    ) -> bool {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let Ok(mut tls) = connector(ca, client)
            .unwrap()
            .connect(server_name(name).unwrap(), tcp)
            .await
        else {
            return false;
        };
        let mut b = [0u8; 1];
        tls.read_exact(&mut b).await.is_ok()
    }

    async fn reaches(ca: &Path, addr: std::net::SocketAddr, name: &str) -> bool {
        reaches_as(ca, None, addr, name).await
    }

    #[tokio::test]
    async fn a_node_is_reached_only_under_its_own_name_and_only_with_the_clusters_authority() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (one, other) = (a.path().join("c"), b.path().join("c"));
        init(&one).unwrap();
        init(&other).unwrap();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let (cert, key) = issue(&one, "node1", &[ip]).unwrap();
        let addr = server(&cert, &key, None).await;
        assert!(reaches(&one.join(CA_CERT), addr, "node1").await);
        // Another node's name: a node labelled node2 in Ray but holding node1's certificate.
        assert!(!reaches(&one.join(CA_CERT), addr, "node2").await);
        // A certificate from another authority (a node that made its own).
        let (rogue_cert, rogue_key) = issue(&other, "node1", &[ip]).unwrap();
        let rogue = server(&rogue_cert, &rogue_key, None).await;
        assert!(!reaches(&one.join(CA_CERT), rogue, "node1").await);
    }

    #[tokio::test]
    async fn a_node_answers_only_the_gateways_certificate() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (one, other) = (a.path().join("c"), b.path().join("c"));
        init(&one).unwrap();
        init(&other).unwrap();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let ca = one.join(CA_CERT);
        let (cert, key) = issue(&one, "node1", &[ip]).unwrap();
        let node = server(&cert, &key, Some(&ca)).await;
        let gateway = ClientCert::beside(&ca).expect("init makes the gateway's certificate");
        assert!(reaches_as(&ca, Some(&gateway), node, "node1").await);
        // No certificate: the node token alone (which every node holds) opens nothing.
        assert!(!reaches_as(&ca, None, node, "node1").await);
        // Another node's own certificate, though the authority issued it: serving only.
        let (peer_cert, peer_key) = issue(&one, "node2", &[ip]).unwrap();
        let peer = ClientCert {
            cert: peer_cert,
            key: peer_key,
        };
        assert!(!reaches_as(&ca, Some(&peer), node, "node1").await);
        // Another cluster's gateway.
        let stranger = ClientCert::beside(&other.join(CA_CERT)).unwrap();
        assert!(!reaches_as(&ca, Some(&stranger), node, "node1").await);
    }

    #[test]
    fn init_never_overwrites_and_keys_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("c");
        init(&dir).unwrap();
        let mode = |n: &str| std::fs::metadata(dir.join(n)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(CA_KEY), 0o600);
        assert_eq!(mode(RAY_TOKEN), 0o600);
        assert_eq!(mode(NODE_TOKEN), 0o600);
        let ray = std::fs::read_to_string(dir.join(RAY_TOKEN)).unwrap();
        assert_eq!(ray.len(), 64);
        assert!(matches!(init(&dir), Err(TrustError::Exists(_))));
        issue(&dir, "n1", &[]).unwrap();
        assert!(
            issue(&dir, "n1", &[]).is_err(),
            "an issued certificate is not replaced"
        );
        assert!(matches!(
            issue(&dir, "../x", &[]),
            Err(TrustError::BadName(_))
        ));
        assert!(matches!(
            issue(&dir, "ca", &[]),
            Err(TrustError::BadName(_))
        ));
    }
}
