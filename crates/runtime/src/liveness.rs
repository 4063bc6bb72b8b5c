//! Whether the parts a running sandbox cannot live without are still alive: its agent (the
//! container's init) and its disk server.
//!
//! A probe reads files only — runc's `state.json`, the disk server's pid file and `/proc` —
//! so a daemon can afford one per sandbox every second. A paused or checkpointed container
//! is alive (its processes are frozen, not gone); a zombie is dead. Process identity is
//! checked by start time (runc records its init's) or command line (the disk server's
//! names its run directory), so a recycled pid is not taken for the original.

use std::path::Path;

use serde::Deserialize;

use crate::error::{IoContext, Result};
use crate::layout::{Layout, Record};

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// The container's init (the agent) exited or was killed.
    AgentDied {
        pid: Option<u32>,
    },
    /// The process serving the sandbox's disk exited or was killed.
    DiskServerDied {
        pid: Option<u32>,
    },
}

impl Liveness {
    /// Why the sandbox is dead, for users; `None` when alive.
    pub fn reason(&self) -> Option<String> {
        let pid = |p: &Option<u32>| p.map_or_else(String::new, |p| format!(", host pid {p}"));
        match self {
            Liveness::Alive => None,
            Liveness::AgentDied { pid: p } => {
                Some(format!("Its agent (PID 1 of the sandbox{}) died", pid(p)))
            }
            Liveness::DiskServerDied { pid: p } => Some(format!(
                "Its disk server (the process serving its root disk{}) died",
                pid(p)
            )),
        }
    }
}

/// The part of runc's `state.json` a probe needs.
#[derive(Debug, Deserialize)]
struct RuncState {
    init_process_pid: u32,
    init_process_start: u64,
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The state letter (`R`, `S`, `D`, `T`, `Z`, `X`, ...).
    pub state: char,
    /// Start time in clock ticks after boot.
    pub start: u64,
}

impl ProcStat {
    fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// What `/proc/<pid>/stat` says of `pid`, if it exists.
fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()?;
    Some(ProcStat {
        state: stat.state,
        start: stat.starttime,
    })
}

/// The host pid of a container's init (the agent), from runc's state file; `None` when
/// the container is not there.
pub fn init_pid(layout: &Layout, container: &str) -> Option<u32> {
    let state_file = layout.runc_root().join(container).join("state.json");
    let bytes = std::fs::read(state_file).ok()?;
    serde_json::from_slice::<RuncState>(&bytes)
        .ok()
        .map(|s| s.init_process_pid)
}

/// Probes sandbox `id` of `layout`, whose container should be running.
pub fn probe(layout: &Layout, id: &str) -> Result<Liveness> {
    let paths = layout.sandbox(id);
    let record = Record::load(&paths.record())?;
    let state_file = layout
        .runc_root()
        .join(&record.names.container)
        .join("state.json");
    let agent = match std::fs::read(&state_file) {
        Ok(bytes) => serde_json::from_slice::<RuncState>(&bytes).ok(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).at(&state_file),
    };
    let Some(agent) = agent else {
        return Ok(Liveness::AgentDied { pid: None });
    };
    let pid = agent.init_process_pid;
    let alive = proc_stat(pid).is_some_and(|s| !s.exited() && s.start == agent.init_process_start);
    if !alive {
        return Ok(Liveness::AgentDied { pid: Some(pid) });
    }
    disk_server(&paths.disk())
}

/// Whether the disk server of run directory `run_dir` is alive.
fn disk_server(run_dir: &Path) -> Result<Liveness> {
    let pid_file = disk::layout::pid_file(run_dir);
    let pid = match std::fs::read_to_string(&pid_file) {
        Ok(text) => text.trim().parse::<u32>().ok(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).at(&pid_file),
    };
    let Some(pid) = pid else {
        return Ok(Liveness::DiskServerDied { pid: None });
    };
    let serves_it = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.cmdline())
        .is_ok_and(|cmd| cmd.iter().any(|arg| names(arg, run_dir)));
    let alive = serves_it && proc_stat(pid).is_some_and(|s| !s.exited());
    Ok(if alive {
        Liveness::Alive
    } else {
        Liveness::DiskServerDied { pid: Some(pid) }
    })
}

/// Whether command-line argument `arg` names directory `dir` (a daemon started with
/// another spelling of the data directory may have started the server).
fn names(arg: &str, dir: &Path) -> bool {
    if Path::new(arg) == dir {
        return true;
    }
    let same = |a: &Path| a.canonicalize().ok();
    arg.ends_with("disk") && same(Path::new(arg)).is_some_and(|a| Some(a) == same(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_with_its_start_time() {
        let me = proc_stat(std::process::id()).expect("own stat");
        assert!(!me.exited());
        assert_eq!(
            proc_stat(std::process::id()).map(|s| s.start),
            Some(me.start)
        );
    }

    #[test]
    fn reasons_name_the_part() {
        assert_eq!(Liveness::Alive.reason(), None);
        let agent = Liveness::AgentDied { pid: Some(7) }.reason().unwrap();
        assert!(agent.contains("agent") && agent.contains("7"), "{agent}");
        let disk = Liveness::DiskServerDied { pid: None }.reason().unwrap();
        assert!(disk.contains("disk server"), "{disk}");
    }

    #[test]
    fn a_missing_sandbox_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(probe(&Layout::new(dir.path()), "nope").is_err());
    }

    #[test]
    fn an_argument_names_a_dir_by_any_spelling() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("disk");
        std::fs::create_dir(&run).unwrap();
        let odd = format!("{}/./disk", dir.path().display());
        assert!(names(run.to_str().unwrap(), &run));
        assert!(names(&odd, &run));
        assert!(!names("--dir", &run));
        assert!(!names(dir.path().to_str().unwrap(), &run));
    }

    #[test]
    fn a_missing_pid_file_means_the_server_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            disk_server(dir.path()).unwrap(),
            Liveness::DiskServerDied { pid: None }
        );
        std::fs::write(disk::layout::pid_file(dir.path()), "1\n").unwrap();
        assert_eq!(
            disk_server(dir.path()).unwrap(),
            Liveness::DiskServerDied { pid: Some(1) }
        );
    }
}
