//! The resources: a sandbox's files and its log, by URI.
//!
//! - `sandfork://sandboxes/{id}/files/{path}`: the file at `/{path}` in the sandbox (its
//!   text, or its bytes as a blob when not UTF-8; a directory reads as its listing, in
//!   JSON). Percent-escapes in the path are decoded; the path keeps its slashes.
//! - `sandfork://sandboxes/{id}/logs`: the last lines of the sandbox log (what its
//!   background processes wrote), one per line.
//!
//! Reads are cut at [`limits::DEFAULT_READ_BYTES`], with a note saying so.

use api_types::{LogEntry, SandboxList, State};
use base64::Engine as _;
use hyper::Method;
use rmcp::model::{
    ListResourceTemplatesResult, ListResourcesResult, MetaObject, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate,
};
use serde_json::json;

use crate::daemon::Daemon;
use crate::daemon::{next_line, sandbox_path};
use crate::error::{Error, Result};
use crate::files::{list_dir, read_file, stat};
use crate::limits::{self, Capped};

pub const SCHEME: &str = "sandfork://";
pub const FILES_TEMPLATE: &str = "sandfork://sandboxes/{id}/files/{path}";
pub const LOGS_TEMPLATE: &str = "sandfork://sandboxes/{id}/logs";
/// At most this many sandboxes' logs are listed as resources.
const MAX_LISTED: usize = 100;

/// A parsed resource URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    File { sandbox: String, path: String },
    Logs { sandbox: String },
}

impl Target {
    pub fn parse(uri: &str) -> Result<Target> {
        let bad = || {
            Error::invalid(format!(
                "unknown resource {uri:?}: this server has {FILES_TEMPLATE} and {LOGS_TEMPLATE}"
            ))
        };
        let rest = uri.strip_prefix(SCHEME).ok_or_else(bad)?;
        let rest = rest.strip_prefix("sandboxes/").ok_or_else(bad)?;
        let (id, tail) = rest.split_once('/').ok_or_else(bad)?;
        let sandbox = decode(id)?;
        if sandbox.is_empty() {
            return Err(bad());
        }
        if tail == "logs" {
            return Ok(Target::Logs { sandbox });
        }
        let path = match tail.strip_prefix("files") {
            Some("") => "/".to_string(),
            Some(p) if p.starts_with('/') => {
                let p = p.trim_start_matches('/');
                format!("/{}", decode(p)?)
            }
            _ => return Err(bad()),
        };
        Ok(Target::File { sandbox, path })
    }
}

/// Percent-decoding of one URI part into UTF-8.
fn decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| Error::invalid(format!("bad percent-escape in {s:?}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::invalid(format!("{s:?} is not UTF-8 once decoded")))
}

/// Percent-encodes a path for a files URI (slashes kept).
pub fn encode_path(path: &str) -> String {
    cli::client::encode(path.trim_start_matches('/'))
}

pub fn files_uri(sandbox: &str, path: &str) -> String {
    format!(
        "{SCHEME}sandboxes/{}/files/{}",
        cli::client::encode_segment(sandbox),
        encode_path(path)
    )
}

pub fn logs_uri(sandbox: &str) -> String {
    format!(
        "{SCHEME}sandboxes/{}/logs",
        cli::client::encode_segment(sandbox)
    )
}

pub fn templates() -> ListResourceTemplatesResult {
    ListResourceTemplatesResult::with_all_items(vec![
        ResourceTemplate::new(FILES_TEMPLATE, "sandbox-file")
            .with_title("A file of a sandbox")
            .with_description(
                "The file at /{path} in sandbox {id} (its text, or its bytes when not UTF-8; \
                 a directory reads as its listing). Cut at 256 KiB with a note.",
            ),
        ResourceTemplate::new(LOGS_TEMPLATE, "sandbox-logs")
            .with_title("The log of a sandbox")
            .with_description(
                "The last 1000 lines its background processes wrote (stdout and stderr), \
                 each with its time, process and stream.",
            )
            .with_mime_type("text/plain"),
    ])
    .with_ttl_ms(0)
}

/// The log of every live sandbox (at most 100) and its root directory.
pub async fn list(daemon: &Daemon) -> Result<ListResourcesResult> {
    let list: SandboxList = daemon
        .json(Method::GET, "/v1/sandboxes", None::<&()>)
        .await?;
    let mut resources = Vec::new();
    for s in list
        .sandboxes
        .iter()
        .filter(|s| matches!(s.state, State::Running | State::Suspended))
        .take(MAX_LISTED)
    {
        let label = s.name.clone().unwrap_or_else(|| s.id.clone());
        resources.push(
            Resource::new(logs_uri(&s.id), format!("{label} logs"))
                .with_description(format!("The log of sandbox {label}"))
                .with_mime_type("text/plain"),
        );
    }
    Ok(ListResourcesResult::with_all_items(resources).with_ttl_ms(0))
}

pub async fn read(daemon: &Daemon, uri: &str) -> Result<ReadResourceResult> {
    let contents = match Target::parse(uri)? {
        Target::File { sandbox, path } => read_path(daemon, uri, &sandbox, &path).await?,
        Target::Logs { sandbox } => read_logs(daemon, uri, &sandbox).await?,
    };
    Ok(ReadResourceResult::new(vec![contents]).with_ttl_ms(0))
}

async fn read_path(
    daemon: &Daemon,
    uri: &str,
    sandbox: &str,
    path: &str,
) -> Result<ResourceContents> {
    let entry = stat(daemon, sandbox, path).await?;
    if entry.kind == "dir" {
        let entries = list_dir(daemon, sandbox, path).await?;
        let total = entries.len();
        let shown: Vec<_> = entries
            .iter()
            .take(limits::MAX_LIST_ENTRIES)
            .map(|e| {
                json!({"name": e.name, "type": e.kind, "size": e.size,
                       "uri": files_uri(sandbox, &e.path)})
            })
            .collect();
        let mut v = json!({"path": path, "entries": shown, "total": total});
        if total > shown.len() {
            v["note"] = json!(format!(
                "[listing truncated: showing {} of {total} entries]",
                shown.len()
            ));
        }
        return Ok(ResourceContents::text(v.to_string(), uri).with_mime_type("application/json"));
    }
    let file = read_file(daemon, sandbox, path, limits::DEFAULT_READ_BYTES).await?;
    let (kept, total, truncated) = (
        file.data.kept_len(),
        file.data.total(),
        file.data.truncated(),
    );
    let note = truncated.then(|| limits::truncation_note("file", kept, total));
    Ok(match file.data.text() {
        Some(mut text) => {
            if let Some(n) = &note {
                text.push('\n');
                text.push_str(n);
            }
            ResourceContents::text(text, uri)
        }
        None => {
            let blob = base64::engine::general_purpose::STANDARD.encode(file.data.into_bytes());
            let mut meta = MetaObject::new();
            meta.0.insert("size".into(), json!(total));
            if let Some(n) = note {
                meta.0.insert("truncated".into(), json!(true));
                meta.0.insert("note".into(), json!(n));
            }
            ResourceContents::blob(blob, uri)
                .with_mime_type("application/octet-stream")
                .with_meta(meta)
        }
    })
}

async fn read_logs(daemon: &Daemon, uri: &str, sandbox: &str) -> Result<ResourceContents> {
    let path = format!(
        "{}?tail={}",
        sandbox_path(sandbox, "/logs")?,
        limits::LOG_TAIL_LINES
    );
    let mut lines = daemon.lines(Method::GET, &path, None).await?;
    let mut text = Capped::new(limits::DEFAULT_READ_BYTES);
    let mut count = 0usize;
    while let Some(line) = next_line(&mut lines).await? {
        let e: LogEntry =
            serde_json::from_value(line).map_err(|e| Error::BadReply(e.to_string()))?;
        count += 1;
        text.push(
            format!(
                "{} [{} {}] {}\n",
                e.timestamp, e.process, e.stream, e.message
            )
            .as_bytes(),
        );
    }
    let (kept, total, truncated) = (text.kept_len(), text.total(), text.truncated());
    let mut body = text.text().unwrap_or_default();
    if truncated {
        body.push_str(&limits::truncation_note("log", kept, total));
        body.push('\n');
    }
    let mut meta = MetaObject::new();
    meta.0.insert("lines".into(), json!(count));
    Ok(ResourceContents::text(body, uri).with_meta(meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse() {
        assert_eq!(
            Target::parse("sandfork://sandboxes/sb-1/files/etc/hostname").ok(),
            Some(Target::File {
                sandbox: "sb-1".into(),
                path: "/etc/hostname".into()
            })
        );
        assert_eq!(
            Target::parse("sandfork://sandboxes/sb-1/files/tmp/a%20b").ok(),
            Some(Target::File {
                sandbox: "sb-1".into(),
                path: "/tmp/a b".into()
            })
        );
        assert_eq!(
            Target::parse("sandfork://sandboxes/w/files").ok(),
            Some(Target::File {
                sandbox: "w".into(),
                path: "/".into()
            })
        );
        assert_eq!(
            Target::parse("sandfork://sandboxes/sb-1/logs").ok(),
            Some(Target::Logs {
                sandbox: "sb-1".into()
            })
        );
        for bad in [
            "file:///etc",
            "sandfork://sandboxes/",
            "sandfork://sandboxes//logs",
            "sandfork://sandboxes/x/other",
            "sandfork://sandboxes/x/files/%zz",
            "sandfork://sandboxes/x/filesystem",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn uris_round_trip() {
        let uri = files_uri("sb-1", "/tmp/a b/ü");
        assert_eq!(
            Target::parse(&uri).ok(),
            Some(Target::File {
                sandbox: "sb-1".into(),
                path: "/tmp/a b/ü".into()
            })
        );
    }
}
