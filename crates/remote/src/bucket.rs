//! The bucket: an `object_store` client rooted at a prefix, with byte counters.

use std::ops::Range;
use std::path::Path as FsPath;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig, WriteMultipart,
};
use serde::Deserialize;
use tokio::io::AsyncReadExt;

use crate::error::{RemoteError, Result};

/// Objects larger than this go up in parts.
const MULTIPART_FROM: u64 = 32 << 20;
/// Size of each uploaded part.
const UPLOAD_PART: usize = 16 << 20;
/// Parts of one object in flight at once.
const UPLOAD_PARALLEL: usize = 4;

/// Where snapshots are published, and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BucketConfig {
    /// `s3://BUCKET[/PREFIX]`.
    pub url: String,
    /// The S3 endpoint (`http://127.0.0.1:8333`, a MinIO or a GCS interoperability URL);
    /// none: AWS's own for `region`.
    pub endpoint: Option<String>,
    pub region: String,
    /// Allow an `http://` endpoint (credentials and data then cross in clear text).
    pub allow_http: bool,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// How long one request is retried (connection refused, 5xx, timeouts) before it fails.
    pub retry_secs: u64,
}

impl Default for BucketConfig {
    fn default() -> Self {
        BucketConfig {
            url: String::new(),
            endpoint: None,
            region: "us-east-1".into(),
            allow_http: false,
            access_key_id: String::new(),
            secret_access_key: String::new(),
            session_token: None,
            retry_secs: 30,
        }
    }
}

/// Bytes and requests that crossed to and from the bucket.
#[derive(Debug, Default)]
pub struct Stats {
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub gets: AtomicU64,
    pub puts: AtomicU64,
    pub errors: AtomicU64,
}

/// An object store rooted at a prefix.
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    url: String,
    pub stats: Stats,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("url", &self.url).finish()
    }
}

/// `s3://bucket/some/prefix` → ("bucket", "some/prefix").
fn split_url(url: &str) -> Result<(String, String)> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| {
        RemoteError::Config(format!("{url:?} is not an s3://BUCKET[/PREFIX] URL"))
    })?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if bucket.len() < 3 || bucket.len() > 63 || !bucket.chars().all(ok) {
        return Err(RemoteError::Config(format!(
            "bucket name {bucket:?} must be 3-63 lowercase letters, digits, '-' or '.'"
        )));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|p| p == "." || p == "..") {
        return Err(RemoteError::Config(format!(
            "prefix {prefix:?} has . or .."
        )));
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

impl Bucket {
    /// A client for the bucket `config` names. Credentials are always given: the AWS
    /// credential chain (which would ask an instance metadata service) is never used.
    pub fn open(config: &BucketConfig) -> Result<Bucket> {
        let (bucket, prefix) = split_url(&config.url)?;
        if config.access_key_id.is_empty() || config.secret_access_key.is_empty() {
            return Err(RemoteError::Config(
                "no credentials: give an access key id and a secret access key".into(),
            ));
        }
        if let Some(e) = &config.endpoint {
            if e.starts_with("http://") && !config.allow_http {
                return Err(RemoteError::Config(format!(
                    "endpoint {e} is plain HTTP; allow it explicitly (object_store_allow_http)"
                )));
            }
        }
        // reqwest's TLS runs on the process's rustls provider: ring, as everywhere here.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: 100,
            retry_timeout: Duration::from_secs(config.retry_secs),
        };
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_allow_http(config.allow_http)
            .with_retry(retry);
        if let Some(t) = &config.session_token {
            b = b.with_token(t);
        }
        if let Some(e) = &config.endpoint {
            b = b.with_endpoint(e);
        }
        let store = b.build().map_err(|e| RemoteError::Config(e.to_string()))?;
        Ok(Bucket::with_store(Arc::new(store), &prefix, &config.url))
    }

    /// A bucket over any object store (tests use an in-memory one).
    pub fn with_store(store: Arc<dyn ObjectStore>, prefix: &str, url: &str) -> Bucket {
        Bucket {
            store,
            prefix: prefix.trim_matches('/').to_string(),
            url: url.to_string(),
            stats: Stats::default(),
        }
    }

    /// The bucket's URL, as configured.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The whole address of object `rel`, for messages.
    pub fn object_url(&self, rel: &str) -> String {
        format!("{}/{rel}", self.url.trim_end_matches('/'))
    }

    fn path(&self, rel: &str) -> Path {
        match self.prefix.as_str() {
            "" => Path::from(rel),
            p => Path::from(format!("{p}/{rel}")),
        }
    }

    fn failed(&self, what: &str, e: object_store::Error) -> RemoteError {
        if let object_store::Error::NotFound { .. } = e {
            return RemoteError::NotFound(what.to_string());
        }
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        RemoteError::Store {
            url: self.url.clone(),
            what: what.to_string(),
            detail: e.to_string(),
        }
    }

    /// Whether object `rel` exists.
    pub async fn exists(&self, rel: &str) -> Result<bool> {
        match self.store.head(&self.path(rel)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.failed(&format!("head {rel}"), e)),
        }
    }

    /// Writes object `rel` (atomically: whole or not at all).
    pub async fn put(&self, rel: &str, bytes: Bytes) -> Result<()> {
        let n = bytes.len() as u64;
        self.store
            .put(&self.path(rel), PutPayload::from(bytes))
            .await
            .map_err(|e| self.failed(&format!("put {rel}"), e))?;
        self.count_out(n);
        Ok(())
    }

    /// Writes object `rel` from a local file, in parts when it is large.
    pub async fn put_file(&self, rel: &str, file: &FsPath) -> Result<()> {
        let ctx = |e| RemoteError::io(format!("read {}", file.display()), e);
        let mut f = tokio::fs::File::open(file).await.map_err(ctx)?;
        let len = f.metadata().await.map_err(ctx)?.len();
        if len < MULTIPART_FROM {
            let mut buf = Vec::with_capacity(len as usize);
            f.read_to_end(&mut buf).await.map_err(ctx)?;
            return self.put(rel, buf.into()).await;
        }
        let upload = self
            .store
            .put_multipart(&self.path(rel))
            .await
            .map_err(|e| self.failed(&format!("start upload of {rel}"), e))?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, UPLOAD_PART);
        let mut buf = vec![0u8; UPLOAD_PART];
        loop {
            let n = read_full(&mut f, &mut buf).await.map_err(ctx)?;
            if n == 0 {
                break;
            }
            w.wait_for_capacity(UPLOAD_PARALLEL)
                .await
                .map_err(|e| self.failed(&format!("upload {rel}"), e))?;
            w.write(&buf[..n]);
            self.count_out(n as u64);
        }
        w.finish()
            .await
            .map_err(|e| self.failed(&format!("finish upload of {rel}"), e))?;
        Ok(())
    }

    fn count_out(&self, n: u64) {
        self.stats.bytes_out.fetch_add(n, Ordering::Relaxed);
        self.stats.puts.fetch_add(1, Ordering::Relaxed);
    }

    fn count_in(&self, n: u64) {
        self.stats.bytes_in.fetch_add(n, Ordering::Relaxed);
        self.stats.gets.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads object `rel`, refusing one larger than `max` bytes.
    pub async fn get(&self, rel: &str, max: u64) -> Result<Bytes> {
        let what = format!("get {rel}");
        let got = self
            .store
            .get(&self.path(rel))
            .await
            .map_err(|e| self.failed(&what, e))?;
        if got.meta.size > max {
            return Err(RemoteError::invalid(format!(
                "{rel} is {} bytes, more than the {max} it may be",
                got.meta.size
            )));
        }
        let bytes = got.bytes().await.map_err(|e| self.failed(&what, e))?;
        self.count_in(bytes.len() as u64);
        Ok(bytes)
    }

    /// Reads bytes `range` of object `rel` (one ranged GET).
    pub async fn get_range(&self, rel: &str, range: Range<u64>) -> Result<Bytes> {
        let want = range.end - range.start;
        let bytes = self
            .store
            .get_range(&self.path(rel), range)
            .await
            .map_err(|e| self.failed(&format!("get a range of {rel}"), e))?;
        if bytes.len() as u64 != want {
            return Err(RemoteError::invalid(format!(
                "{rel}: asked for {want} bytes, got {}",
                bytes.len()
            )));
        }
        self.count_in(want);
        Ok(bytes)
    }

    /// Removes object `rel` (gone already is fine).
    pub async fn delete(&self, rel: &str) -> Result<()> {
        match self.store.delete(&self.path(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.failed(&format!("delete {rel}"), e)),
        }
    }

    /// Names (relative to the prefix) of the objects under `rel`.
    pub async fn list(&self, rel: &str) -> Result<Vec<String>> {
        let base = self.path(rel);
        let skip = match self.prefix.as_str() {
            "" => 0,
            p => p.len() + 1,
        };
        let metas: Vec<_> = self
            .store
            .list(Some(&base))
            .try_collect()
            .await
            .map_err(|e| self.failed(&format!("list {rel}"), e))?;
        Ok(metas
            .into_iter()
            .map(|m| m.location.as_ref()[skip..].to_string())
            .collect())
    }
}

/// Fills `buf` from `f` unless the file ends first; returns the bytes read.
async fn read_full(f: &mut tokio::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).await? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert_eq!(
            split_url("s3://sandfork/a/b/").unwrap(),
            ("sandfork".into(), "a/b".into())
        );
        assert_eq!(
            split_url("s3://snaps").unwrap(),
            ("snaps".into(), "".into())
        );
        for bad in [
            "http://x/y",
            "s3://",
            "s3://A_B",
            "s3://ok-bucket/../x",
            "s3://ab",
        ] {
            assert!(split_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn no_credentials_no_plain_http_unless_allowed() {
        let mut c = BucketConfig {
            url: "s3://sandfork".into(),
            endpoint: Some("http://127.0.0.1:1".into()),
            ..Default::default()
        };
        let e = Bucket::open(&c).unwrap_err().to_string();
        assert!(e.contains("no credentials"), "{e}");
        c.access_key_id = "k".into();
        c.secret_access_key = "s".into();
        let e = Bucket::open(&c).unwrap_err().to_string();
        assert!(e.contains("plain HTTP"), "{e}");
        c.allow_http = true;
        Bucket::open(&c).unwrap();
    }
}
