//! What every envd request goes through first: the sandbox the
//! `E2b-Sandbox-Id` header names must be running (else the 502 of E2B's proxy), and the
//! request must carry the sandbox's access token.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::errors::{sandbox_gone, unauthorized, Code, RpcErr};
use super::users::{Account, Table};
use super::{shapes, Shared, SANDBOX_HEADER};
use model::State;

/// The answer to a request that is refused before it is served.
pub type Refusal = Box<Response>;

/// The access token of sandbox `id`'s envd: a hash of its port token, itself a MAC
/// under the daemon's secret (so it survives restarts and is never stored).
pub fn access_token(s: &Shared, id: &str) -> Result<String, crate::error::Error> {
    let port = s.manager.port_token(id)?;
    let digest = Sha256::new()
        .chain_update(b"sandfork-e2b-envd\0")
        .chain_update(port.as_bytes())
        .finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("ea_{hex}"))
}

/// Whether `given` is sandbox `id`'s access token.
pub fn token_matches(s: &Shared, id: &str, given: &str) -> bool {
    access_token(s, id).is_ok_and(|t| bool::from(t.as_bytes().ct_eq(given.as_bytes())))
}

/// The sandbox id of an envd request.
pub fn sandbox_id(headers: &HeaderMap) -> String {
    headers
        .get(SANDBOX_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Whether a sandbox answers envd requests: running (a paused one only when it resumes
/// on traffic).
pub fn reachable(view: &api_types::Sandbox) -> bool {
    match view.state {
        State::Running | State::Checkpointing | State::Creating | State::Resuming => true,
        State::Suspended | State::Suspending => shapes::auto_resumes(&view.labels),
        _ => false,
    }
}

/// The sandbox of an envd request, running and opened by its access token; else the
/// answer to give.
pub fn admit(s: &Shared, headers: &HeaderMap) -> Result<String, Refusal> {
    let named = sandbox_id(headers);
    let view = match s.manager.get(&named) {
        Ok(v) if !named.is_empty() && reachable(&v) => v,
        _ => return Err(Box::new(sandbox_gone(&named))),
    };
    let given = headers
        .get("x-access-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !token_matches(s, &view.id, given) {
        return Err(Box::new(unauthorized()));
    }
    Ok(view.id)
}

/// A refused RPC's answer: in the end frame of a stream for a streaming method, else as a
/// unary error.
pub fn rpc_failure(streaming: bool, e: RpcErr) -> Response {
    if streaming {
        super::connect::stream_error(e)
    } else {
        e.into_response()
    }
}

/// An RPC's sandbox and account (admitted, the named user resolved), or the answer to give.
pub async fn rpc_context(
    s: &Shared,
    headers: &HeaderMap,
    streaming: bool,
) -> Result<Ctx, Response> {
    let id = admit(s, headers).map_err(|r| *r)?;
    let named = super::users::named_user(headers);
    Ctx::new(s, id, named.as_deref())
        .await
        .map_err(|m| rpc_failure(streaming, RpcErr::new(Code::Unauthenticated, m)))
}

/// A request's sandbox, the account it acts as, and the sandbox's accounts.
pub struct Ctx {
    pub id: String,
    pub account: Account,
    pub table: Arc<Table>,
}

impl Ctx {
    /// The account named (or the default one) in sandbox `id`.
    pub async fn new(s: &Shared, id: String, named: Option<&str>) -> Result<Self, String> {
        let table = s.users.table(&s.manager, &id).await;
        let account = table.identity(named)?;
        Ok(Ctx { id, account, table })
    }

    /// The user to hand the agent (`None`: its own, root).
    pub fn agent_user(&self) -> Option<String> {
        (self.account.uid != 0).then(|| self.account.name.clone())
    }

    /// An absolute path for one the client gave.
    pub fn path(&self, p: &str) -> Result<String, String> {
        super::users::resolve(p, &self.account.home)
    }
}
