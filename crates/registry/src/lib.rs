//! Pulling images from OCI registries.
//!
//! The registry protocol (token and basic auth, manifests, image indexes, blobs) is
//! `oci-client`'s and the image format `oci-spec`'s; this crate adds what a sandbox
//! platform needs around them: Docker-style reference names, credentials from the caller
//! or the Docker config file, TLS with extra CAs and plain HTTP only for registries named
//! insecure, the host's platform chosen from an index, and a [`BlobStore`] into which
//! only blobs that match their digest and declared size are ever moved. Everything a
//! registry sends is treated as hostile; unpacking layers is the runtime's job.

mod blobs;
mod error;
mod fetch;
pub mod guard;

use std::path::PathBuf;
use std::str::FromStr;

use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciImageManifest};
use oci_client::Reference;
use oci_spec::image::{Arch, ImageConfiguration, Os};

mod loopback;

pub use blobs::{BlobLease, BlobStore, BlobWriter, Digest};
pub use error::{PullError, Result};
pub use fetch::{MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES};

/// Layer media types this platform unpacks (tar, gzip-compressed or not).
/// What a push sends: an OCI manifest, config and gzip layer.
const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// The descriptor of `bytes` as a blob of `media_type`.
fn descriptor(media_type: &str, bytes: &[u8]) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.into(),
        digest: Digest::of(bytes).to_string(),
        size: bytes.len() as i64,
        ..OciDescriptor::default()
    }
}

const LAYER_TYPES: [&str; 4] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
];

/// How the daemon reaches registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryConfig {
    /// PEM files of CAs trusted beyond the system's roots.
    pub ca_certs: Vec<PathBuf>,
    /// Registries (`host[:port]`) reached over plain HTTP; every other one over verified TLS.
    pub insecure: Vec<String>,
    /// Look up credentials in the Docker config file (`$DOCKER_CONFIG/config.json`,
    /// else `~/.docker/config.json`) when a pull names none.
    pub docker_config: bool,
    /// The most bytes the layers of one image may declare (the daemon's import cap).
    pub max_image_bytes: Option<u64>,
}

/// Credentials for one pull (basic auth; a registry's token flow is run with them).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, ***)", self.username)
    }
}

/// A pulled image: every blob verified and in the blob store.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The canonical reference (`registry/repository:tag` or `…@digest`).
    pub reference: String,
    /// The digest of the platform's image manifest.
    pub digest: Digest,
    pub config: ImageConfiguration,
    /// Bottom layer first.
    pub layers: Vec<PulledLayer>,
}

/// One layer blob of a pulled image.
#[derive(Debug, Clone)]
pub struct PulledLayer {
    pub digest: Digest,
    pub media_type: String,
    pub size: u64,
    pub path: PathBuf,
}

/// The canonical form of an image reference, Docker-style: `python:3.12-slim` is
/// `docker.io/library/python:3.12-slim`, a name without tag or digest gets `:latest`.
pub fn canonical(reference: &str) -> Result<String> {
    parse(reference).map(|r| r.to_string())
}

/// Whether `name` reads as a registry reference rather than a local image name: it has a
/// registry, a repository path, a tag or a digest.
pub fn looks_like_reference(name: &str) -> bool {
    name.contains(['/', ':', '@'])
}

fn parse(reference: &str) -> Result<Reference> {
    let bad = |reason: String| PullError::BadReference {
        reference: reference.into(),
        reason,
    };
    if reference.len() > 255
        || reference
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(bad("at most 255 characters, no spaces".into()));
    }
    let r = Reference::from_str(reference).map_err(|e| bad(e.to_string()))?;
    if let Some(d) = r.digest() {
        Digest::parse(d)?;
    }
    Ok(r)
}

/// Pulls images into a blob store.
pub struct Puller {
    config: RegistryConfig,
    blobs: BlobStore,
}

impl Puller {
    pub fn new(config: RegistryConfig, blobs: BlobStore) -> Puller {
        Puller { config, blobs }
    }

    pub fn blobs(&self) -> &BlobStore {
        &self.blobs
    }

    /// Pulls `reference` (manifest, config, layers), reporting progress lines. Blobs
    /// already in the store are not fetched again.
    pub async fn pull(
        &self,
        reference: &str,
        credentials: Option<&Credentials>,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<Pulled> {
        let r = parse(reference)?;
        let canonical = r.to_string();
        let session = self.session(&r, credentials).await?;
        progress(format!("resolving {canonical}"));
        let (manifest, digest) = self.image_manifest(&session, &r).await?;
        let config_digest = Digest::parse(&manifest.config.digest)?;
        let config_size = declared_size(&config_digest, manifest.config.size)?;
        let config = session
            .small_blob(&config_digest, config_size, fetch::MAX_CONFIG_BYTES)
            .await?;
        self.blobs.put(&config_digest, &config)?;
        let config = image_config(&canonical, &String::from_utf8_lossy(&config))?;
        progress(format!(
            "manifest {digest}: {} layer(s), {}/{}",
            manifest.layers.len(),
            config.os(),
            config.architecture()
        ));
        self.check_sizes(&canonical, &manifest.layers)?;
        let mut layers = Vec::new();
        for (i, layer) in manifest.layers.iter().enumerate() {
            let n = manifest.layers.len();
            layers.push(self.layer(&session, layer, i + 1, n, progress).await?);
        }
        Ok(Pulled {
            reference: canonical,
            digest,
            config,
            layers,
        })
    }

    /// The image manifest of `r` for this host's platform (through its index, if any).
    async fn image_manifest(
        &self,
        session: &fetch::Session,
        r: &Reference,
    ) -> Result<(OciImageManifest, Digest)> {
        let wanted = r.digest().or(r.tag()).unwrap_or("latest");
        match session.manifest(wanted).await? {
            (fetch::Manifest::Image(m), d) => Ok((*m, d)),
            (fetch::Manifest::Index(index), _) => {
                let Some(d) = host_platform(&index.manifests) else {
                    return Err(PullError::NoPlatform {
                        reference: r.to_string(),
                        platform: format!("linux/{}", Arch::default()),
                        offered: offered(&index.manifests),
                    });
                };
                let d = Digest::parse(&d)?;
                match session.manifest(d.as_str()).await? {
                    (fetch::Manifest::Image(m), d) => Ok((*m, d)),
                    (fetch::Manifest::Index(_), _) => Err(PullError::Protocol {
                        reference: r.to_string(),
                        detail: format!("the index entry {d} is another index"),
                    }),
                }
            }
        }
    }

    /// Refuses an image whose layers declare more than the configured cap, one by one or
    /// together.
    fn check_sizes(&self, reference: &str, layers: &[OciDescriptor]) -> Result<()> {
        let Some(limit) = self.config.max_image_bytes else {
            return Ok(());
        };
        let mut total = 0u64;
        for l in layers {
            total = total.saturating_add(u64::try_from(l.size).unwrap_or(u64::MAX));
        }
        if total > limit {
            return Err(PullError::TooLarge {
                what: format!("the layers of {reference} as their manifest declares them"),
                limit,
                actual: Some(total),
            });
        }
        Ok(())
    }

    /// A session with `r`'s registry for pulling (see [`Self::open_session`]).
    async fn session(
        &self,
        r: &Reference,
        credentials: Option<&Credentials>,
    ) -> Result<fetch::Session> {
        self.open_session(r, credentials, false).await
    }

    /// A session with `r`'s registry: plain HTTP for registries named insecure and
    /// loopback registries that speak it, credentials given or from the Docker config;
    /// with `push`, authenticated for pushing too.
    async fn open_session(
        &self,
        r: &Reference,
        credentials: Option<&Credentials>,
        push: bool,
    ) -> Result<fetch::Session> {
        let auth = self.auth(r, credentials)?;
        let host = r.resolve_registry().to_string();
        let plain_http =
            self.config.insecure.contains(&host) || loopback::speaks_plain_http(&host).await;
        // reqwest's TLS runs on the process's rustls provider: ring, as the daemon's own
        // listener. Installing it again fails harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let roots = self.extra_roots()?;
        let options = fetch::Options {
            plain_http,
            push,
            extra_roots: &roots,
            user_agent: concat!("sandfork/", env!("CARGO_PKG_VERSION")),
        };
        fetch::Session::open(r, &auth, options).await
    }

    fn extra_roots(&self) -> Result<Vec<Vec<u8>>> {
        self.config
            .ca_certs
            .iter()
            .map(|path| {
                std::fs::read(path).map_err(|e| PullError::Certificate {
                    path: path.clone(),
                    detail: e.to_string(),
                })
            })
            .collect()
    }

    async fn layer(
        &self,
        session: &fetch::Session,
        layer: &OciDescriptor,
        i: usize,
        n: usize,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<PulledLayer> {
        if !LAYER_TYPES.contains(&layer.media_type.as_str()) {
            return Err(PullError::UnsupportedMediaType {
                what: "layer",
                media_type: layer.media_type.clone(),
            });
        }
        let digest = Digest::parse(&layer.digest)?;
        let size = declared_size(&digest, layer.size)?;
        if self.blobs.has(&digest) {
            progress(format!("layer {i}/{n} {digest}: already here"));
        } else {
            progress(format!("layer {i}/{n} {digest}: fetching {size} bytes"));
            let mut w = self.blobs.writer(&digest, size).await?;
            session.blob_into(&digest, &mut w).await?;
            w.finish().await?;
        }
        Ok(PulledLayer {
            path: self.blobs.path(&digest),
            digest,
            media_type: layer.media_type.clone(),
            size,
        })
    }

    /// Pushes an image of one gzip layer and its config to `reference`; returns the
    /// pushed manifest's URL. The whole push runs on the guarded session a pull uses: its
    /// token realm, upload locations and redirects are checked on every request, and
    /// credentials go to the registry's own host only.
    pub async fn push(
        &self,
        reference: &str,
        layer_gz: Vec<u8>,
        config: Vec<u8>,
        credentials: Option<&Credentials>,
    ) -> Result<String> {
        let r = parse(reference)?;
        let session = self.open_session(&r, credentials, true).await?;
        if session.withheld_credentials() {
            return Err(PullError::Blocked {
                registry: r.resolve_registry().to_string(),
                detail: "its token service is on another host, and credentials are sent to the registry's own host only".into(),
            });
        }
        let layer = descriptor(LAYER_TYPE, &layer_gz);
        let conf = descriptor(CONFIG_TYPE, &config);
        session
            .push_blob(&Digest::parse(&layer.digest)?, layer_gz)
            .await?;
        session
            .push_blob(&Digest::parse(&conf.digest)?, config)
            .await?;
        let manifest = OciImageManifest {
            schema_version: 2,
            media_type: Some(MANIFEST_TYPE.into()),
            config: conf,
            layers: vec![layer],
            ..OciImageManifest::default()
        };
        let body = serde_json::to_vec(&manifest).map_err(|e| PullError::Protocol {
            reference: reference.to_string(),
            detail: format!("the manifest: {e}"),
        })?;
        let tag = r.tag().unwrap_or("latest");
        session.push_manifest(tag, MANIFEST_TYPE, body).await
    }

    fn auth(&self, r: &Reference, credentials: Option<&Credentials>) -> Result<fetch::Auth> {
        if let Some(c) = credentials {
            return Ok(fetch::Auth::Basic(c.username.clone(), c.password.clone()));
        }
        if !self.config.docker_config {
            return Ok(fetch::Auth::Anonymous);
        }
        let registry = r.registry();
        let mut keys = vec![registry.to_string()];
        if registry == "docker.io" {
            keys.push("https://index.docker.io/v1/".into());
        }
        for key in keys {
            use docker_credential::{CredentialRetrievalError as E, DockerCredential as C};
            match docker_credential::get_credential(&key) {
                Ok(C::UsernamePassword(u, p)) => return Ok(fetch::Auth::Basic(u, p)),
                Ok(C::IdentityToken(t)) => return Ok(fetch::Auth::Identity(t)),
                Err(E::NoCredentialConfigured | E::ConfigNotFound | E::ConfigReadError) => {}
                Err(e) => {
                    return Err(PullError::Credentials {
                        registry: registry.into(),
                        detail: e.to_string(),
                    })
                }
            }
        }
        Ok(fetch::Auth::Anonymous)
    }
}

/// A descriptor's size, which must not be negative.
fn declared_size(digest: &Digest, size: i64) -> Result<u64> {
    u64::try_from(size).map_err(|_| PullError::SizeMismatch {
        digest: digest.to_string(),
        expected: 0,
        actual: 0,
    })
}

/// The platforms an index offers, for the error that names none matching.
fn offered(manifests: &[ImageIndexEntry]) -> String {
    let list: Vec<String> = manifests
        .iter()
        .filter_map(|m| m.platform.as_ref())
        .map(|p| format!("{}/{}", p.os, p.architecture))
        .take(16)
        .collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

/// Picks the host's platform (linux and this build's architecture) from an index.
fn host_platform(manifests: &[ImageIndexEntry]) -> Option<String> {
    manifests
        .iter()
        .find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == Os::Linux && p.architecture == Arch::default())
        })
        .map(|m| m.digest.clone())
}

fn image_config(reference: &str, json: &str) -> Result<ImageConfiguration> {
    let bad = |reason: String| PullError::BadConfig {
        reference: reference.into(),
        reason,
    };
    let config: ImageConfiguration = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    if *config.os() != Os::Linux {
        return Err(bad(format!("built for {}, not linux", config.os())));
    }
    if *config.architecture() != Arch::default() {
        return Err(bad(format!(
            "built for {}, this host runs {}",
            config.architecture(),
            Arch::default()
        )));
    }
    Ok(config)
}

/// Entry points of crates/registry/fuzz: what a pull takes from a registry's manifest or
/// index and from its token challenge, without the network.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use super::*;
    pub use crate::guard::bearer_challenge;

    /// What a pull does next with a manifest body.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Plan {
        /// An image manifest: the config blob and the layer blobs it fetches, with their
        /// declared sizes.
        Image {
            config: (Digest, u64),
            layers: Vec<(Digest, u64)>,
        },
        /// An index: the manifest it fetches next (the host's platform), or `None` with
        /// the platforms it offers instead.
        Index {
            next: Option<Digest>,
            offered: String,
        },
    }

    /// A manifest or index body, checked as [`Puller::pull`] checks it.
    pub fn manifest(body: &[u8]) -> std::result::Result<Plan, String> {
        let err = |e: PullError| e.to_string();
        match fetch::parse_manifest(body)? {
            fetch::Manifest::Image(m) => {
                let config = Digest::parse(&m.config.digest).map_err(err)?;
                let config_size = declared_size(&config, m.config.size).map_err(err)?;
                let mut layers = Vec::new();
                for layer in &m.layers {
                    if !LAYER_TYPES.contains(&layer.media_type.as_str()) {
                        return Err(format!("layer media type {:?}", layer.media_type));
                    }
                    let d = Digest::parse(&layer.digest).map_err(err)?;
                    let size = declared_size(&d, layer.size).map_err(err)?;
                    layers.push((d, size));
                }
                Ok(Plan::Image {
                    config: (config, config_size),
                    layers,
                })
            }
            fetch::Manifest::Index(index) => Ok(Plan::Index {
                next: host_platform(&index.manifests)
                    .map(|d| Digest::parse(&d))
                    .transpose()
                    .map_err(err)?,
                offered: offered(&index.manifests),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_resolve_as_docker_does() {
        assert_eq!(
            canonical("python:3.12-slim").unwrap(),
            "docker.io/library/python:3.12-slim"
        );
        assert_eq!(
            canonical("alpine").unwrap(),
            "docker.io/library/alpine:latest"
        );
        assert_eq!(
            canonical("127.0.0.1:5000/team/app:v1").unwrap(),
            "127.0.0.1:5000/team/app:v1"
        );
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            canonical(&format!("ghcr.io/o/r@{d}")).unwrap(),
            format!("ghcr.io/o/r@{d}")
        );
        for bad in ["", "team/Upper", "a b", "x@sha256:123", "x@md5:abc"] {
            assert!(canonical(bad).is_err(), "{bad}");
        }
        assert!(looks_like_reference("python:3.12"));
        assert!(looks_like_reference("ghcr.io/o/r"));
        assert!(!looks_like_reference("python"));
    }

    #[test]
    fn credentials_come_from_the_docker_config_file() {
        let dir = tempfile::tempdir().unwrap();
        // "tester:s3cret", as `docker login` writes it.
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"auths":{"reg.example:5000":{"auth":"dGVzdGVyOnMzY3JldA=="}}}"#,
        )
        .unwrap();
        // SAFETY: no other test of this binary reads or writes the environment.
        unsafe { std::env::set_var("DOCKER_CONFIG", dir.path()) };
        let blobs = BlobStore::open(dir.path().join("blobs")).unwrap();
        let with = Puller::new(
            RegistryConfig {
                docker_config: true,
                ..Default::default()
            },
            blobs.clone(),
        );
        let r = parse("reg.example:5000/team/app:1").unwrap();
        match with.auth(&r, None).unwrap() {
            fetch::Auth::Basic(u, p) => assert_eq!((u.as_str(), p.as_str()), ("tester", "s3cret")),
            other => panic!("{other:?}"),
        }
        let other = parse("elsewhere.example/x:1").unwrap();
        assert!(matches!(
            with.auth(&other, None).unwrap(),
            fetch::Auth::Anonymous
        ));
        let explicit = Credentials {
            username: "u".into(),
            password: "p".into(),
        };
        assert!(
            matches!(with.auth(&r, Some(&explicit)).unwrap(), fetch::Auth::Basic(u, _) if u == "u")
        );
        let without = Puller::new(RegistryConfig::default(), blobs);
        assert!(matches!(
            without.auth(&r, None).unwrap(),
            fetch::Auth::Anonymous
        ));
    }

    #[test]
    fn foreign_configs_are_refused() {
        let arch = Arch::default().to_string();
        let ok = format!(
            r#"{{"os":"linux","architecture":"{arch}","rootfs":{{"type":"layers","diff_ids":[]}}}}"#
        );
        image_config("r", &ok).unwrap();
        let windows = ok.replace("linux", "windows");
        assert!(image_config("r", &windows).is_err());
        let other = ok.replace(&format!("\"{arch}\""), "\"s390x\"");
        assert!(image_config("r", &other).is_err());
        assert!(image_config("r", "{").is_err());
    }
}
