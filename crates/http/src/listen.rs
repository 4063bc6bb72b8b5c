//! Serving the API on a listener with bounds a network client cannot get around: at most
//! `max_connections` connections at once (more wait in the kernel's backlog), request
//! headers within `header_timeout` (a slow-loris client is cut off), a connection with no
//! request or response in flight closed after `idle_timeout` (an HTTP/2 client that only
//! answers pings holds no slot for good), and TLS on TCP when the daemon is given a
//! certificate (required for non-loopback listeners).
//!
//! With a [`Gate`] (a TCP listener that wants a token), `reserve` of the slots are kept for
//! clients that present it: connections that have not (yet) sent an authenticated request
//! hold at most `max_connections - reserve` slots. A connection accepted while those are
//! all held is a reserve one: its first request must carry the token (else 503 and the
//! connection is closed) and it is closed unless it does within `header_timeout`. Until a
//! connection authenticates, its idle limit is `header_timeout` rather than `idle_timeout`,
//! which also bounds an HTTP/2 client that never completes a stream's headers.
//!
//! axum's own `serve` has no such knobs; this is its accept loop with hyper's connection
//! builder for HTTP/1.1 (upgrades allowed) and HTTP/2 (prior knowledge on plain TCP, ALPN
//! over TLS), and the same Router as the service.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::rustls;

/// Bounds of one listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    /// For a request's headers, and for a TLS handshake.
    pub header_timeout: Duration,
    /// A connection with nothing in flight this long is closed (HTTP/2: GOAWAY).
    pub idle_timeout: Duration,
}

/// Whether a request carries the listener's token (its headers and URI).
pub type Authenticates = Arc<dyn Fn(&hyper::http::request::Parts) -> bool + Send + Sync>;

/// The connection slots kept for clients that authenticate.
#[derive(Clone)]
pub struct Gate {
    pub reserve: usize,
    pub authenticates: Authenticates,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("Cannot read {path}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no {what}")]
    Missing {
        path: std::path::PathBuf,
        what: &'static str,
    },
    #[error("The TLS certificate and key do not fit together")]
    Config(#[source] rustls::Error),
}

/// A TLS acceptor for the certificate chain and private key in these PEM files; with
/// `client_ca` (a cluster's authority), every client must present a certificate that
/// authority issued for client use (the cluster gateway's), else the handshake fails.
pub fn tls_acceptor(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.into(),
            source,
        })
    };
    let certs: Vec<_> = rustls_pemfile::certs(&mut &read(cert)?[..])
        .filter_map(|c| c.ok())
        .collect();
    if certs.is_empty() {
        return Err(TlsError::Missing {
            path: cert.into(),
            what: "PEM certificate",
        });
    }
    let key = rustls_pemfile::private_key(&mut &read(key)?[..])
        .ok()
        .flatten()
        .ok_or_else(|| TlsError::Missing {
            path: key.into(),
            what: "PEM private key",
        })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, provider)?),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Accepts client certificates that chain to the authority in `ca` and carry the client
/// use (webpki checks the extended key usage: a node's serving certificate is refused).
fn client_verifier(
    ca: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let bytes = std::fs::read(ca).map_err(|source| TlsError::Read {
        path: ca.into(),
        source,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &bytes[..]).flatten() {
        roots.add(cert).map_err(TlsError::Config)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Missing {
            path: ca.into(),
            what: "PEM certificate",
        });
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsError::Config(rustls::Error::General(e.to_string())))
}

/// Something connections come from.
pub trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Accept for UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        UnixListener::accept(self).await.map(|(s, _)| s)
    }
}

impl Accept for TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        let (s, _) = TcpListener::accept(self).await?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }
}

/// Serves `app` on `listener` until `stop` turns true, then lets connections in flight
/// finish (up to the caller's grace period).
pub async fn serve<L: Accept>(
    listener: L,
    app: Router,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: watch::Receiver<bool>,
) {
    serve_gated(listener, app, limits, tls, None, stop).await
}

/// [`serve`], keeping `gate`'s reserve of slots for authenticated clients.
pub async fn serve_gated<L: Accept>(
    listener: L,
    app: Router,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    gate: Option<Gate>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let reserve = gate
        .as_ref()
        .map_or(0, |g| g.reserve.min(limits.max_connections));
    let open = Arc::new(Semaphore::new(limits.max_connections - reserve));
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p,
            _ = stop.wait_for(|s| *s) => break,
        };
        let Ok(permit) = permit else { break };
        let io = tokio::select! {
            io = listener.accept() => io,
            _ = stop.wait_for(|s| *s) => break,
        };
        let Ok(io) = io else {
            // Out of descriptors, most likely: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (app, tls, stop) = (app.clone(), tls.clone(), stop.clone());
        let trust = gate.as_ref().map(|g| Trust::new(g, open.clone()));
        connections.spawn(async move {
            let _permit = permit;
            match tls {
                None => serve_one(io, app, limits, trust, stop).await,
                Some(tls) => {
                    let handshake = tokio::time::timeout(limits.header_timeout, tls.accept(io));
                    if let Ok(Ok(io)) = handshake.await {
                        serve_one(io, app, limits, trust, stop).await;
                    }
                }
            }
        });
    }
    connections.close();
    connections.wait().await;
}

/// One connection, until it ends; on shutdown it finishes the request in flight and closes.
async fn serve_one<I>(
    io: I,
    app: Router,
    limits: Limits,
    trust: Option<Arc<Trust>>,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let service =
        TowerToHyperService::new(busy_while_serving(app, activity.clone(), trust.clone()));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(64 << 10)
        .max_concurrent_streams(256)
        .keep_alive_interval(Some(Duration::from_secs(20)));
    let io = FirstReadDeadline::new(io, limits.header_timeout);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let shortest = match trust {
        Some(_) => limits.idle_timeout.min(limits.header_timeout),
        None => limits.idle_timeout,
    };
    let mut tick = tokio::time::interval((shortest / 4).max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = stop.wait_for(|s| *s) => break,
            _ = tick.tick() => if too_idle(&activity, &limits, trust.as_deref()) { break },
        }
    }
    conn.as_mut().graceful_shutdown();
    // HTTP/2's goodbye waits for the client to answer a ping: one that never does is cut
    // off (dropping the connection closes it), and so is one still idle.
    loop {
        let closing = tokio::time::timeout(limits.header_timeout, conn.as_mut()).await;
        if closing.is_ok() || activity.idle_for() >= limits.header_timeout {
            return;
        }
    }
}

/// Whether a connection should be closed for idleness: after `idle_timeout` once it has
/// authenticated (or on an ungated listener), after `header_timeout` before; a reserve
/// connection that sent no authenticated request within `header_timeout`, or whose
/// request was refused, at once.
fn too_idle(activity: &Activity, limits: &Limits, trust: Option<&Trust>) -> bool {
    let Some(t) = trust.filter(|t| !t.authenticated()) else {
        return activity.idle_for() >= limits.idle_timeout;
    };
    if t.refused.load(std::sync::atomic::Ordering::SeqCst) {
        return activity.idle_for() > Duration::ZERO;
    }
    if t.reserve_only() && t.since.elapsed() >= limits.header_timeout {
        return true;
    }
    activity.idle_for() >= limits.header_timeout
}

/// Where one connection of a gated listener stands: it holds one of the slots for
/// unauthenticated connections until its first authenticated request, or, taken from the
/// reserve, may serve authenticated requests only.
struct Trust {
    authenticates: Authenticates,
    open_slot: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
    reserve: bool,
    authenticated: std::sync::atomic::AtomicBool,
    refused: std::sync::atomic::AtomicBool,
    since: std::time::Instant,
}

impl Trust {
    fn new(gate: &Gate, open: Arc<Semaphore>) -> Arc<Trust> {
        let slot = open.try_acquire_owned().ok();
        Arc::new(Trust {
            authenticates: gate.authenticates.clone(),
            reserve: slot.is_none(),
            open_slot: std::sync::Mutex::new(slot),
            authenticated: Default::default(),
            refused: Default::default(),
            since: std::time::Instant::now(),
        })
    }

    fn authenticated(&self) -> bool {
        self.authenticated.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn reserve_only(&self) -> bool {
        self.reserve
    }

    /// Looks at a request: `true` when the connection may serve it. The first
    /// authenticated one hands the connection's unauthenticated slot back.
    fn admit(&self, parts: &hyper::http::request::Parts) -> bool {
        if self.authenticated() {
            return true;
        }
        if (self.authenticates)(parts) {
            self.authenticated
                .store(true, std::sync::atomic::Ordering::SeqCst);
            if let Ok(mut slot) = self.open_slot.lock() {
                slot.take();
            }
            return true;
        }
        if self.reserve {
            self.refused
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return false;
        }
        true
    }
}

/// The answer on a reserve connection to a request without the token.
fn reserved_answer() -> axum::response::Response {
    let body = r#"{"error":{"code":"unavailable","message":"Every connection slot for clients without the token is taken: the rest are kept for clients that present it"}}"#;
    let mut resp = axum::response::Response::new(axum::body::Body::from(body));
    *resp.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
    let h = resp.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    h.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    resp
}

/// What one connection has in flight, for its idle timeout: a request counts from when it
/// comes until its response body is done (a stream of output keeps it busy).
struct Activity {
    busy: std::sync::atomic::AtomicUsize,
    last: std::sync::Mutex<std::time::Instant>,
}

impl Activity {
    fn new() -> Self {
        Activity {
            busy: std::sync::atomic::AtomicUsize::new(0),
            last: std::sync::Mutex::new(std::time::Instant::now()),
        }
    }

    fn idle_for(&self) -> Duration {
        if self.busy.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        self.last.lock().map(|t| t.elapsed()).unwrap_or_default()
    }

    fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Busy(self.clone())
    }
}

/// One request in flight on a connection; done when dropped.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        if let Ok(mut t) = self.0.last.lock() {
            *t = std::time::Instant::now();
        }
        self.0
            .busy
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A response body that keeps its connection busy until it is done or dropped.
struct BusyBody {
    inner: axum::body::Body,
    _busy: Busy,
}

impl hyper::body::Body for BusyBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// `app`, with every request and its response body counted in `activity`.
fn busy_while_serving(
    app: Router,
    activity: Arc<Activity>,
    trust: Option<Arc<Trust>>,
) -> impl tower::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    tower::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let busy = activity.begin();
        let app = app.clone();
        let (parts, body) = req.into_parts();
        let admitted = trust.as_ref().is_none_or(|t| t.admit(&parts));
        let req = hyper::Request::from_parts(parts, body);
        async move {
            if !admitted {
                drop(busy);
                return Ok(reserved_answer());
            }
            let resp = tower::ServiceExt::oneshot(app, req).await?;
            Ok(resp.map(|inner| axum::body::Body::new(BusyBody { inner, _busy: busy })))
        }
    })
}

/// A connection whose first bytes must come within a deadline. The builder reads them to
/// tell HTTP/2 from HTTP/1.1 before hyper's own header timeout starts, so without this a
/// client that connects and says nothing would hold its connection slot for good.
struct FirstReadDeadline<I> {
    io: I,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<I> FirstReadDeadline<I> {
    fn new(io: I, limit: Duration) -> Self {
        FirstReadDeadline {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(limit))),
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for FirstReadDeadline<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        let read = std::pin::Pin::new(&mut this.io).poll_read(cx, buf);
        if read.is_ready() {
            this.deadline = None;
            return read;
        }
        let expired = this
            .deadline
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready());
        if expired {
            return std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client sent nothing",
            )));
        }
        std::task::Poll::Pending
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for FirstReadDeadline<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
