//! Sandboxes started from snapshots: one (`create` with `snapshot_id`) or many at once
//! (fork fan-out, with bounded parallelism; each child succeeds or fails on its own).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;

use super::admission::{Refusal, Want, BASELINE_NEED_MB};
use super::child::Child;
use super::create::validate;
use super::new_id;
use super::{lock, now_rfc3339, Entry, Manager};
use api_types::{
    ChildError, CreateSandbox, ForkChild, ForkInfo, ForkRequest, ForkResult, NetworkModeName,
    NetworkView, Sandbox,
};
use model::{Op, SnapshotType, State};

use super::pool::Parked;
use crate::backend::{Booted, NetworkSpec, RestoreFrom};
use crate::error::{Error, Result};
use crate::snapshots::SnapshotRecord;
use crate::store::SandboxRow;

/// What an admitted child starts in: a ready fork of the pool, or room of its own.
enum Slot {
    Parked(Parked),
    Admitted(Arc<Entry>),
}

/// Children restored at once by one fork (restores are CPU-bound).
pub const FORK_PARALLELISM: usize = 4;
/// Most children one fork request may ask for.
pub const MAX_FORK: u32 = 256;
/// Largest `first_index` (a gateway's fan-out numbers children across nodes).
pub const MAX_FIRST_INDEX: u32 = 1 << 20;

/// Refuses changes to what a memory snapshot pins (422, saying why).
fn check_pinned(rec: &SnapshotRecord, req: &CreateSandbox) -> Result<()> {
    if rec.view.kind != SnapshotType::Memory {
        return Ok(());
    }
    let b = &rec.boot;
    let mut changed = Vec::new();
    if req.cpus.is_some_and(|c| c != b.cpus) {
        changed.push(format!("cpus (pinned at {})", b.cpus));
    }
    if req.memory_mb.is_some_and(|m| m != b.memory_mb) {
        changed.push(format!("memory_mb (pinned at {})", b.memory_mb));
    }
    if req.disk_mb.is_some_and(|d| d != b.disk_mb) {
        changed.push(format!("disk_mb (pinned at {})", b.disk_mb));
    }
    if changed.is_empty() {
        return Ok(());
    }
    Err(Error::Unsupported(format!(
        "Memory snapshot {} pins image, resources and entrypoint (its processes resume as \
         they were); cannot change {}",
        rec.view.id,
        changed.join(", ")
    )))
}

fn network_spec(req: &CreateSandbox) -> Result<Option<NetworkSpec>> {
    let given = req.network.is_some()
        || req.allow_internet_access.is_some()
        || req.allow_out.is_some()
        || req.deny_out.is_some();
    if !given {
        return Ok(None);
    }
    let net = super::create::network_of(req)?;
    Ok(Some(NetworkSpec {
        internet: net.mode == NetworkModeName::Internet,
        allow_out: net.allow_out,
        deny_out: net.deny_out,
    }))
}

/// The record of child `c` of `rec`, as sandbox `id`.
fn child_row(rec: &SnapshotRecord, c: &Child, id: String) -> Result<SandboxRow> {
    let mut boot = rec.boot.clone();
    boot.id = id;
    boot.env.extend(c.env.clone());
    boot.secrets.clone_from(&c.secrets);
    if rec.view.kind == SnapshotType::Filesystem {
        boot.cpus = c.cpus.unwrap_or(boot.cpus);
        boot.memory_mb = c.memory_mb.unwrap_or(boot.memory_mb);
        boot.disk_mb = c.disk_mb.unwrap_or(boot.disk_mb);
    }
    if let Some(n) = &c.network {
        boot.network = n.clone();
    }
    let now = now_rfc3339();
    let mode = if boot.network.internet {
        NetworkModeName::Internet
    } else {
        NetworkModeName::None
    };
    let view = Sandbox {
        id: boot.id.clone(),
        name: c.name.clone(),
        state: State::Creating,
        image: rec.view.image.clone(),
        snapshot_id: Some(rec.view.id.clone()),
        cpus: boot.cpus,
        memory_mb: boot.memory_mb,
        disk_mb: boot.disk_mb,
        timeout_secs: c.timeout_secs,
        on_timeout: Some(super::reaper::on_timeout(c.on_timeout, c.name.as_deref())),
        expires_at: None,
        network: NetworkView {
            mode,
            address: None,
            allow_out: boot.network.allow_out.clone(),
            deny_out: boot.network.deny_out.clone(),
        },
        labels: c.labels.clone(),
        created_at: now.clone(),
        last_active_at: now,
        fork: Some(ForkInfo {
            index: c.index,
            parent_snapshot_id: rec.view.id.clone(),
            fork_id: c.fork_id.clone(),
        }),
        error: None,
        entrypoint: None,
        // A fork's ports are private whatever its parent's were.
        public_ports: false,
        exposed_ports: None,
        disk_full: false,
        access_epoch: 0,
    };
    Ok(SandboxRow { view, boot })
}

fn child_error(e: &Error) -> ChildError {
    ChildError {
        code: e.status_code().1.into(),
        message: e.message(),
    }
}

impl Manager {
    /// `POST /v1/sandboxes` with `snapshot_id`.
    pub async fn create_from_snapshot(&self, req: CreateSandbox) -> Result<Sandbox> {
        self.check_open()?;
        validate(&req)?;
        self.check_guarded_egress(&super::create::network_of(&req)?.allow_out)?;
        let snap = req.snapshot_id.clone().unwrap_or_default();
        let rec = self.usable_snapshot(&snap).await?;
        check_pinned(&rec, &req)?;
        let child = Child {
            index: 0,
            name: req.name.clone(),
            env: req.env.clone(),
            secrets: req.secrets.clone(),
            labels: req.labels.clone(),
            timeout_secs: req.timeout_secs.unwrap_or(0),
            on_timeout: req.on_timeout,
            cpus: req.cpus,
            memory_mb: req.memory_mb,
            disk_mb: req.disk_mb,
            network: network_spec(&req)?,
            fork_id: None,
        };
        self.start_child(&rec, child).await
    }

    /// Starts one sandbox from a snapshot; a failure leaves a `failed` record.
    pub(super) async fn start_child(&self, rec: &SnapshotRecord, c: Child) -> Result<Sandbox> {
        self.check_open()?;
        let _busy = super::Busy::new(&self.busy);
        if let Some(parked) = self.pool_take(rec, &c) {
            return self.take_parked(rec, c, parked).await;
        }
        let row = child_row(rec, &c, new_id()?)?;
        let want = self.want_of(rec, &row);
        let entry = self.admit(row, want).await?;
        self.restore_entry(&entry, rec, c, None).await
    }

    /// What child `row` of `rec` asks of admission. A warm restore maps its snapshot's
    /// memory images and is charged what it may hold privately (see `Policy::charge_mb`);
    /// a cold boot starts small and is charged its limit.
    fn want_of(&self, rec: &SnapshotRecord, row: &SandboxRow) -> Want {
        let image_mb = rec.memory_dir.as_ref().map(|_| rec.restore_mb());
        let policy = self.registry().admission.policy();
        Want {
            limit_mb: policy.charge_mb(row.boot.memory_mb, image_mb),
            need_mb: image_mb.map_or(BASELINE_NEED_MB, |m| m.max(BASELINE_NEED_MB)),
        }
    }

    /// Admits a fork's children at once, in index order, as many as fit: each takes a
    /// ready fork of the pool or room of its own. Nothing waits for room: ready forks give
    /// theirs first, and idle named sandboxes are suspended once when host memory is
    /// short; then the first child that does not fit and every child after it (they ask
    /// for the same) are refused (429) naming what is full and how many of the fork fit.
    async fn admit_children(
        &self,
        rec: &SnapshotRecord,
        children: Vec<Child>,
    ) -> Vec<(Child, Result<Slot>)> {
        let total = children.len();
        let (mut out, mut refused) = (Vec::with_capacity(total), None);
        let (mut evicted, mut relieved) = (false, false);
        for c in children {
            if refused.is_some() {
                out.push((c, Err(())));
                continue;
            }
            if let Some(p) = self.pool_take(rec, &c) {
                out.push((c, Ok(Ok(Slot::Parked(p)))));
                continue;
            }
            let row = match new_id().and_then(|id| child_row(rec, &c, id)) {
                Ok(row) => row,
                Err(e) => {
                    out.push((c, Ok(Err(e))));
                    continue;
                }
            };
            let want = self.want_of(rec, &row);
            let admitted = loop {
                let refusal = match self.try_admit(&row, want) {
                    Ok(Ok(entry)) => break Ok(Ok(Slot::Admitted(entry))),
                    Ok(Err(refusal)) => refusal,
                    Err(e) => break Ok(Err(e)),
                };
                if !evicted && !matches!(refusal, Refusal::Disk(_)) {
                    evicted = true;
                    if self.pool_evict(None).await > 0 {
                        continue;
                    }
                }
                if !relieved && matches!(refusal, Refusal::Memory(_)) {
                    relieved = true;
                    let left = (total - out.len()) as u64;
                    self.relieve_pressure(want.need_mb.saturating_mul(left))
                        .await;
                    continue;
                }
                refused = Some(refusal);
                break Err(());
            };
            out.push((c, admitted));
        }
        let fit = out.iter().filter(|(_, a)| matches!(a, Ok(Ok(_)))).count();
        out.into_iter()
            .map(|(c, a)| {
                let a = a.unwrap_or_else(|()| {
                    self.metrics.admission_refusals.inc();
                    let why = refused.as_ref().map_or("", |r| r.message());
                    Err(Error::OverCapacity(format!(
                        "{why}; {fit} of the {total} children of this fork fit"
                    )))
                });
                (c, a)
            })
            .collect()
    }

    /// Starts a child admitted by [`Manager::admit_children`].
    async fn start_admitted(&self, rec: &SnapshotRecord, c: Child, slot: Slot) -> Result<Sandbox> {
        match slot {
            Slot::Parked(p) => self.take_parked(rec, c, p).await,
            Slot::Admitted(entry) => {
                let id = entry.view().id;
                self.registry_mut()
                    .admission
                    .starting(&id, std::time::Instant::now());
                self.restore_entry(&entry, rec, c, None).await
            }
        }
    }

    /// Starts child `c` from a ready fork of the pool: the fork becomes the child.
    async fn take_parked(&self, rec: &SnapshotRecord, c: Child, p: Parked) -> Result<Sandbox> {
        let row = match child_row(rec, &c, p.id.clone()) {
            Ok(row) => row,
            Err(e) => {
                self.discard(p).await;
                return Err(e);
            }
        };
        let entry = match self.register_parked(&row) {
            Ok(entry) => entry,
            Err(e) => {
                self.discard(p).await;
                return Err(e);
            }
        };
        self.restore_entry(&entry, rec, c, Some(p)).await
    }

    /// Draws a fork child's seed and records the child; returns the seed.
    async fn record_child(&self, row: &SandboxRow) -> Result<[u8; 32]> {
        let seed = model::ids::random_bytes::<32>()?;
        self.store.put_sandbox(row.clone()).await?;
        Ok(seed)
    }

    /// Restores a registered child, or hands over the parked fork it was given.
    async fn restore_entry(
        &self,
        entry: &Arc<Entry>,
        rec: &SnapshotRecord,
        c: Child,
        parked: Option<Parked>,
    ) -> Result<Sandbox> {
        let t = self.transition(entry, Op::Boot).await?;
        let row = entry.row();
        let id = row.view.id.clone();
        // The child's seed, then its record: either failing leaves nothing behind.
        let seed = match self.record_child(&row).await {
            Ok(seed) => seed,
            Err(e) => {
                self.registry_mut().entries.remove(&id);
                if let Some(p) = parked {
                    self.discard(p).await;
                }
                self.registry_mut().admission.release(&id);
                return Err(e);
            }
        };
        let identity = proto::agent::Identity {
            sandbox_id: id.clone(),
            fork_index: c.index,
            seed: seed.to_vec(),
            parent_snapshot_id: Some(rec.view.id.clone()),
            // New processes of the restored sandbox see both; only the agent keeps the
            // secrets (in memory), no record does.
            env: c.env.into_iter().chain(c.secrets).collect(),
        };
        let started = std::time::Instant::now();
        let result = match parked {
            Some(p) => self
                .backend
                .hand_over(&id, identity, rec.hooks.clone())
                .await
                .map(|()| Booted { address: p.address }),
            None => {
                let from = RestoreFrom {
                    layer_id: rec.layer_id.clone(),
                    memory_dir: rec.memory_dir.clone(),
                    identity: Some(identity),
                    hooks: rec.hooks.clone(),
                };
                self.backend.restore(&row.boot, from).await
            }
        };
        self.metrics.restore.observe(started.elapsed());
        match result {
            Ok(booted) => {
                lock(&entry.row).view.network.address = booted.address;
                let view = t.succeed().await?;
                entry.touch();
                self.restored_from(rec);
                tracing::info!(sandbox = %id, snapshot = %rec.view.id, "sandbox restored");
                Ok(view)
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "restore failed");
                let _ = self.backend.destroy(&id).await;
                let e = self.integrity_failure(rec).unwrap_or_else(|| e.into());
                let msg = format!("Restore failed: {e}");
                Err(t.fail(Some(msg), e).await)
            }
        }
    }

    /// `POST /v1/snapshots/{id}/fork`: `count` children, admitted at once (as many as fit,
    /// the others refused), then started concurrently but bounded.
    pub async fn fork_snapshot(&self, snap_id: &str, req: ForkRequest) -> Result<ForkResult> {
        self.check_open()?;
        check_fork(&req)?;
        let rec = self.usable_snapshot(snap_id).await?;
        let mark = self.fork_mark()?;
        let children: Vec<Child> = (0..req.count)
            .map(|i| Child {
                fork_id: Some(mark.id.clone()),
                ..child_of(&req, i)
            })
            .collect();
        // Admitted children hold room and parked forks until started: run to the end even
        // if the caller goes away (the mark then rolls the children back).
        let me = self.weak_self().upgrade().ok_or(Error::ShuttingDown)?;
        let snapshot_id = rec.view.id.clone();
        let task = tokio::spawn(async move { me.start_children(rec, children).await });
        let mut children = match task.await {
            Ok(children) => children,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => return Err(Error::ShuttingDown),
        };
        mark.answered();
        children.sort_by_key(|c| c.index);
        Ok(ForkResult {
            snapshot_id,
            children,
        })
    }

    /// Admits `children` of `rec` and starts those that fit, [`FORK_PARALLELISM`] at once.
    async fn start_children(&self, rec: SnapshotRecord, children: Vec<Child>) -> Vec<ForkChild> {
        let _busy = super::Busy::new(&self.busy);
        let admitted = self.admit_children(&rec, children).await;
        futures::stream::iter(admitted)
            .map(|(child, slot)| {
                let (rec, index) = (&rec, child.index);
                async move {
                    let started = match slot {
                        Ok(slot) => self.start_admitted(rec, child, slot).await,
                        Err(e) => Err(e),
                    };
                    match started {
                        Ok(sb) => ForkChild {
                            index,
                            sandbox: Some(sb),
                            error: None,
                        },
                        Err(e) => ForkChild {
                            index,
                            sandbox: None,
                            error: Some(child_error(&e)),
                        },
                    }
                }
            })
            .buffer_unordered(FORK_PARALLELISM)
            .collect()
            .await
    }

    /// `POST /v1/sandboxes/{id}/fork`: a memory checkpoint in place, then a fork of it.
    pub async fn fork_sandbox(&self, id_or_name: &str, req: ForkRequest) -> Result<ForkResult> {
        check_fork(&req)?;
        let args = super::snapshots::CheckpointArgs {
            kind: SnapshotType::Memory,
            name: None,
            hooks: Vec::new(),
            labels: BTreeMap::new(),
        };
        let snap = self.checkpoint(id_or_name, args).await?;
        self.fork_snapshot(&snap.id, req).await
    }
}

fn check_fork(req: &ForkRequest) -> Result<()> {
    super::reaper::check_timeout(req.timeout_secs)?;
    if req.count == 0 || req.count > MAX_FORK {
        return Err(Error::InvalidArgument(format!(
            "count must be 1-{MAX_FORK}, got {}",
            req.count
        )));
    }
    if req.first_index.is_some_and(|f| f > MAX_FIRST_INDEX) {
        return Err(Error::InvalidArgument(format!(
            "first_index must be at most {MAX_FIRST_INDEX}"
        )));
    }
    if req.per_child.len() > req.count as usize {
        return Err(Error::InvalidArgument(
            "per_child has more entries than count".into(),
        ));
    }
    let check = CreateSandbox {
        env: req.env.clone(),
        secrets: req.secrets.clone(),
        name: req.name_prefix.as_ref().map(|p| format!("{p}-0")),
        ..Default::default()
    };
    validate(&check)?;
    // Children past `per_child` carry the request's labels alone.
    model::labels::check(&req.labels)?;
    for i in 0..req.per_child.len() {
        model::labels::check(&child_of(req, i as u32).labels)?;
    }
    for c in &req.per_child {
        validate(&CreateSandbox {
            env: c.env.clone(),
            ..Default::default()
        })?;
    }
    Ok(())
}

fn child_of(req: &ForkRequest, i: u32) -> Child {
    let mut env = req.env.clone();
    let mut labels = req.labels.clone();
    if let Some(c) = req.per_child.get(i as usize) {
        env.extend(c.env.clone());
        labels.extend(c.labels.clone());
    }
    let index = req.first_index.unwrap_or(0) + i;
    Child {
        index,
        name: req.name_prefix.as_ref().map(|p| format!("{p}-{index}")),
        env,
        secrets: req.secrets.clone(),
        labels,
        timeout_secs: req.timeout_secs.unwrap_or(0),
        on_timeout: req.on_timeout,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BootSpec, ImageSpec};
    use api_types::{ChildSpec, Snapshot};

    fn record(kind: SnapshotType) -> SnapshotRecord {
        SnapshotRecord {
            view: Snapshot {
                id: "snap-1".into(),
                kind,
                name: None,
                source_sandbox_id: Some("sb-1".into()),
                image: "busybox".into(),
                size_bytes: 1,
                created_at: now_rfc3339(),
                cpus: 1.0,
                memory_mb: 128,
                disk_mb: 0,
                labels: BTreeMap::new(),
                published: false,
            },
            layer_id: "l".into(),
            memory_dir: None,
            boot: BootSpec {
                id: "sb-1".into(),
                image: ImageSpec {
                    name: "busybox".into(),
                    layer_id: "base".into(),
                },
                cpus: 1.0,
                memory_mb: 128,
                disk_mb: 0,
                env: BTreeMap::from([("A".into(), "1".into())]),
                secrets: BTreeMap::new(),
                network: NetworkSpec::default(),
                volumes: Vec::new(),
            },
            hooks: vec![],
            internal: false,
            restore_bytes: 0,
            pulled: false,
            pages: Vec::new(),
        }
    }

    #[test]
    fn memory_snapshots_pin_resources_filesystem_ones_do_not() {
        let change = CreateSandbox {
            memory_mb: Some(256),
            cpus: Some(2.0),
            ..Default::default()
        };
        let e = check_pinned(&record(SnapshotType::Memory), &change).unwrap_err();
        assert_eq!(e.status_code().0, 422);
        assert!(
            e.message().contains("memory_mb (pinned at 128)"),
            "{}",
            e.message()
        );
        assert!(e.message().contains("cpus"));
        let same = CreateSandbox {
            memory_mb: Some(128),
            ..Default::default()
        };
        check_pinned(&record(SnapshotType::Memory), &same).unwrap();
        check_pinned(&record(SnapshotType::Filesystem), &change).unwrap();
    }

    #[test]
    fn children_get_their_own_env_labels_names_and_ids() {
        let req = ForkRequest {
            count: 3,
            env: BTreeMap::from([("E".into(), "all".into())]),
            secrets: BTreeMap::from([("S".into(), "x".into())]),
            labels: BTreeMap::from([("g".into(), "1".into())]),
            per_child: vec![ChildSpec {
                env: BTreeMap::from([("E".into(), "first".into())]),
                labels: BTreeMap::from([("k".into(), "v".into())]),
            }],
            name_prefix: Some("w".into()),
            timeout_secs: Some(5),
            on_timeout: None,
            first_index: None,
        };
        check_fork(&req).unwrap();
        let (c0, c2) = (child_of(&req, 0), child_of(&req, 2));
        assert_eq!(
            (c0.env["E"].as_str(), c2.env["E"].as_str()),
            ("first", "all")
        );
        assert_eq!(c0.secrets["S"], "x");
        assert!(!c0.env.contains_key("S"), "secrets stay apart from env");
        assert_eq!((c0.labels.len(), c2.labels.len()), (2, 1));
        assert_eq!(c2.name.as_deref(), Some("w-2"));
        let rec = record(SnapshotType::Memory);
        let (r0, r2) = (
            child_row(&rec, &c0, new_id().unwrap()).unwrap(),
            child_row(&rec, &c2, new_id().unwrap()).unwrap(),
        );
        assert_ne!(r0.view.id, r2.view.id);
        assert_eq!(r2.view.fork.as_ref().map(|f| f.index), Some(2));
        assert_eq!(r2.view.snapshot_id.as_deref(), Some("snap-1"));
        assert_eq!(r0.boot.env["A"], "1", "the snapshot's env is kept");
        assert_eq!(r0.view.timeout_secs, 5);
        // A gateway's share of a larger fork: indices and names from first_index on,
        // per_child[0] being the share's first child.
        let share = ForkRequest {
            first_index: Some(8),
            ..req.clone()
        };
        let (s0, s2) = (child_of(&share, 0), child_of(&share, 2));
        assert_eq!((s0.index, s2.index), (8, 10));
        assert_eq!(s2.name.as_deref(), Some("w-10"));
        assert_eq!(s0.env["E"], "first");
    }

    #[test]
    fn the_pool_can_hold_the_largest_fork() {
        assert_eq!(super::super::pool::MAX_READY, MAX_FORK as usize);
    }

    #[test]
    fn bad_fork_requests_are_refused() {
        for req in [
            ForkRequest::default(),
            ForkRequest {
                count: MAX_FORK + 1,
                ..Default::default()
            },
            ForkRequest {
                count: 1,
                per_child: vec![ChildSpec::default(), ChildSpec::default()],
                ..Default::default()
            },
            ForkRequest {
                count: 1,
                name_prefix: Some("bad name".into()),
                ..Default::default()
            },
        ] {
            assert_eq!(
                check_fork(&req).unwrap_err().status_code().0,
                400,
                "{req:?}"
            );
        }
    }
}
