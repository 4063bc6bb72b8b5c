//! What running sandboxes use (CPU, memory, disk, network), read when asked: for
//! `GET /v1/sandboxes/{id}/stats` and the per-sandbox series of `/metrics`. Reading is not
//! activity: it neither moves an idle timeout nor resumes a suspended sandbox.

use api_types::{Sandbox, SandboxStats};
use model::State;

use super::Manager;
use crate::backend::ResourceUse;
use crate::error::{Error, Result};

impl Manager {
    /// A running sandbox's resource use now.
    pub async fn stats(&self, id_or_name: &str) -> Result<SandboxStats> {
        self.check_open()?;
        let view = self.find(id_or_name)?.view();
        if view.state != State::Running {
            return Err(Error::WrongState {
                id: view.id,
                state: view.state,
            });
        }
        let used = self.backend.stats(&view.id).await?;
        Ok(stats_of(&view, used))
    }

    /// Every running sandbox with what it uses (one that cannot be read now, e.g. it is
    /// being checkpointed, is left out).
    pub async fn all_stats(&self) -> Vec<(Sandbox, SandboxStats)> {
        let running: Vec<Sandbox> = self
            .registry()
            .entries
            .values()
            .map(|e| e.view())
            .filter(|v| v.state == State::Running)
            .collect();
        let mut out = Vec::with_capacity(running.len());
        for view in running {
            if let Ok(used) = self.backend.stats(&view.id).await {
                let stats = stats_of(&view, used);
                out.push((view, stats));
            }
        }
        out
    }
}

fn stats_of(view: &Sandbox, u: ResourceUse) -> SandboxStats {
    SandboxStats {
        id: view.id.clone(),
        sampled_at: super::now_rfc3339(),
        cpu_seconds: u.cpu_seconds,
        cpus: view.cpus,
        memory_bytes: u.memory_bytes,
        memory_limit_bytes: u.memory_limit_bytes,
        pids: u.pids,
        oom_kills: u.oom_kills,
        disk_used_bytes: u.disk_used_bytes,
        disk_total_bytes: u.disk_total_bytes,
        net_rx_bytes: u.net_rx_bytes,
        net_tx_bytes: u.net_tx_bytes,
        net_rx_packets: u.net_rx_packets,
        net_tx_packets: u.net_tx_packets,
    }
}
