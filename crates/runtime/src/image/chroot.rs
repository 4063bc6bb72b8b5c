//! Running build commands, and a chroot with /proc, /dev and DNS for package managers.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, IoContext, Result};

/// Runs a build command; on failure the end of its output is the error.
pub fn run_logged(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .output()
        .map_err(|e| Error::Image(format!("{:?}: {e}", cmd.get_program())))?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text += &String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = text.lines().rev().take(8).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(Error::Image(format!(
        "{:?} failed ({}): {}",
        cmd.get_program(),
        out.status,
        tail.join("\n")
    )))
}

/// A build root with /proc, /dev and /etc/resolv.conf set up for package managers;
/// everything mounted is unmounted when dropped.
pub struct Chroot {
    root: PathBuf,
    mounts: Vec<PathBuf>,
}

impl Chroot {
    pub fn enter(root: &Path) -> Result<Chroot> {
        let mut c = Chroot {
            root: root.to_path_buf(),
            mounts: Vec::new(),
        };
        c.mount(&["-t", "proc", "proc"], "proc")?;
        c.mount(&["--bind", "/dev"], "dev")?;
        let resolv = root.join("etc/resolv.conf");
        let _ = std::fs::remove_file(&resolv);
        std::fs::copy("/etc/resolv.conf", &resolv).at(&resolv)?;
        Ok(c)
    }

    fn mount(&mut self, args: &[&str], dest: &str) -> Result<()> {
        let target = self.root.join(dest);
        std::fs::create_dir_all(&target).at(&target)?;
        run_logged(Command::new("mount").args(args).arg(&target))?;
        self.mounts.push(target);
        Ok(())
    }

    /// Runs `argv` inside the chroot, non-interactively.
    pub fn run(&self, argv: &[&str]) -> Result<()> {
        run_logged(
            Command::new("chroot")
                .arg(&self.root)
                .args(argv)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .env(
                    "PATH",
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ),
        )
    }
}

impl Drop for Chroot {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        let _ = std::fs::write(self.root.join("etc/resolv.conf"), "");
    }
}
