//! A recording fake of [`Host`]: logs each call as one line and fails on request.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::sync::Mutex;

use super::{ContainerState, ContainerStatus, Host, Usage};
use crate::error::{Error, Result};
use crate::layout::SandboxPaths;
use crate::net::NetAlloc;

/// Records host calls; `fail_on("runc_run")` makes that operation fail.
#[derive(Debug, Default)]
pub struct FakeHost {
    calls: Mutex<Vec<String>>,
    fail: Mutex<BTreeSet<String>>,
    running: Mutex<BTreeSet<String>>,
}

impl FakeHost {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every later call of operation `op` fail.
    pub fn fail_on(&self, op: &str) {
        self.fail.lock().unwrap().insert(op.into());
    }

    /// The calls so far, one line each (`"op arg"`).
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    /// The operation names of the calls so far.
    pub fn ops(&self) -> Vec<String> {
        self.calls()
            .iter()
            .map(|c| c.split(' ').next().unwrap_or("").to_string())
            .collect()
    }

    pub fn clear(&self) {
        self.calls.lock().unwrap().clear();
    }

    pub(super) fn call(&self, op: &str, arg: &str) -> Result<()> {
        self.calls.lock().unwrap().push(format!("{op} {arg}"));
        if self.fail.lock().unwrap().contains(op) {
            return Err(Error::Command {
                command: op.into(),
                detail: "injected failure".into(),
            });
        }
        Ok(())
    }
}

impl Host for FakeHost {
    fn mount_run_dir(&self, _paths: &SandboxPaths) -> Result<()> {
        self.call("mount_run_dir", "")
    }
    fn unmount_run_dir(&self, _paths: &SandboxPaths) -> Result<()> {
        self.call("unmount_run_dir", "")
    }
    fn create_disk(&self, disk: &str, base: &str, _size_mb: u64) -> Result<()> {
        self.call("create_disk", &format!("{disk} {base}"))
    }
    fn mount_disk(&self, disk: &str, _paths: &SandboxPaths) -> Result<()> {
        self.call("mount_disk", disk)
    }
    fn adopt_disk(&self, disk: &str, _paths: &SandboxPaths) -> Result<()> {
        self.call("adopt_disk", disk)
    }
    fn unmount_disk(&self, disk: &str, _paths: &SandboxPaths) -> Result<()> {
        self.call("unmount_disk", disk)
    }
    fn delete_disk(&self, disk: &str) -> Result<()> {
        self.call("delete_disk", disk)
    }
    fn disk_held_writes(&self, disk: &str) -> Result<u64> {
        self.call("disk_held_writes", disk).map(|()| 0)
    }
    fn netns_add(&self, name: &str) -> Result<()> {
        self.call("netns_add", name)
    }
    fn netns_delete(&self, name: &str) -> Result<()> {
        self.call("netns_delete", name)
    }
    fn veth_add(&self, netns: &str, alloc: &NetAlloc) -> Result<()> {
        self.call("veth_add", &format!("{netns} {}", alloc.host_if))
    }
    fn veth_delete(&self, alloc: &NetAlloc) -> Result<()> {
        self.call("veth_delete", &alloc.host_if)
    }
    fn nft_prepare(&self) -> Result<()> {
        self.call("nft_prepare", "")
    }
    fn nft_apply(&self, script: &str) -> Result<()> {
        self.call("nft_apply", &script.lines().count().to_string())
    }
    fn nft_remove(&self, commands: &[String]) -> Result<()> {
        self.call("nft_remove", &commands.len().to_string())
    }
    fn write_bundle(
        &self,
        _paths: &SandboxPaths,
        config: &[u8],
        resolv_conf: Option<crate::net::Nameserver>,
    ) -> Result<()> {
        let resolv = if resolv_conf.is_some() {
            " resolv.conf"
        } else {
            ""
        };
        self.call("write_bundle", &format!("{}{resolv}", config.len()))
    }
    fn nofile_limit(&self) -> u64 {
        1024
    }
    fn runc_run(&self, _root: &Path, id: &str, _paths: &SandboxPaths) -> Result<()> {
        self.call("runc_run", id)?;
        self.running.lock().unwrap().insert(id.into());
        Ok(())
    }
    fn runc_kill(&self, _root: &Path, id: &str, signal: &str) -> Result<()> {
        self.call("runc_kill", &format!("{id} {signal}"))
    }
    fn runc_delete(&self, _root: &Path, id: &str) -> Result<()> {
        self.call("runc_delete", id)?;
        self.running.lock().unwrap().remove(id);
        Ok(())
    }
    fn runc_state(&self, _root: &Path, id: &str) -> Result<Option<ContainerState>> {
        self.call("runc_state", id)?;
        let running = self.running.lock().unwrap().contains(id);
        Ok(running.then_some(ContainerState {
            status: ContainerStatus::Running,
            pid: Some(1),
        }))
    }
    fn runc_list(&self, _root: &Path) -> Result<Vec<String>> {
        self.call("runc_list", "")?;
        Ok(self.running.lock().unwrap().iter().cloned().collect())
    }
    fn init_exited(&self, _paths: &SandboxPaths) -> Option<Arc<AtomicBool>> {
        None
    }
    fn cgroup_remove(&self, cgroup: &str) -> Result<()> {
        self.call("cgroup_remove", cgroup)
    }
    fn cgroup_usage(&self, cgroup: &str) -> Result<Usage> {
        self.call("cgroup_usage", cgroup)?;
        Ok(Usage::default())
    }
    fn cgroup_freeze(&self, cgroup: &str, frozen: bool) -> Result<()> {
        let op = if frozen {
            "cgroup_freeze"
        } else {
            "cgroup_thaw"
        };
        self.call(op, cgroup)
    }
    fn netns_exists(&self, name: &str) -> bool {
        self.call("netns_exists", name).is_ok()
    }
}
