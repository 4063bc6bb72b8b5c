//! Who an envd request acts as. E2B names the user in `Authorization: Basic
//! base64("<user>:")` (or `?username=` on `/files`); without one it is the sandbox's
//! default user: `user` (the account of E2B's templates) where the sandbox has it, else
//! root. Relative paths and `~` resolve against that user's home. Accounts are read from
//! the sandbox's `/etc/passwd` and `/etc/group` over the agent, cached briefly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap};
use base64::Engine;

use crate::manager::Manager;

/// The account E2B's templates run as.
pub const DEFAULT_USER: &str = "user";
/// How long accounts read from a sandbox are reused.
const FRESH_FOR: Duration = Duration::from_secs(30);
/// The most of `/etc/passwd` or `/etc/group` read.
const MAX_TABLE: usize = 1 << 20;
const MAX_CACHED: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

impl Account {
    fn root() -> Self {
        Account {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
        }
    }
}

/// A sandbox's accounts and groups.
#[derive(Debug, Default)]
pub struct Table {
    users: Vec<Account>,
    groups: Vec<(String, u32)>,
}

impl Table {
    pub fn parse(passwd: &str, group: &str) -> Self {
        let users = passwd
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() >= 6).then_some(())?;
                Some(Account {
                    name: f[0].to_string(),
                    uid: f[2].parse().ok()?,
                    gid: f[3].parse().ok()?,
                    home: f[5].to_string(),
                })
            })
            .collect();
        let groups = group
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() >= 3).then_some(())?;
                Some((f[0].to_string(), f[2].parse().ok()?))
            })
            .collect();
        Table { users, groups }
    }

    pub fn user(&self, name: &str) -> Option<&Account> {
        self.users.iter().find(|a| a.name == name)
    }

    /// The name of uid `uid` (its number when unknown).
    pub fn user_name(&self, uid: u32) -> String {
        self.users
            .iter()
            .find(|a| a.uid == uid)
            .map_or_else(|| uid.to_string(), |a| a.name.clone())
    }

    pub fn group_name(&self, gid: u32) -> String {
        self.groups
            .iter()
            .find(|(_, g)| *g == gid)
            .map_or_else(|| gid.to_string(), |(n, _)| n.clone())
    }

    /// The account a request acts as: the one named, else the default.
    pub fn identity(&self, named: Option<&str>) -> Result<Account, String> {
        let root = || self.user("root").cloned().unwrap_or_else(Account::root);
        match named {
            None => Ok(self.user(DEFAULT_USER).cloned().unwrap_or_else(root)),
            Some("root") => Ok(root()),
            Some(name) => self
                .user(name)
                .cloned()
                .ok_or_else(|| format!("user '{name}' not found in the sandbox")),
        }
    }
}

#[derive(Default)]
pub struct Users {
    cache: Mutex<HashMap<String, (Instant, Arc<Table>)>>,
}

impl Users {
    /// Sandbox `id`'s accounts (none when they cannot be read: everything acts as root).
    pub async fn table(&self, m: &Manager, id: &str) -> Arc<Table> {
        if let Some((at, t)) = self.lock().get(id) {
            if at.elapsed() < FRESH_FOR {
                return t.clone();
            }
        }
        let passwd = read_small(m, id, "/etc/passwd").await;
        let group = read_small(m, id, "/etc/group").await;
        let table = Arc::new(Table::parse(&passwd, &group));
        let mut cache = self.lock();
        if cache.len() >= MAX_CACHED {
            cache.retain(|_, (at, _)| at.elapsed() < FRESH_FOR);
        }
        cache.insert(id.to_string(), (Instant::now(), table.clone()));
        table
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Arc<Table>)>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A small text file of the sandbox, or nothing.
async fn read_small(m: &Manager, id: &str, path: &str) -> String {
    let Ok((_, mut chunks)) = m.read_file(id, path).await else {
        return String::new();
    };
    let mut out = Vec::new();
    while let Some(Ok(c)) = chunks.recv().await {
        out.extend_from_slice(&c);
        if out.len() > MAX_TABLE {
            return String::new();
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The user `Authorization: Basic base64("<user>:")` names.
pub fn named_user(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let b64 = v.strip_prefix("Basic ")?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let name = text.split(':').next()?.to_string();
    (!name.is_empty()).then_some(name)
}

/// An absolute, lexically clean path: `~` and relative paths resolve against `home`.
pub fn resolve(path: &str, home: &str) -> Result<String, String> {
    if path.contains('\0') || path.len() > 4096 {
        return Err(format!("invalid path {path:?}"));
    }
    let joined = if path.is_empty() || path == "~" {
        home.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nbroken\n";
    const GROUP: &str = "root:x:0:\nuser:x:1000:\n";

    #[test]
    fn the_default_user_is_user_where_it_exists() {
        let t = Table::parse(PASSWD, GROUP);
        assert_eq!(t.identity(None).unwrap().home, "/home/user");
        assert_eq!(t.identity(Some("root")).unwrap().uid, 0);
        assert!(t.identity(Some("nobody")).is_err());
        let bare = Table::parse("root:x:0:0::/root:/bin/sh\n", "");
        assert_eq!(bare.identity(None).unwrap().name, "root");
        let empty = Table::default();
        assert_eq!(empty.identity(None).unwrap(), Account::root());
        assert_eq!(t.user_name(1000), "user");
        assert_eq!(t.group_name(42), "42");
    }

    #[test]
    fn paths_resolve_against_home() {
        assert_eq!(
            resolve("notes/a.bin", "/home/user").unwrap(),
            "/home/user/notes/a.bin"
        );
        assert_eq!(resolve("~", "/home/user").unwrap(), "/home/user");
        assert_eq!(resolve("~/x/../y", "/home/user").unwrap(), "/home/user/y");
        assert_eq!(resolve("/a/./b/../../..", "/h").unwrap(), "/");
        assert!(resolve("/a\0", "/").is_err());
    }

    #[test]
    fn basic_auth_names_the_user() {
        let mut h = HeaderMap::new();
        assert_eq!(named_user(&h), None);
        h.insert(header::AUTHORIZATION, "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(named_user(&h).as_deref(), Some("root"));
        h.insert(header::AUTHORIZATION, "Basic !!".parse().unwrap());
        assert_eq!(named_user(&h), None);
    }
}
