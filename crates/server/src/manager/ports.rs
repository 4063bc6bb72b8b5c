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

    /// The token that opens every port of sandbox `id`.
    pub fn port_token(&self, id: &str) -> Result<String> {
        Ok(hex(&self.port_key()?.derive("port-access", id.as_bytes())))
    }

    /// The signature of a URL to `port` of sandbox `id` valid until `expires` (Unix seconds).
    pub fn port_signature(&self, id: &str, port: u16, expires: u64) -> Result<String> {
        let msg = format!("{id}:{port}:{expires}");
        Ok(hex(&self.port_key()?.derive("port-url", msg.as_bytes())))
    }

    /// Checks that `creds` open `port` of sandbox `id_or_name`; returns the sandbox's id.
    pub fn authorize_port(
        &self,
        id_or_name: &str,
        port: u16,
        creds: &PortCredentials,
    ) -> Result<String> {
        let view = self.get(id_or_name)?;
        if view
            .exposed_ports
            .as_ref()
            .is_some_and(|p| !p.contains(&port))
        {
            return Err(Error::Forbidden(format!(
                "Port {port} of sandbox {} is not exposed (exposed: {:?})",
                view.id,
                view.exposed_ports.unwrap_or_default()
            )));
        }
        if view.public_ports || creds.api_token {
            return Ok(view.id);
        }
        if !creds.any() {
            return Err(Error::Unauthorized(format!(
                "Port {port} of sandbox {} is private: send its access token \
                 (X-Sandfork-Access-Token) or use a signed URL",
                view.id
            )));
        }
        let token_ok = match &creds.access_token {
            Some(t) => equal(t, &self.port_token(&view.id)?),
            None => false,
        };
        let signed_ok = match &creds.signed {
            Some((expires, sig)) => {
                *expires >= unix_now()
                    && equal(sig, &self.port_signature(&view.id, port, *expires)?)
            }
            None => false,
        };
        if token_ok || signed_ok {
            Ok(view.id)
        } else {
            Err(Error::Forbidden(format!(
                "The token or signature does not open port {port} of sandbox {} (or it expired)",
                view.id
            )))
        }
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
