//! Turns an [`ExecRequest`] into a running child: environment, user, working directory,
//! program lookup, its own session and process group, and pipes (or a terminal) for stdio.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::{Gid, Pid, Uid};
use proto::agent::{AgentError, ErrorKind, ExecRequest, PtySize, StdinMode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

use super::errors::{check_path, invalid, io_error};
use super::reaper::{ExitReceiver, Reaper};
use super::user::{self, Credentials};

/// Where the agent writes a child's input.
pub type Input = Box<dyn AsyncWrite + Send + Unpin>;
/// Where the agent reads a child's output.
pub type Source = Box<dyn AsyncRead + Send + Unpin>;

/// A started child and the agent's ends of its stdio.
pub struct Child {
    pub pid: i32,
    pub exit: ExitReceiver,
    pub stdin: Option<Input>,
    pub stdout: Source,
    pub stderr: Source,
    /// Started on a terminal: stdin takes protocol frames (see [`super::pty`]).
    pub terminal: bool,
}

/// What a request resolved to, before anything is started.
struct Plan {
    program: PathBuf,
    env: BTreeMap<String, String>,
    cwd: PathBuf,
    creds: Option<Credentials>,
}

/// What every process starts from unless its request says otherwise: the base
/// environment, and the image's default user and working directory.
#[derive(Debug, Clone, Default)]
pub struct Base {
    pub env: Vec<(String, String)>,
    pub user: Option<String>,
    pub cwd: Option<String>,
}

pub fn spawn(reaper: &Reaper, req: &ExecRequest, base: &Base) -> Result<Child, AgentError> {
    let plan = plan(req, base, Path::new("/etc"))?;
    let mut cmd = command(&plan, req, None);
    let (mut child, exit) = reaper
        .spawn(&mut cmd)
        .map_err(|e| io_error(&req.command, &e))?;
    // Pids fit in i32 (pid_max <= 2^22).
    let pid = child.id() as i32;
    match async_pipes(&mut child, req.stdin != StdinMode::Null) {
        Ok((stdin, stdout, stderr)) => Ok(Child {
            pid,
            exit,
            stdin: stdin.map(|s| Box::new(s) as Input),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            terminal: false,
        }),
        Err(e) => {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            Err(io_error("stdio pipes", &e))
        }
    }
}

/// Starts `req` on a new terminal of `size` (its controlling terminal, in a session of
/// its own), with a relay process holding the terminal's master side (see [`super::pty`]);
/// `TERM` defaults to `xterm-256color`. The relay's stdin takes protocol frames; its
/// stdout is the terminal's output. The process's exit is the program's.
pub fn spawn_pty(
    reaper: &Reaper,
    req: &ExecRequest,
    base: &Base,
    size: PtySize,
) -> Result<Child, AgentError> {
    let mut plan = plan(req, base, Path::new("/etc"))?;
    plan.env
        .entry("TERM".into())
        .or_insert_with(|| "xterm-256color".into());
    let pty = super::pty::open_pty(size).map_err(|e| io_error("terminal", &e))?;
    let clone = || pty.slave.try_clone().map_err(|e| io_error("terminal", &e));
    let stdio = [clone()?, clone()?, clone()?];
    let mut cmd = command(&plan, req, Some(stdio));
    let spawned = reaper.spawn(&mut cmd);
    // The program has its copies; the agent keeps no end of the terminal.
    drop(cmd);
    drop(pty.slave);
    let (program, exit) = spawned.map_err(|e| io_error(&req.command, &e))?;
    // Pids fit in i32 (pid_max <= 2^22).
    let pid = program.id() as i32;
    // The relay is started after the program, so that CRIU meets the program first.
    match start_relay(reaper, pty.master) {
        Ok((stdin, stdout)) => Ok(Child {
            pid,
            exit,
            stdin: Some(Box::new(stdin)),
            stdout: Box::new(stdout),
            stderr: Box::new(tokio::io::empty()),
            terminal: true,
        }),
        Err(e) => {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            Err(io_error("terminal relay", &e))
        }
    }
}

/// Starts the agent binary as a terminal relay for `master` (its fd 3), in a session of
/// its own; returns the agent's ends of its stdin and stdout.
fn start_relay(
    reaper: &Reaper,
    master: OwnedFd,
) -> std::io::Result<(pipe::Sender, pipe::Receiver)> {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg(super::pty::KEEPER_ARG)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let raw = std::os::fd::AsRawFd::as_raw_fd(&master);
    // SAFETY: the closure runs in the forked child before exec and only makes raw
    // syscalls (setsid, dup2) on a descriptor number taken before the fork.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            // dup2 leaves the copy without close-on-exec: the relay inherits it as fd 3.
            if nix::libc::dup2(raw, super::pty::MASTER_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawned = reaper.spawn(&mut cmd);
    drop(master);
    let (mut child, _exit) = spawned?;
    let missing = || std::io::Error::other("missing pipe");
    let stdin: OwnedFd = child.stdin.take().ok_or_else(missing)?.into();
    let stdout: OwnedFd = child.stdout.take().ok_or_else(missing)?.into();
    Ok((
        pipe::Sender::from_owned_fd(stdin)?,
        pipe::Receiver::from_owned_fd(stdout)?,
    ))
}

type Pipes = (Option<pipe::Sender>, pipe::Receiver, pipe::Receiver);

/// The agent's ends of the child's stdio pipes, made non-blocking for the event loop.
/// Without `keep_stdin` the stdin pipe is closed, so the child reads end of file.
fn async_pipes(child: &mut std::process::Child, keep_stdin: bool) -> std::io::Result<Pipes> {
    let missing = || std::io::Error::other("missing pipe");
    let stdin = child.stdin.take().filter(|_| keep_stdin);
    let stdin = stdin
        .map(|s| pipe::Sender::from_owned_fd(s.into()))
        .transpose()?;
    let stdout: OwnedFd = child.stdout.take().ok_or_else(missing)?.into();
    let stderr: OwnedFd = child.stderr.take().ok_or_else(missing)?.into();
    Ok((
        stdin,
        pipe::Receiver::from_owned_fd(stdout)?,
        pipe::Receiver::from_owned_fd(stderr)?,
    ))
}

fn plan(req: &ExecRequest, base: &Base, etc: &Path) -> Result<Plan, AgentError> {
    check_strings(req)?;
    let creds = req
        .user
        .as_deref()
        .or(base.user.as_deref())
        .map(|u| user::resolve(u, etc))
        .transpose()?;
    let env = environment(&base.env, creds.as_ref(), &req.env)?;
    let cwd = working_dir(req.cwd.as_deref().or(base.cwd.as_deref()), creds.as_ref())?;
    let program = find_program(&req.command, env.get("PATH").map(String::as_str), &cwd)?;
    Ok(Plan {
        program,
        env,
        cwd,
        creds,
    })
}

fn check_strings(req: &ExecRequest) -> Result<(), AgentError> {
    if req.command.is_empty() {
        return Err(invalid("command is empty"));
    }
    let all = std::iter::once(&req.command).chain(&req.args);
    if all
        .chain(req.env.iter().map(|(_, v)| v))
        .any(|s| s.contains('\0'))
    {
        return Err(invalid(
            "command, arguments and environment must not contain NUL bytes",
        ));
    }
    Ok(())
}

/// Base environment, then the user's HOME/USER/LOGNAME, then the request's variables.
fn environment(
    base: &[(String, String)],
    creds: Option<&Credentials>,
    extra: &[(String, String)],
) -> Result<BTreeMap<String, String>, AgentError> {
    let mut env: BTreeMap<String, String> = base.iter().cloned().collect();
    if let Some(c) = creds {
        env.insert("HOME".into(), c.home.clone().unwrap_or_else(|| "/".into()));
        if let Some(name) = &c.name {
            env.insert("USER".into(), name.clone());
            env.insert("LOGNAME".into(), name.clone());
        }
    }
    for (k, v) in extra {
        if k.is_empty() || k.contains(['=', '\0']) {
            return Err(invalid(format!("invalid environment variable name {k:?}")));
        }
        env.insert(k.clone(), v.clone());
    }
    Ok(env)
}

fn working_dir(cwd: Option<&str>, creds: Option<&Credentials>) -> Result<PathBuf, AgentError> {
    let Some(cwd) = cwd else {
        let home = creds.and_then(|c| c.home.as_deref()).map(Path::new);
        return Ok(home
            .filter(|h| h.is_dir())
            .unwrap_or(Path::new("/"))
            .to_path_buf());
    };
    let path = check_path(cwd)?;
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(path.to_path_buf()),
        Ok(_) => Err(AgentError::new(
            ErrorKind::NotADirectory,
            format!("working directory {cwd}: not a directory"),
        )),
        Err(e) => Err(io_error(&format!("working directory {cwd}"), &e)),
    }
}

/// Resolves the program the way a shell would, so a missing one is a clear error.
fn find_program(command: &str, path_var: Option<&str>, cwd: &Path) -> Result<PathBuf, AgentError> {
    if command.contains('/') {
        let path = cwd.join(command);
        return match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => Err(AgentError::new(
                ErrorKind::IsADirectory,
                format!("{command}: is a directory"),
            )),
            Ok(_) => Ok(path),
            Err(e) => Err(io_error(command, &e)),
        };
    }
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    path_var
        .unwrap_or("")
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(command))
        .find(|p| executable(p))
        .ok_or_else(|| {
            AgentError::new(
                ErrorKind::NotFound,
                format!("{command}: command not found in PATH"),
            )
        })
}

/// The command for `plan`, in a session of its own: stdio on pipes, or on a terminal's
/// slave side (`tty`: stdin, stdout and stderr), which becomes its controlling terminal.
fn command(plan: &Plan, req: &ExecRequest, tty: Option<[OwnedFd; 3]>) -> Command {
    let mut cmd = Command::new(&plan.program);
    cmd.arg0(&req.command)
        .args(&req.args)
        .env_clear()
        .envs(&plan.env)
        .current_dir(&plan.cwd);
    let on_terminal = tty.is_some();
    match tty {
        Some([i, o, e]) => cmd.stdin(i).stdout(o).stderr(e),
        // A pipe even for `Null` (its write end is closed at once): the sandbox may have
        // no /dev/null.
        None => cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::piped()),
    };
    let ids = plan.creds.as_ref().map(|c| {
        let groups: Vec<Gid> = c.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        (Uid::from_raw(c.uid), Gid::from_raw(c.gid), groups)
    });
    // SAFETY: the closure runs in the forked child before exec and only makes raw
    // syscalls (setsid, ioctl, setgroups, setgid, setuid) on data prepared before the
    // fork: no allocation, no locks.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            // The terminal on stdin becomes the new session's controlling terminal.
            if on_terminal && nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((uid, gid, groups)) = &ids {
                nix::unistd::setgroups(groups)?;
                nix::unistd::setgid(*gid)?;
                nix::unistd::setuid(*uid)?;
            }
            Ok(())
        });
    }
    cmd
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn program_lookup() {
        let root = Path::new("/");
        assert_eq!(
            find_program("sh", Some("/nope:/bin"), root).unwrap(),
            Path::new("/bin/sh")
        );
        let err = find_program("no-such-cmd-x", Some("/bin"), root).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
        let err = find_program("/bin/nope", None, root).unwrap_err();
        assert_eq!(err.message, "/bin/nope: no such file or directory");
    }

    #[test]
    fn environment_merge() {
        let base = [
            ("PATH".to_string(), "/bin".to_string()),
            ("A".into(), "1".into()),
        ];
        let env = environment(&base, None, &[("A".into(), "2".into())]).unwrap();
        assert_eq!(env.get("A").map(String::as_str), Some("2"));
        assert!(environment(&base, None, &[("A=B".into(), "2".into())]).is_err());
    }

    #[test]
    fn working_dir_errors() {
        assert_eq!(
            working_dir(Some("/nonexistent-x"), None).unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            working_dir(Some("/etc/passwd"), None).unwrap_err().kind,
            ErrorKind::NotADirectory
        );
        assert_eq!(working_dir(None, None).unwrap(), Path::new("/"));
    }
}
