//! Resolves `user` strings (`name`, `uid` or `uid:gid`) from the sandbox's own
//! `/etc/passwd` and `/etc/group`, without NSS (the agent is linked statically).

use std::path::Path;

use proto::agent::{AgentError, ErrorKind};

/// Who a process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub name: Option<String>,
    pub home: Option<String>,
}

struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

fn parse_passwd_line(line: &str) -> Option<PasswdEntry<'_>> {
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 {
        return None;
    }
    Some(PasswdEntry {
        name: f[0],
        uid: f[2].parse().ok()?,
        gid: f[3].parse().ok()?,
        home: f[5],
    })
}

/// Gids of the groups in `group` (contents of /etc/group) that list `user` as a member.
fn supplementary_groups(group: &str, user: &str) -> Vec<u32> {
    group
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            let members = f.get(3)?;
            members
                .split(',')
                .any(|m| m == user)
                .then(|| f[2].parse().ok())?
        })
        .collect()
}

/// Resolves `spec` against the contents of /etc/passwd and /etc/group.
pub fn resolve_in(spec: &str, passwd: &str, group: &str) -> Result<Credentials, AgentError> {
    let invalid = || AgentError::new(ErrorKind::InvalidInput, format!("invalid user {spec:?}"));
    let (user, explicit_gid) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g.parse::<u32>().map_err(|_| invalid())?)),
        None => (spec, None),
    };
    if user.is_empty() {
        return Err(invalid());
    }
    let numeric = user.parse::<u32>().ok();
    let entry = passwd
        .lines()
        .filter_map(parse_passwd_line)
        .find(|e| match numeric {
            Some(uid) => e.uid == uid,
            None => e.name == user,
        });
    // "root" is uid 0 even in an image without /etc/passwd.
    let root = (user == "root").then_some(0);
    let Some(uid) = numeric.or(entry.as_ref().map(|e| e.uid)).or(root) else {
        let msg = format!("user {user:?} not found in /etc/passwd");
        return Err(AgentError::new(ErrorKind::NotFound, msg));
    };
    let gid = explicit_gid
        .or(entry.as_ref().map(|e| e.gid))
        .unwrap_or(uid);
    let mut groups = vec![gid];
    if let (Some(e), None) = (&entry, explicit_gid) {
        groups.extend(
            supplementary_groups(group, e.name)
                .into_iter()
                .filter(|g| *g != gid),
        );
    }
    Ok(Credentials {
        uid,
        gid,
        groups,
        name: entry.as_ref().map(|e| e.name.to_string()),
        home: entry.map(|e| e.home.to_string()),
    })
}

/// Resolves `spec` against the files under `etc` (the sandbox's `/etc`).
pub fn resolve(spec: &str, etc: &Path) -> Result<Credentials, AgentError> {
    let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap_or_default();
    let group = std::fs::read_to_string(etc.join("group")).unwrap_or_default();
    resolve_in(spec, &passwd, &group)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nbad line\n\
                          alice:x:1000:1000:Alice:/home/alice:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nwheel:x:10:alice,bob\naudio:x:29:alice\nalice:x:1000:\n";

    #[test]
    fn by_name_with_groups() {
        let c = resolve_in("alice", PASSWD, GROUP).unwrap();
        assert_eq!((c.uid, c.gid, c.groups), (1000, 1000, vec![1000, 10, 29]));
        assert_eq!(c.home.as_deref(), Some("/home/alice"));
    }

    #[test]
    fn numeric_forms() {
        let c = resolve_in("1000:5", PASSWD, GROUP).unwrap();
        assert_eq!((c.uid, c.gid, c.groups), (1000, 5, vec![5]));
        let c = resolve_in("4242", PASSWD, GROUP).unwrap();
        assert_eq!((c.uid, c.gid, c.home), (4242, 4242, None));
        assert_eq!(
            resolve_in("0", PASSWD, GROUP).unwrap().name.as_deref(),
            Some("root")
        );
    }

    #[test]
    fn root_without_passwd() {
        let c = resolve_in("root", "", "").unwrap();
        assert_eq!((c.uid, c.gid, c.groups), (0, 0, vec![0]));
    }

    #[test]
    fn errors() {
        assert_eq!(
            resolve_in("nobody", PASSWD, GROUP).unwrap_err().kind,
            ErrorKind::NotFound
        );
        for bad in ["", ":1", "alice:x", "1:2:3"] {
            let err = resolve_in(bad, PASSWD, GROUP).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidInput, "{bad}");
        }
    }
}
