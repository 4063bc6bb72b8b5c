//! Cleanup at daemon start: removes what sandboxes of this data directory left behind
//! when their owner died. Running sandboxes are left alone (they are adopted instead).

use tracing::info;

use crate::error::Result;
use crate::lifecycle::{self, Ctx};
use crate::net;

/// Destroys every sandbox of the data directory whose container is not running (unless
/// it was stopped on request or is paused by an unfinished checkpoint), and
/// removes runc containers and address leases that no sandbox directory owns. Returns the
/// ids cleaned up.
pub fn cleanup(ctx: &Ctx<'_>) -> Result<Vec<String>> {
    let mut cleaned = Vec::new();
    for id in sandbox_ids(ctx) {
        // Paused ones are mid-checkpoint: adopting resumes them. `interrupted` first waits
        // for runc commands the dead daemon left running, so the state read after it is
        // settled (a container being dumped is neither reported running nor paused).
        let keep = lifecycle::load(ctx, &id)
            .and_then(|r| {
                // Stopped on request, it keeps its disk and network for a later start.
                Ok(r.stopped
                    || crate::checkpoint::interrupted(ctx, &r)?
                    || lifecycle::is_running(ctx, &r)?)
            })
            .unwrap_or(false);
        if !keep {
            info!(%id, "removing stale sandbox");
            lifecycle::destroy(ctx, &id)?;
            cleaned.push(id);
        }
    }
    let root = ctx.layout.runc_root();
    for id in ctx.host.runc_list(&root)? {
        if !ctx.layout.sandbox(&id).dir.exists() {
            info!(%id, "removing orphan container");
            ctx.host.runc_kill(&root, &id, "KILL")?;
            ctx.host.runc_delete(&root, &id)?;
            cleaned.push(id);
        }
    }
    release_orphan_leases(ctx)?;
    Ok(cleaned)
}

fn sandbox_ids(ctx: &Ctx<'_>) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(ctx.layout.sandboxes()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// Leases whose owner (a sandbox directory of this data directory) no longer exists.
fn release_orphan_leases(ctx: &Ctx<'_>) -> Result<()> {
    let prefix = format!("{}/", ctx.layout.sandboxes().display());
    for (alloc, owner) in net::leases_owned(ctx.net, &prefix) {
        if !std::path::Path::new(&owner).exists() {
            ctx.host.nft_remove(&net::sandbox_rules_removal(&alloc))?;
            ctx.host.veth_delete(&alloc)?;
            net::release(&alloc, &owner)?;
        }
    }
    Ok(())
}
