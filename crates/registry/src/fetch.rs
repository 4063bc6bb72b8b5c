//! The registry protocol of a pull (the version check and its challenge, the token
//! request, manifests, indexes and blobs) on an HTTP client of sandfork's own, so that
//! what a hostile registry sends is bounded and where it points is checked
//! ([`crate::guard`]): manifests and indexes are read up to [`MAX_MANIFEST_BYTES`],
//! configs up to [`MAX_CONFIG_BYTES`], token answers and error bodies up to a few KiB,
//! each refused past it with an error naming what was too large.

use std::net::IpAddr;
use std::time::Duration;

use oci_client::manifest::{OciImageIndex, OciImageManifest};
use oci_client::Reference;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};

use crate::error::{PullError, Result};
use crate::guard::{self, Blocked, Reach};
use crate::Digest;

/// The largest manifest or index read (the distribution spec's limit for registries).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// The largest image config read.
pub const MAX_CONFIG_BYTES: u64 = 8 << 20;
/// The largest token answer read.
const MAX_TOKEN_BYTES: u64 = 64 << 10;
/// The most of an error body read (and then shown clipped).
const MAX_ERROR_BYTES: u64 = 16 << 10;
/// Redirects followed per request.
const MAX_REDIRECTS: usize = 5;

const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
application/vnd.docker.distribution.manifest.v2+json, \
application/vnd.oci.image.index.v1+json, \
application/vnd.docker.distribution.manifest.list.v2+json";

/// What a pull presents to the registry.
#[derive(Clone)]
pub enum Auth {
    Anonymous,
    Basic(String, String),
    /// A Docker config identity token, sent as a bearer token to the registry itself.
    Identity(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Anonymous => f.write_str("Anonymous"),
            Auth::Basic(u, _) => write!(f, "Basic({u}, ***)"),
            Auth::Identity(_) => f.write_str("Identity(***)"),
        }
    }
}

/// How the client of one pull is made.
pub struct Options<'a> {
    pub plain_http: bool,
    /// Authenticate for pushing to the repository too.
    pub push: bool,
    pub extra_roots: &'a [Vec<u8>],
    pub user_agent: &'static str,
}

/// One pull's conversation with one registry.
pub struct Session {
    http: reqwest::Client,
    base: Url,
    name: String,
    host: String,
    repo: String,
    reference: String,
    reach: Reach,
    authorization: Option<HeaderValue>,
    withheld: bool,
    push: bool,
}

/// A manifest as read: its bytes' digest and its parsed form.
pub enum Manifest {
    Image(Box<OciImageManifest>),
    Index(OciImageIndex),
}

impl Session {
    /// Resolves the registry of `r`, builds a client confined to its reach and
    /// authenticates for pulling from `r`'s repository.
    pub async fn open(r: &Reference, auth: &Auth, options: Options<'_>) -> Result<Session> {
        let host = r.resolve_registry().to_string();
        let scheme = if options.plain_http { "http" } else { "https" };
        let reference = r.to_string();
        let base =
            Url::parse(&format!("{scheme}://{host}/")).map_err(|e| PullError::BadReference {
                reference: reference.clone(),
                reason: e.to_string(),
            })?;
        let reach = reach_of(&base, &host).await?;
        let http = client(reach, &options).map_err(|e| PullError::Unreachable {
            registry: host.clone(),
            detail: chain(&e),
        })?;
        let mut session = Session {
            http,
            base,
            name: r.registry().to_string(),
            host,
            repo: r.repository().to_string(),
            reference,
            reach,
            authorization: None,
            withheld: false,
            push: options.push,
        };
        session.authenticate(auth).await?;
        Ok(session)
    }

    /// The version check: its challenge says how to authenticate.
    async fn authenticate(&mut self, auth: &Auth) -> Result<()> {
        if let Auth::Identity(token) = auth {
            self.authorization = header(&format!("Bearer {token}"));
            return Ok(());
        }
        let url = self.url("v2/")?;
        let res = self.send(self.http.get(url)).await?;
        let challenge = res
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|h| h.to_str().ok())
            .map(str::to_string);
        let status = res.status();
        drop(res);
        let basic = match auth {
            Auth::Basic(u, p) => header(&format!("Basic {}", base64(&format!("{u}:{p}")))),
            _ => None,
        };
        match (
            status,
            challenge.as_deref().and_then(guard::bearer_challenge),
        ) {
            (StatusCode::UNAUTHORIZED, Some((realm, service))) => {
                self.authorization = self.token(&realm, service.as_deref(), basic).await?;
            }
            _ => self.authorization = basic,
        }
        Ok(())
    }

    /// A bearer token from `realm`, sending `basic` along only when the realm is on the
    /// registry's own host (or domain).
    async fn token(
        &mut self,
        realm: &str,
        service: Option<&str>,
        basic: Option<HeaderValue>,
    ) -> Result<Option<HeaderValue>> {
        let url =
            Url::parse(realm).map_err(|e| self.protocol(format!("token realm {realm:?}: {e}")))?;
        guard::check_target(&url, &self.base, self.reach()).map_err(|b| self.blocked(b))?;
        let actions = if self.push { "pull,push" } else { "pull" };
        let scope = format!("repository:{}:{actions}", self.repo);
        let mut query = vec![("scope", scope.as_str())];
        if let Some(s) = service {
            query.push(("service", s));
        }
        let mut req = self.http.get(url.clone()).query(&query);
        match basic {
            Some(b) if guard::credentials_may_go_to(&url, &self.name, &self.host) => {
                req = req.header(AUTHORIZATION, b);
            }
            Some(_) => {
                tracing::warn!(
                    registry = %self.host,
                    realm = %url,
                    "the registry's token service is on another host: credentials are not sent there"
                );
                self.withheld = true;
            }
            None => {}
        }
        let res = self.send(req).await?;
        if !res.status().is_success() {
            return Err(self.status_error(res, "the token request").await);
        }
        let body = self.read(res, MAX_TOKEN_BYTES, "the token answer").await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body)
            .map_err(|e| self.protocol(format!("token answer: {e}")))?;
        let token = t.token.or(t.access_token).unwrap_or_default();
        Ok(header(&format!("Bearer {token}")))
    }

    /// The manifest or index `reference` (a tag or a digest), verified against the digest
    /// when it is one.
    pub async fn manifest(&self, reference: &str) -> Result<(Manifest, Digest)> {
        let url = self.url(&format!("v2/{}/manifests/{reference}", self.repo))?;
        let req = self
            .authorized(self.http.get(url))
            .header(ACCEPT, MANIFEST_TYPES);
        let res = self.send(req).await?;
        if !res.status().is_success() {
            return Err(self.status_error(res, "the manifest").await);
        }
        let what = format!("the manifest {reference} of {}", self.reference);
        let body = self.read(res, MAX_MANIFEST_BYTES, &what).await?;
        let digest = Digest::of(&body);
        if reference.starts_with("sha256:") && digest.as_str() != reference {
            return Err(PullError::DigestMismatch {
                expected: reference.into(),
                actual: digest.to_string(),
            });
        }
        Ok((parse_manifest(&body).map_err(|e| self.protocol(e))?, digest))
    }

    /// A small blob (an image config) read whole: at most `limit` bytes, exactly its
    /// declared `size`, matching `digest`.
    pub async fn small_blob(&self, digest: &Digest, size: u64, limit: u64) -> Result<Vec<u8>> {
        let what = format!("the image config {digest} of {}", self.reference);
        if size > limit {
            return Err(PullError::TooLarge {
                what,
                limit,
                actual: Some(size),
            });
        }
        let res = self.blob(digest).await?;
        let body = self.read(res, size, &what).await?;
        if body.len() as u64 != size {
            return Err(PullError::SizeMismatch {
                digest: digest.to_string(),
                expected: size,
                actual: body.len() as u64,
            });
        }
        Ok(body)
    }

    /// Streams blob `digest` into `out` (which bounds and verifies it).
    pub async fn blob_into(&self, digest: &Digest, out: &mut crate::BlobWriter) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut res = self.blob(digest).await?;
        while let Some(chunk) = res.chunk().await.map_err(|e| self.transport(e))? {
            out.write_all(&chunk)
                .await
                .map_err(|e| self.write_error(e))?;
        }
        Ok(())
    }

    async fn blob(&self, digest: &Digest) -> Result<reqwest::Response> {
        let url = self.url(&format!("v2/{}/blobs/{digest}", self.repo))?;
        let res = self.send(self.authorized(self.http.get(url))).await?;
        if !res.status().is_success() {
            return Err(self.status_error(res, &format!("blob {digest}")).await);
        }
        Ok(res)
    }

    /// Uploads blob `digest` (`bytes`) unless the repository has it: a monolithic upload
    /// to the location the registry names, which is held to the session's reach as a
    /// redirect is.
    pub async fn push_blob(&self, digest: &Digest, bytes: Vec<u8>) -> Result<()> {
        let url = self.url(&format!("v2/{}/blobs/{digest}", self.repo))?;
        let res = self.send(self.authorized(self.http.head(url))).await?;
        if res.status().is_success() {
            return Ok(());
        }
        let url = self.url(&format!("v2/{}/blobs/uploads/", self.repo))?;
        let res = self.send(self.authorized(self.http.post(url))).await?;
        if res.status() != StatusCode::ACCEPTED {
            return Err(self.status_error(res, "starting an upload").await);
        }
        let location = res
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|h| h.to_str().ok())
            .ok_or_else(|| self.protocol("an upload answered without a Location"))?;
        let mut target = self
            .base
            .join(location)
            .map_err(|e| self.protocol(format!("upload location {location:?}: {e}")))?;
        guard::check_target(&target, &self.base, self.reach()).map_err(|b| self.blocked(b))?;
        target
            .query_pairs_mut()
            .append_pair("digest", &digest.to_string());
        // The upload location is the registry's own: credentials go only where they may.
        let mut req = self
            .http
            .put(target.clone())
            .header(CONTENT_TYPE, "application/octet-stream")
            .body(bytes);
        if guard::credentials_may_go_to(&target, &self.name, &self.host) {
            req = self.authorized(req);
        }
        let res = self.send(req).await?;
        if res.status() != StatusCode::CREATED {
            return Err(self
                .status_error(res, &format!("uploading blob {digest}"))
                .await);
        }
        Ok(())
    }

    /// Puts `manifest` (of `media_type`) under `tag`; returns its URL.
    pub async fn push_manifest(
        &self,
        tag: &str,
        media_type: &str,
        manifest: Vec<u8>,
    ) -> Result<String> {
        let url = self.url(&format!("v2/{}/manifests/{tag}", self.repo))?;
        let req = self
            .authorized(self.http.put(url.clone()))
            .header(CONTENT_TYPE, media_type)
            .body(manifest);
        let res = self.send(req).await?;
        if res.status() != StatusCode::CREATED {
            return Err(self.status_error(res, "putting the manifest").await);
        }
        Ok(url.to_string())
    }

    /// Whether the registry's token service was on another host, so that the
    /// credentials were not sent to it.
    pub fn withheld_credentials(&self) -> bool {
        self.withheld
    }

    fn authorized(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.authorization {
            Some(a) => req.header(AUTHORIZATION, a.clone()),
            None => req,
        }
    }

    fn url(&self, path: &str) -> Result<Url> {
        self.base
            .join(path)
            .map_err(|e| self.protocol(e.to_string()))
    }

    fn reach(&self) -> Reach {
        self.reach
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        req.send().await.map_err(|e| self.transport(e))
    }

    /// Reads `res`'s body, refusing it past `limit` bytes (by its declared length first).
    async fn read(&self, mut res: reqwest::Response, limit: u64, what: &str) -> Result<Vec<u8>> {
        let too_large = |actual| PullError::TooLarge {
            what: what.to_string(),
            limit,
            actual,
        };
        if let Some(n) = res.content_length().filter(|n| *n > limit) {
            return Err(too_large(Some(n)));
        }
        let mut body = Vec::new();
        while let Some(chunk) = res.chunk().await.map_err(|e| self.transport(e))? {
            if body.len() as u64 + chunk.len() as u64 > limit {
                return Err(too_large(None));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// The error a non-success answer stands for (its body read bounded, shown clipped).
    async fn status_error(&self, mut res: reqwest::Response, what: &str) -> PullError {
        let status = res.status();
        let mut body = Vec::new();
        while let Ok(Some(chunk)) = res.chunk().await {
            body.extend_from_slice(&chunk);
            if body.len() as u64 >= MAX_ERROR_BYTES {
                break;
            }
        }
        let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
        let detail = format!("{what}: HTTP {status}: {}", text.trim());
        let codes = error_codes(&body);
        let has = |c: &str| codes.iter().any(|x| x == c);
        if status == StatusCode::NOT_FOUND
            || [
                "MANIFEST_UNKNOWN",
                "NAME_UNKNOWN",
                "NOT_FOUND",
                "BLOB_UNKNOWN",
            ]
            .iter()
            .any(|c| has(c))
        {
            PullError::NotFound(self.reference.clone())
        } else if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
            || has("UNAUTHORIZED")
            || has("DENIED")
        {
            PullError::Unauthorized {
                registry: self.name.clone(),
                reference: self.reference.clone(),
                detail,
            }
        } else {
            self.protocol(detail)
        }
    }

    fn transport(&self, e: reqwest::Error) -> PullError {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(c) = cur {
            if let Some(b) = c.downcast_ref::<Blocked>() {
                return self.blocked(Blocked(b.0.clone()));
            }
            cur = c.source();
        }
        PullError::Unreachable {
            registry: self.host.clone(),
            detail: chain(&e),
        }
    }

    fn write_error(&self, e: std::io::Error) -> PullError {
        if e.kind() == std::io::ErrorKind::InvalidData {
            self.protocol(e.to_string())
        } else {
            PullError::Io {
                path: "the blob store".into(),
                source: e,
            }
        }
    }

    fn blocked(&self, b: Blocked) -> PullError {
        PullError::Blocked {
            registry: self.host.clone(),
            detail: b.0,
        }
    }

    fn protocol(&self, detail: impl Into<String>) -> PullError {
        PullError::Protocol {
            reference: self.reference.clone(),
            detail: detail.into(),
        }
    }
}

/// The reach of the registry at `base`: the class of its own addresses.
async fn reach_of(base: &Url, host: &str) -> Result<Reach> {
    let unreachable = |detail: String| PullError::Unreachable {
        registry: host.to_string(),
        detail,
    };
    let addrs: Vec<IpAddr> = match base.host() {
        Some(url::Host::Ipv4(ip)) => vec![IpAddr::V4(ip)],
        Some(url::Host::Ipv6(ip)) => vec![IpAddr::V6(ip)],
        Some(url::Host::Domain(d)) => {
            tokio::net::lookup_host((d, base.port_or_known_default().unwrap_or(443)))
                .await
                .map_err(|e| unreachable(e.to_string()))?
                .map(|a| a.ip())
                .collect()
        }
        None => return Err(unreachable("no host".into())),
    };
    Ok(Reach::of(&addrs))
}

/// The HTTP client of one pull: names resolved within `reach`, redirects checked.
fn client(reach: Reach, options: &Options<'_>) -> reqwest::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .dns_resolver(std::sync::Arc::new(guard::Resolver { reach }))
        .redirect(guard::redirect_policy(reach, MAX_REDIRECTS))
        .connect_timeout(Duration::from_secs(15))
        .read_timeout(Duration::from_secs(120))
        .user_agent(options.user_agent)
        .no_proxy();
    let mut roots = Vec::new();
    for pem in options.extra_roots {
        roots.push(reqwest::Certificate::from_pem(pem)?);
    }
    if !roots.is_empty() {
        b = b.tls_certs_merge(roots);
    }
    b.build()
}

fn header(value: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(value).ok().map(|mut h| {
        h.set_sensitive(true);
        h
    })
}

fn base64(s: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(s.len().div_ceil(3) * 4);
    for c in s.as_bytes().chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// An image manifest or an index (Docker's schema 2 and manifest list alike).
pub fn parse_manifest(body: &[u8]) -> std::result::Result<Manifest, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Head {
        media_type: Option<String>,
        manifests: Option<serde::de::IgnoredAny>,
    }
    let head: Head = serde_json::from_slice(body).map_err(|e| format!("manifest: {e}"))?;
    let index = match head.media_type.as_deref() {
        Some(t) if t.contains("index") || t.contains("manifest.list") => true,
        Some(_) => false,
        None => head.manifests.is_some(),
    };
    if index {
        serde_json::from_slice(body)
            .map(Manifest::Index)
            .map_err(|e| format!("image index: {e}"))
    } else {
        serde_json::from_slice(body)
            .map(|m| Manifest::Image(Box::new(m)))
            .map_err(|e| format!("image manifest: {e}"))
    }
}

/// The `code`s of a registry's error envelope (`{"errors":[{"code":…}]}`).
fn error_codes(body: &[u8]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Code>,
    }
    #[derive(serde::Deserialize)]
    struct Code {
        code: String,
    }
    serde_json::from_slice::<Envelope>(body)
        .map(|e| e.errors.into_iter().map(|c| c.code).collect())
        .unwrap_or_default()
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_encode_as_base64() {
        assert_eq!(base64("tester:s3cret"), "dGVzdGVyOnMzY3JldA==");
        assert_eq!(base64("a"), "YQ==");
        assert_eq!(base64("ab"), "YWI=");
        assert_eq!(base64("abc"), "YWJj");
    }

    #[test]
    fn manifests_and_indexes_are_told_apart_and_junk_is_an_error() {
        let m = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
            "config":{"mediaType":"x","digest":"sha256:00","size":1},"layers":[]}"#;
        assert!(matches!(parse_manifest(m), Ok(Manifest::Image(_))));
        let i = br#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(matches!(parse_manifest(i), Ok(Manifest::Index(_))));
        for junk in [
            &b""[..],
            b"{",
            b"[]",
            b"{\"mediaType\":\"x.index\"}",
            b"\xff",
        ] {
            assert!(parse_manifest(junk).is_err());
        }
    }
}
