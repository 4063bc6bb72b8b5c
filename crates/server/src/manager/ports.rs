//! Who may reach a sandbox's ports through the gateway, and the connection to them.
//!
//! Ports are private by default. A request opens them with the sandbox's access token
//! (`X-Sandfork-Access-Token`, or `sandfork_token=` in the query), with a signed URL
//! (`sandfork_expires=` and `sandfork_signature=`, valid for one port until it expires),
//! or with the daemon's API token; a sandbox with `public_ports` needs none. Tokens and
//! signatures are MACs under the daemon's secret (`snapshot.key`), so they survive a
//! restart and nothing about them is stored.

use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Manager;
use crate::backend::BackendError;
use crate::error::{Error, Result};
use crate::snapkey::{self, SnapshotKey};

pub use sandfork_http::proxy::{PORT_FORBIDDEN, PORT_UNAUTHORIZED};

/// Refuses a port `view` does not expose (told only to callers who may open its ports).
fn exposes(view: &api_types::Sandbox, port: u16) -> Result<()> {
    match &view.exposed_ports {
        Some(p) if !p.contains(&port) => Err(Error::Forbidden(format!(
            "Port {port} of sandbox {} is not exposed (exposed: {p:?})",
            view.id
        ))),
        _ => Ok(()),
    }
}

/// How a port request tried to authenticate.
#[derive(Debug, Default, Clone)]
pub struct PortCredentials {
    /// The request carried the daemon's API token.
    pub api_token: bool,
    pub access_token: Option<String>,
    /// `(expires_unix, signature)` of a signed URL.
    pub signed: Option<(u64, String)>,
}

impl PortCredentials {
    fn any(&self) -> bool {
        self.api_token || self.access_token.is_some() || self.signed.is_some()
    }
}

impl Manager {
    /// The daemon's secret (`snapshot.key`), read now: exports are signed with it and
    /// imported memory images must be (an operator may replace the file at any time).
    pub(super) fn read_secret_key(&self) -> Result<SnapshotKey> {
        SnapshotKey::load_or_create(&self.config.data_dir.join(snapkey::FILE))
            .map_err(|e| Error::Backend(crate::backend::BackendError::Host(e.to_string())))
    }

    /// The secret port tokens and signatures are derived from: read once, since every
    /// gateway request needs it.
    fn port_key(&self) -> Result<&SnapshotKey> {
        if let Some(k) = self.port_key.get() {
            return Ok(k);
        }
        let key = self.read_secret_key()?;
        Ok(self.port_key.get_or_init(|| key))
    }

    /// The access epoch of sandbox `id` (0 for one unknown: the MACs are computed all
    /// the same, so a refusal takes as long either way).
    fn access_epoch(&self, id: &str) -> u32 {
        self.get(id).map_or(0, |v| v.access_epoch)
    }

    /// The token that opens every port of sandbox `id`, in its current access epoch.
    pub fn port_token(&self, id: &str) -> Result<String> {
        self.token_in(id, self.access_epoch(id))
    }

    /// The signature of a URL to `port` of sandbox `id` valid until `expires` (Unix seconds).
    pub fn port_signature(&self, id: &str, port: u16, expires: u64) -> Result<String> {
        self.signature_in(id, port, expires, self.access_epoch(id))
    }

    /// [`Manager::port_token`] in access epoch `epoch` (the first epoch's tokens are those
    /// made before epochs existed).
    fn token_in(&self, id: &str, epoch: u32) -> Result<String> {
        let msg = match epoch {
            0 => id.to_string(),
            n => format!("{id}:{n}"),
        };
        Ok(hex(&self.port_key()?.derive("port-access", msg.as_bytes())))
    }

    fn signature_in(&self, id: &str, port: u16, expires: u64, epoch: u32) -> Result<String> {
        let msg = match epoch {
            0 => format!("{id}:{port}:{expires}"),
            n => format!("{id}:{port}:{expires}:{n}"),
        };
        Ok(hex(&self.port_key()?.derive("port-url", msg.as_bytes())))
    }

    /// Revokes every access token and signed URL of sandbox `id_or_name` made so far;
    /// returns its new access token.
    pub async fn rotate_access_token(&self, id_or_name: &str) -> Result<String> {
        self.check_open()?;
        let entry = self.find(id_or_name)?;
        let _op = entry.op.lock().await;
        let view = entry.view();
        if !view.state.is_live() {
            return Err(Error::WrongState {
                id: view.id,
                state: view.state,
            });
        }
        {
            let mut row = super::lock(&entry.row);
            row.view.access_epoch = row.view.access_epoch.saturating_add(1);
        }
        self.store.put_sandbox(entry.row()).await?;
        tracing::info!(sandbox = %view.id, "access token rotated: earlier tokens and signed URLs revoked");
        self.port_token(&view.id)
    }

    /// Checks that `creds` open `port` of sandbox `id_or_name`; returns the sandbox's id.
    ///
    /// A caller without the API token learns nothing from a refusal: whether the name
    /// exists, its id, which ports it exposes. Every refusal is then one of two fixed
    /// answers, [`PORT_UNAUTHORIZED`] without credentials and [`PORT_FORBIDDEN`] with
    /// credentials that do not open this port, whatever the path names. Only an API
    /// client, and a caller whose credentials open the port, get the details.
    pub fn authorize_port(
        &self,
        id_or_name: &str,
        port: u16,
        creds: &PortCredentials,
    ) -> Result<String> {
        if creds.api_token {
            let view = self.get(id_or_name)?;
            return exposes(&view, port).map(|()| view.id);
        }
        let view = self.get(id_or_name).ok();
        let public = view.as_ref().is_some_and(|v| v.public_ports);
        // The MACs are computed whether or not the sandbox exists, so that the time taken
        // does not tell either.
        let id = view.as_ref().map_or(id_or_name, |v| v.id.as_str());
        let epoch = view.as_ref().map_or(0, |v| v.access_epoch);
        let opened = public || self.credentials_open(id, epoch, port, creds)?;
        match view {
            Some(v) if opened => exposes(&v, port).map(|()| v.id),
            _ if !creds.any() => Err(Error::Unauthorized(PORT_UNAUTHORIZED.into())),
            _ => Err(Error::Forbidden(PORT_FORBIDDEN.into())),
        }
    }

    /// Whether the sandbox's access token or a signed URL in `creds` opens `port` of `id`.
    fn credentials_open(
        &self,
        id: &str,
        epoch: u32,
        port: u16,
        creds: &PortCredentials,
    ) -> Result<bool> {
        let token_ok = match &creds.access_token {
            Some(t) => equal(t, &self.token_in(id, epoch)?),
            None => false,
        };
        let signed_ok = match &creds.signed {
            Some((expires, sig)) => {
                let valid = equal(sig, &self.signature_in(id, port, *expires, epoch)?);
                *expires >= unix_now() && valid
            }
            None => false,
        };
        Ok(token_ok || signed_ok)
    }

    /// A connection to `port` of running sandbox `id` (a suspended one is resumed first),
    /// with its share of the sandbox's gateway connections: hold it as long as the
    /// connection.
    pub async fn connect_port(&self, id: &str, port: u16) -> Result<PortConnection> {
        if port == 0 {
            return Err(Error::InvalidArgument(
                "Port 0 is not a port: use 1-65535".into(),
            ));
        }
        let entry = self.find(id)?;
        let room = entry
            .gateway
            .get_or_init(|| Arc::new(Semaphore::new(self.config.gateway_connections_per_sandbox)));
        let permit = room.clone().try_acquire_owned().map_err(|_| {
            Error::Backend(BackendError::Unavailable(format!(
                "Sandbox {id} has {} gateway connections open; try again later",
                self.config.gateway_connections_per_sandbox
            )))
        })?;
        let (id, _plane) = self.using(id).await?;
        let stream = self.backend.connect_port(&id, port).await?;
        Ok(PortConnection { stream, permit })
    }

    /// How to reach `port` of sandbox `id_or_name` (a signed path valid `expires_in` s).
    pub fn port_url(
        &self,
        id_or_name: &str,
        port: u16,
        expires_in: Option<u64>,
    ) -> Result<api_types::PortUrl> {
        const MAX: u64 = 30 * 24 * 3600;
        let secs = expires_in.unwrap_or(3600);
        if port == 0 || secs == 0 || secs > MAX {
            return Err(Error::InvalidArgument(format!(
                "port must be 1-65535 and expires_in_secs 1-{MAX}"
            )));
        }
        let view = self.get(id_or_name)?;
        let expires = unix_now() + secs;
        let path = format!("/v1/sandboxes/{}/ports/{port}/", view.id);
        let signature = self.port_signature(&view.id, port, expires)?;
        let at = UNIX_EPOCH + std::time::Duration::from_secs(expires);
        Ok(api_types::PortUrl {
            port,
            signed_path: format!(
                "{path}?sandfork_expires={expires}&sandfork_signature={signature}"
            ),
            path,
            host: format!("{port}-{}.{}", view.id, self.config.gateway_domain),
            access_token: self.port_token(&view.id)?,
            expires_at: model::timestamp::rfc3339_millis(at),
            public: view.public_ports,
            base_url: self.base_url(),
        })
    }

    /// Where browsers reach this daemon (see [`api_types::PortUrl::base_url`]).
    fn base_url(&self) -> Option<String> {
        if let Some(u) = &self.config.public_url {
            return Some(u.trim_end_matches('/').to_string());
        }
        let addr = self.config.listen?;
        let scheme = if self.config.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        Some(format!("{scheme}://{addr}"))
    }

    /// The domain of host-based port routing.
    pub fn gateway_domain(&self) -> &str {
        &self.config.gateway_domain
    }
}

/// An open connection to a sandbox's port, holding its place among the sandbox's gateway
/// connections.
pub struct PortConnection {
    pub stream: tokio::net::TcpStream,
    /// Held for as long as the connection is used.
    pub permit: OwnedSemaphorePermit,
}

fn equal(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
