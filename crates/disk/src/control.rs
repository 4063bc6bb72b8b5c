//! The disk server's control protocol: newline-delimited JSON over a Unix socket at
//! `RUNDIR/control.sock`, one request and one response per line.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use blockstore::LayerId;
use serde::{Deserialize, Serialize};

use crate::fuse::IoCounters;
use crate::{Error, Result};

/// A request to the disk server.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Seal the overlay into a new layer (the caller has frozen the filesystem).
    Seal,
    /// Grow the disk to `size` bytes.
    Grow { size: u64 },
    /// Merge the chain's sealed layers now.
    Compact,
    /// Report counters.
    Stats,
    /// Fail the writes held for want of host space, and any later one that finds no
    /// space: the disk is about to be torn down.
    Release,
    /// Unmount the FUSE export, close the disk and exit.
    Shutdown,
}

/// What a disk server reports about itself.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerStats {
    pub pid: u32,
    pub disk: String,
    pub size: u64,
    pub depth: usize,
    pub io: IoCounters,
    pub compactions: u64,
}

/// The answer to one request. `ok == false` carries `error`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<LayerId>,
    /// How long the operation took inside the server, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub millis: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<ServerStats>,
}

impl Response {
    pub fn ok() -> Response {
        Response {
            ok: true,
            ..Response::default()
        }
    }

    pub fn err(msg: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(msg.into()),
            ..Response::default()
        }
    }

    /// The response itself when it is a success, its message as an error otherwise.
    pub fn into_result(self) -> Result<Response> {
        if self.ok {
            Ok(self)
        } else {
            Err(Error::Server(
                self.error.unwrap_or_else(|| "unknown error".into()),
            ))
        }
    }
}

/// Sends one request to the server listening at `socket` and waits up to `timeout`.
pub fn call(socket: &Path, req: &Request, timeout: Duration) -> Result<Response> {
    let context = || format!("talk to the disk server at {}", socket.display());
    let stream = UnixStream::connect(socket).map_err(Error::io(context()))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(Error::io(context()))?;
    let mut line = serde_json::to_string(req).map_err(|e| Error::Server(e.to_string()))?;
    line.push('\n');
    (&stream)
        .write_all(line.as_bytes())
        .map_err(Error::io(context()))?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(Error::io(context()))?;
    if answer.is_empty() {
        return Err(Error::Server("connection closed without an answer".into()));
    }
    serde_json::from_str::<Response>(&answer)
        .map_err(|e| Error::Server(format!("bad answer: {e}")))?
        .into_result()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_a_stable_wire_form() {
        let grow = serde_json::to_string(&Request::Grow { size: 8192 }).unwrap();
        assert_eq!(grow, r#"{"op":"grow","size":8192}"#);
        let seal: Request = serde_json::from_str(r#"{"op":"seal"}"#).unwrap();
        assert_eq!(seal, Request::Seal);
        assert!(serde_json::from_str::<Request>(r#"{"op":"format"}"#).is_err());
    }

    #[test]
    fn error_responses_become_errors() {
        let r = Response::err("disk is busy");
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(line, r#"{"ok":false,"error":"disk is busy"}"#);
        let back: Response = serde_json::from_str(&line).unwrap();
        assert!(back
            .into_result()
            .unwrap_err()
            .to_string()
            .contains("disk is busy"));
    }
}
