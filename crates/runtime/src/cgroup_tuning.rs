//! Cheap cgroup migrations: the cgroup2 mount option `favordynmods`.
//!
//! Moving a task into a cgroup (what `runc run` does to its init, and a restore to every
//! process it recreates) takes the kernel's global cgroup thread-group lock for writing.
//! That lock is per-CPU and fast for readers, so each write waits for an RCU grace
//! period: 7–16 ms per move on these machines, several times on every create and restore.
//! With `favordynmods` (kernel 6.0 and later) the lock stays in its slow reader mode, and
//! a move costs what its work costs (≈ 0.1 ms); forks and exits host-wide pay a little
//! more for their read. The lock is global, so the option on the cgroup2 mount speeds
//! up the v1 hierarchies' moves of a hybrid host too. Measured in docs/checkpoints.md.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// The cgroup2 mount's path and its superblock options, if there is one.
fn cgroup2_mount() -> Result<Option<(PathBuf, String)>> {
    let infos = procfs::process::Process::myself()
        .and_then(|me| me.mountinfo())
        .map_err(|e| Error::Command {
            command: "read /proc/self/mountinfo".into(),
            detail: e.to_string(),
        })?;
    Ok(infos.into_iter().find(|m| m.fs_type == "cgroup2").map(|m| {
        let opts = m
            .super_options
            .iter()
            .filter(|(k, _)| k.as_str() != "rw" && k.as_str() != "ro")
            .map(|(k, v)| match v {
                Some(v) => format!("{k}={v}"),
                None => k.clone(),
            })
            .collect::<Vec<_>>()
            .join(",");
        (m.mount_point, opts)
    }))
}

/// Whether superblock options `opts` already favour dynamic modifications.
fn favoured(opts: &str) -> bool {
    opts.split(',').any(|o| o == "favordynmods")
}

/// `opts` with `favordynmods` added (every option the mount has is kept: a remount sets
/// the cgroup2 root's flags to exactly the ones it is given).
fn with_favordynmods(opts: &str) -> String {
    if opts.is_empty() {
        "favordynmods".into()
    } else {
        format!("{opts},favordynmods")
    }
}

/// Turns `favordynmods` on for the host's cgroup2 mount; true if this call turned it on.
/// A host without cgroup2, or a kernel that does not know the option, is left as it is
/// (false, with the kernel's refusal as the error for the latter).
pub fn favor_dynmods() -> Result<bool> {
    let Some((path, opts)) = cgroup2_mount()? else {
        return Ok(false);
    };
    if favoured(&opts) {
        return Ok(false);
    }
    let data = with_favordynmods(&opts);
    nix::mount::mount(
        None::<&str>,
        &path,
        None::<&str>,
        nix::mount::MsFlags::MS_REMOUNT,
        Some(data.as_str()),
    )
    .map_err(|e| Error::Command {
        command: format!("mount -o remount,{data} {}", path.display()),
        detail: e.to_string(),
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_keeps_its_options() {
        assert_eq!(with_favordynmods(""), "favordynmods");
        assert_eq!(
            with_favordynmods("nsdelegate,memory_recursiveprot"),
            "nsdelegate,memory_recursiveprot,favordynmods"
        );
        assert!(favoured("nsdelegate,favordynmods"));
        assert!(!favoured("nsdelegate"));
    }

    /// As root: the host's cgroup2 mount favours dynamic modifications afterwards, and
    /// keeps the options it had. (Host-wide and only ever turned on, as every daemon of
    /// the test suite does at start; nothing to undo.)
    #[test]
    fn the_host_cgroup2_mount_ends_up_favouring_moves() {
        testkit::needs_root("remounting the host's cgroup2 mount");
        let Some((_, before)) = cgroup2_mount().unwrap() else {
            return; // a host without cgroup2 has nothing to tune
        };
        favor_dynmods().unwrap();
        let (_, after) = cgroup2_mount().unwrap().unwrap();
        assert!(favoured(&after), "{after}");
        for opt in before.split(',').filter(|o| !o.is_empty()) {
            assert!(after.split(',').any(|a| a == opt), "{opt} kept: {after}");
        }
        assert!(!favor_dynmods().unwrap(), "a second call changes nothing");
    }
}
