//! Snapshots signed per node, in a cluster with an authority (`cluster_ca`).
//!
//! A node signs the manifests it publishes with its own key, the private key of its TLS
//! certificate (`tls_key`, issued by `sandfork cluster issue` for its name), and puts the
//! certificate beside the signature. A node restoring a snapshot accepts the manifest only
//! when that certificate chains to the cluster's authority, names a node that is not in
//! the revocation list (`cluster_revoked`: node names, one a line, read again at every
//! check), and its key made the signature. So no node holds a secret that lets it sign as
//! another, and revoking a node refuses everything it signed from then on, memory images
//! (which CRIU parses as root) first of all.

use std::path::{Path, PathBuf};

use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// Why the node's key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum NodeKeyError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Bad { path: PathBuf, what: String },
}

fn read(path: &Path) -> Result<Vec<u8>, NodeKeyError> {
    std::fs::read(path).map_err(|source| NodeKeyError::Read {
        path: path.into(),
        source,
    })
}

fn bad(path: &Path, what: impl Into<String>) -> NodeKeyError {
    NodeKeyError::Bad {
        path: path.into(),
        what: what.into(),
    }
}

/// This node's signing key and certificate, and the cluster's authority.
pub struct NodeKey {
    key: EcdsaKeyPair,
    cert_pem: String,
    authority: Vec<CertificateDer<'static>>,
    revoked: Option<PathBuf>,
    rng: SystemRandom,
}

impl NodeKey {
    /// Loads the node's key and certificate (`tls_key`, `tls_cert`) and the authority
    /// (`cluster_ca`); the certificate must be the authority's.
    pub fn load(
        cert: &Path,
        key: &Path,
        ca: &Path,
        revoked: Option<&Path>,
    ) -> Result<NodeKey, NodeKeyError> {
        let ca_bytes = read(ca)?;
        let authority: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &ca_bytes[..])
            .filter_map(|c| c.ok())
            .collect();
        if authority.is_empty() {
            return Err(bad(ca, "no PEM certificate in it"));
        }
        let key_bytes = read(key)?;
        let der = rustls_pemfile::private_key(&mut &key_bytes[..])
            .ok()
            .flatten()
            .ok_or_else(|| bad(key, "no PEM private key in it"))?;
        let rng = SystemRandom::new();
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, der.secret_der(), &rng)
                .map_err(|e| {
                    bad(
                        key,
                        format!("not a P-256 key as `sandfork cluster issue` makes ({e})"),
                    )
                })?;
        let cert_pem = String::from_utf8(read(cert)?).map_err(|_| bad(cert, "not PEM text"))?;
        let me = NodeKey {
            key: pair,
            cert_pem,
            authority,
            revoked: revoked.map(Path::to_path_buf),
            rng,
        };
        me.certified(&me.cert_pem)
            .map_err(|why| bad(cert, format!("not usable under {}: {why}", ca.display())))?;
        Ok(me)
    }

    /// The revoked node names, read now (a missing list revokes nothing; an unreadable
    /// one refuses everything).
    fn revoked(&self) -> Result<Vec<String>, String> {
        let Some(path) = &self.revoked else {
            return Ok(Vec::new());
        };
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from)
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(format!("the revocation list {}: {e}", path.display())),
        }
    }

    /// Checks that `pem` is a certificate of the authority's, of a node not revoked;
    /// returns its DER.
    fn certified(&self, pem: &str) -> Result<CertificateDer<'static>, String> {
        let der = rustls_pemfile::certs(&mut pem.as_bytes())
            .next()
            .and_then(|c| c.ok())
            .ok_or("the signer is not a PEM certificate")?;
        let ee = webpki::EndEntityCert::try_from(&der).map_err(|e| format!("certificate: {e}"))?;
        let anchors: Vec<_> = self
            .authority
            .iter()
            .filter_map(|c| webpki::anchor_from_trusted_cert(c).ok())
            .collect();
        ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &anchors,
            &[],
            UnixTime::now(),
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map_err(|e| format!("the signer's certificate is not the cluster authority's: {e}"))?;
        for name in self.revoked()? {
            let Ok(server_name) = ServerName::try_from(name.as_str()) else {
                continue;
            };
            if ee.verify_is_valid_for_subject_name(&server_name).is_ok() {
                return Err(format!("node {name} is revoked"));
            }
        }
        Ok(der)
    }
}

impl remote::Signer for NodeKey {
    fn sign(&self, body: &[u8]) -> Result<remote::Signature, String> {
        let sig = self
            .key
            .sign(&self.rng, body)
            .map_err(|_| "the node's key could not sign".to_string())?;
        Ok(remote::Signature {
            bytes: sig.as_ref().to_vec(),
            signer: Some(self.cert_pem.clone()),
        })
    }

    fn verify(&self, body: &[u8], signature: &remote::Signature) -> Result<(), String> {
        let pem = signature
            .signer
            .as_deref()
            .ok_or("signed with a shared key, not a node's own (this cluster has an authority)")?;
        let der = self.certified(pem)?;
        let ee = webpki::EndEntityCert::try_from(&der).map_err(|e| format!("certificate: {e}"))?;
        ee.verify_signature(webpki::ring::ECDSA_P256_SHA256, body, &signature.bytes)
            .map_err(|e| format!("the signature is not the signer's: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    use remote::Signer;

    /// An authority in `dir` (as `sandfork cluster init` makes one), and a function that
    /// issues node certificates under it.
    struct Authority {
        key: KeyPair,
        cert: rcgen::Certificate,
        dir: PathBuf,
    }

    impl Authority {
        fn new(dir: &Path) -> Authority {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            p.distinguished_name
                .push(DnType::CommonName, "test authority");
            p.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let key = KeyPair::generate().unwrap();
            let cert = p.self_signed(&key).unwrap();
            std::fs::write(dir.join("ca.pem"), cert.pem()).unwrap();
            Authority {
                key,
                cert,
                dir: dir.to_path_buf(),
            }
        }

        fn node(&self, name: &str, revoked: Option<&Path>) -> NodeKey {
            let mut p = CertificateParams::new(vec![name.to_string()]).unwrap();
            p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
            let key = KeyPair::generate().unwrap();
            let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
            let (c, k) = (
                self.dir.join(format!("{name}.pem")),
                self.dir.join(format!("{name}.key")),
            );
            std::fs::write(&c, cert.pem()).unwrap();
            std::fs::write(&k, key.serialize_pem()).unwrap();
            NodeKey::load(&c, &k, &self.dir.join("ca.pem"), revoked).unwrap()
        }
    }

    #[test]
    fn a_manifest_is_trusted_when_a_certified_node_not_revoked_signed_it() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let list = a.path().join("revoked");
        let cluster = Authority::new(a.path());
        let (node1, node2) = (
            cluster.node("node1", None),
            cluster.node("node2", Some(&list)),
        );
        let body = b"{\"id\":\"snap\"}";
        let sig = node1.sign(body).unwrap();
        assert!(sig.signer.is_some());
        node2.verify(body, &sig).unwrap();
        // Anything else: another body, another's signature bytes, a shared-key signature.
        assert!(node2.verify(b"{\"id\":\"other\"}", &sig).is_err());
        let other = node2.sign(body).unwrap();
        let forged = remote::Signature {
            bytes: other.bytes.clone(),
            signer: sig.signer.clone(),
        };
        assert!(node2
            .verify(body, &forged)
            .unwrap_err()
            .contains("not the signer's"));
        let shared = remote::Signature {
            bytes: vec![7; 32],
            signer: None,
        };
        assert!(node2
            .verify(body, &shared)
            .unwrap_err()
            .contains("shared key"));
        // A node of another authority, whatever name it carries.
        let rogue = Authority::new(b.path()).node("node1", None);
        let err = node2.verify(body, &rogue.sign(body).unwrap()).unwrap_err();
        assert!(err.contains("not the cluster authority's"), "{err}");
        // Revoked: refused from the next check on, and trusted again once unlisted.
        std::fs::write(&list, "# revoked nodes\nnode1\n").unwrap();
        assert!(node2
            .verify(body, &sig)
            .unwrap_err()
            .contains("node1 is revoked"));
        std::fs::write(&list, "node3\n").unwrap();
        node2.verify(body, &sig).unwrap();
    }

    #[test]
    fn a_certificate_of_another_authority_is_refused_at_load() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let _cluster = Authority::new(a.path());
        let other = Authority::new(b.path());
        let _ = other.node("node1", None);
        let err = NodeKey::load(
            &b.path().join("node1.pem"),
            &b.path().join("node1.key"),
            &a.path().join("ca.pem"),
            None,
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("not usable under"), "{err}");
    }
}
