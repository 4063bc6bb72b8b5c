//! Creating sandboxes: validation, admission, boot.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::admission::{Refusal, Want, BASELINE_NEED_MB};
use super::{lock, new_id, now_rfc3339, Entry, Manager, Registry};
use crate::backend::{BootSpec, HostDisk, ImageSpec, NetworkSpec, VolumeMountSpec};
use crate::error::{Error, Result};
use crate::store::SandboxRow;
use api_types::{CreateSandbox, NetworkModeName, NetworkRequest, NetworkView, Sandbox};
use model::{Op, State};

/// How often a request waiting for room looks again (it also wakes when a sandbox ends).
const ADMIT_POLL: Duration = Duration::from_millis(250);

/// Longest sandbox name.
const MAX_NAME: usize = 63;

pub(super) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "Invalid name {name:?}: use 1-{MAX_NAME} of letters, digits, '-', '_' and '.'"
        )))
    }
}

fn check_env(env: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "Invalid environment variable {k:?}"
            )));
        }
    }
    Ok(())
}

pub(super) fn check_egress_list(list: &[String]) -> Result<()> {
    for entry in list {
        let parsed =
            egress::parse_entry(entry).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        if let egress::Entry::Address(c) = parsed {
            check_cidr(&c)?;
        }
    }
    Ok(())
}

fn check_cidr(c: &str) -> Result<()> {
    let (addr, _) = c.split_once('/').unwrap_or((c, ""));
    if addr.parse::<std::net::Ipv6Addr>().is_ok() {
        return Err(Error::InvalidArgument(format!(
            "Invalid egress entry {c:?}: IPv6 rules are not taken, because sandboxes have \
             IPv4 networking only and every IPv6 packet they send is dropped"
        )));
    }
    c.parse::<runtime::Cidr>().map(drop).map_err(|_| {
        Error::InvalidArgument(format!(
            "Invalid egress entry {c:?}: not an IPv4 address or CIDR (a.b.c.d or a.b.c.d/n, \
             n up to 32)"
        ))
    })
}

impl Manager {
    /// An `allow_out` may reach into a guarded range only where the operator allowed it
    /// (`allow_out_guarded`): a caller's list never opens the metadata service, a private
    /// network or the host's own networks on its own say-so.
    pub(super) fn check_guarded_egress(&self, allow_out: &[String]) -> Result<()> {
        let permitted = self
            .config
            .guarded_allowed()
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let host = runtime::net::HostNet::of_host();
        let guarded: Vec<(runtime::Cidr, String)> = runtime::net::GUARDED
            .iter()
            .map(|g| {
                (
                    g.parse().expect("literal CIDR"),
                    format!("guarded range {g}"),
                )
            })
            .chain(
                host.networks
                    .iter()
                    .map(|n| (*n, format!("host network {n}"))),
            )
            .collect();
        for entry in allow_out {
            let Ok(egress::Entry::Address(text)) = egress::parse_entry(entry) else {
                continue;
            };
            let Ok(cidr) = text.parse::<runtime::Cidr>() else {
                continue;
            };
            if permitted.iter().any(|p| p.contains(&cidr)) {
                continue;
            }
            if let Some((_, what)) = guarded
                .iter()
                .find(|(g, _)| g.contains(&cidr) || cidr.contains(g))
            {
                return Err(Error::Forbidden(format!(
                    "allow_out entry {entry:?} reaches into the {what}, which sandboxes reach \
                     only where the operator allows it (allow_out_guarded in the daemon's \
                     config); for everything else use network mode internet without allow_out"
                )));
            }
        }
        Ok(())
    }
}

/// Merges the `network` object with the SDK's top-level spelling.
pub(super) fn network_of(req: &CreateSandbox) -> Result<NetworkRequest> {
    let mut net = req.network.clone().unwrap_or_default();
    if let Some(allow) = req.allow_internet_access {
        net.mode = if allow {
            NetworkModeName::Internet
        } else {
            NetworkModeName::None
        };
    }
    if let Some(a) = &req.allow_out {
        net.allow_out.clone_from(a);
    }
    if let Some(d) = &req.deny_out {
        net.deny_out.clone_from(d);
    }
    check_egress_list(&net.allow_out)?;
    check_egress_list(&net.deny_out)?;
    if net.mode == NetworkModeName::None && !(net.allow_out.is_empty() && net.deny_out.is_empty()) {
        return Err(Error::Unsupported(
            "allow_out and deny_out need network mode internet".into(),
        ));
    }
    Ok(net)
}

/// Largest root disk: the block store's largest disk, 1 TiB.
pub const MAX_DISK_MB: u64 = 1 << 20;

/// Checks a create request on its own (no state needed).
pub fn validate(req: &CreateSandbox) -> Result<()> {
    if req.image.is_some() && req.snapshot_id.is_some() {
        return Err(Error::InvalidArgument(
            "Give either image or snapshot_id, not both".into(),
        ));
    }
    if let Some(n) = &req.name {
        check_name(n)?;
    }
    super::reaper::check_timeout(req.timeout_secs)?;
    let cpus = req.cpus.unwrap_or(1.0);
    if !(cpus.is_finite() && (0.01..=1024.0).contains(&cpus)) {
        return Err(Error::InvalidArgument(format!(
            "cpus {cpus} is out of range (0.01-1024)"
        )));
    }
    if req.memory_mb.is_some_and(|m| m < 16) {
        return Err(Error::InvalidArgument(
            "memory_mb must be at least 16".into(),
        ));
    }
    if let Some(d) = req.disk_mb.filter(|&d| d > MAX_DISK_MB) {
        return Err(Error::InvalidArgument(format!(
            "disk_mb {d} is out of range (at most {MAX_DISK_MB}, 1 TiB)"
        )));
    }
    check_env(&req.env)?;
    model::labels::check(&req.labels)?;
    check_env(&req.secrets)?;
    network_of(req)?;
    check_volumes(req)?;
    check_entrypoint(req)
}

fn check_volumes(req: &CreateSandbox) -> Result<()> {
    if !req.volumes.is_empty() && req.snapshot_id.is_some() {
        return Err(Error::Unsupported(
            "volumes are given with an image; a snapshot brings the volumes it had".into(),
        ));
    }
    let mut paths = std::collections::BTreeSet::new();
    for v in &req.volumes {
        runtime::volume::validate_name(&v.name)
            .and_then(|()| runtime::spec::validate_mount_path(&v.path))
            .map_err(|e| Error::InvalidArgument(model::error_chain(&e)))?;
        if !paths.insert(v.path.as_str()) {
            return Err(Error::InvalidArgument(format!(
                "two volumes mounted at {}",
                v.path
            )));
        }
    }
    Ok(())
}

fn check_entrypoint(req: &CreateSandbox) -> Result<()> {
    let Some(argv) = &req.entrypoint else {
        return Ok(());
    };
    if req.snapshot_id.is_some() {
        return Err(Error::Unsupported(
            "entrypoint applies to sandboxes created from an image; a snapshot brings its own processes"
                .into(),
        ));
    }
    if argv.first().is_none_or(|c| c.is_empty()) || argv.iter().any(|a| a.contains('\0')) {
        return Err(Error::InvalidArgument(
            "entrypoint must be a program and its arguments, without NUL bytes".into(),
        ));
    }
    Ok(())
}

fn row_for(id: &str, req: &CreateSandbox, image: ImageSpec) -> Result<SandboxRow> {
    let net = network_of(req)?;
    let now = now_rfc3339();
    let boot = BootSpec {
        id: id.to_string(),
        image: image.clone(),
        cpus: req.cpus.unwrap_or(api_types::DEFAULT_CPUS),
        memory_mb: req.memory_mb.unwrap_or(api_types::DEFAULT_MEMORY_MB),
        disk_mb: req.disk_mb.unwrap_or(0),
        env: req.env.clone(),
        secrets: req.secrets.clone(),
        network: NetworkSpec {
            internet: net.mode == NetworkModeName::Internet,
            allow_out: net.allow_out.clone(),
            deny_out: net.deny_out.clone(),
        },
        volumes: req
            .volumes
            .iter()
            .map(|v| VolumeMountSpec {
                name: v.name.clone(),
                path: v.path.clone(),
                read_only: v.read_only,
            })
            .collect(),
    };
    let view = Sandbox {
        id: id.to_string(),
        name: req.name.clone(),
        state: State::Creating,
        image: image.name,
        snapshot_id: None,
        cpus: boot.cpus,
        memory_mb: boot.memory_mb,
        disk_mb: boot.disk_mb,
        timeout_secs: req.timeout_secs.unwrap_or(0),
        on_timeout: Some(super::reaper::on_timeout(
            req.on_timeout,
            req.name.as_deref(),
        )),
        expires_at: None,
        network: NetworkView {
            mode: net.mode,
            address: None,
            allow_out: net.allow_out,
            deny_out: net.deny_out,
        },
        labels: req.labels.clone(),
        created_at: now.clone(),
        last_active_at: now,
        fork: None,
        error: None,
        entrypoint: req.entrypoint.clone(),
        public_ports: req.public_ports.unwrap_or(false),
        exposed_ports: req.exposed_ports.clone().map(ports_list).transpose()?,
        disk_full: false,
        access_epoch: 0,
    };
    Ok(SandboxRow { view, boot })
}

/// A port list as kept: sorted, each once; port 0 is refused.
pub(super) fn ports_list(mut ports: Vec<u16>) -> Result<Vec<u16>> {
    if ports.contains(&0) {
        return Err(Error::InvalidArgument(
            "exposed_ports: port 0 is not a port; use 1-65535".into(),
        ));
    }
    ports.sort_unstable();
    ports.dedup();
    Ok(ports)
}

/// Disks are thin, but one asked larger than what the host disk has free beyond its
/// reserve could fill the host disk on its own: it is refused (`0` is the image's size).
fn check_disk_fits(disk_mb: u64, disk: Option<HostDisk>, reserve_mb: u64) -> Result<()> {
    check_room("disk_mb", disk_mb, disk, reserve_mb)
}

/// Refuses `mb` MiB of host disk (asked for as `what`) beyond what the host disk can
/// give: its free space less the reserve.
pub(super) fn check_room(
    what: &str,
    mb: u64,
    disk: Option<HostDisk>,
    reserve_mb: u64,
) -> Result<()> {
    let Some(free_mb) = disk.map(|d| d.free_mb) else {
        return Ok(());
    };
    let room = free_mb.saturating_sub(reserve_mb);
    if mb > room {
        return Err(Error::InvalidArgument(format!(
            "{what} {mb} is more than the host disk can give: {free_mb} MiB free, of \
             which {reserve_mb} MiB are kept free, leaves {room} MiB"
        )));
    }
    Ok(())
}

/// Refuses a row whose name a live sandbox has.
fn check_name_free(reg: &Registry, row: &SandboxRow) -> Result<()> {
    let Some(name) = &row.view.name else {
        return Ok(());
    };
    let taken = reg.entries.values().any(|e| {
        let r = lock(&e.row);
        r.view.state.is_live() && r.view.name.as_ref() == Some(name)
    });
    if taken {
        return Err(Error::Conflict(format!(
            "A sandbox named {name} already exists"
        )));
    }
    Ok(())
}

impl Manager {
    /// Registers the entry of a fork the pool hands over (its admission room is held
    /// already), atomically with the name check.
    pub(super) fn register_parked(&self, row: &SandboxRow) -> Result<Arc<Entry>> {
        let mut reg = self.registry_mut();
        check_name_free(&reg, row)?;
        let entry = Entry::new(row.clone());
        reg.entries.insert(entry.view().id, entry.clone());
        self.emit_created(&row.view);
        Ok(entry)
    }

    /// Creates and boots a sandbox. Refused at once (429) over the admission caps; a
    /// failed boot leaves a `failed` record and no host resources.
    pub async fn create(&self, req: CreateSandbox) -> Result<Sandbox> {
        self.check_open()?;
        validate(&req)?;
        self.check_guarded_egress(&network_of(&req)?.allow_out)?;
        let _busy = super::Busy::new(&self.busy);
        if req.snapshot_id.is_some() {
            return self.create_from_snapshot(req).await;
        }
        let image = self
            .resolve_image(req.image.as_deref().unwrap_or(&self.config.default_image))
            .await?;
        self.check_volumes_exist(&req).await?;
        let row = row_for(&new_id()?, &req, image)?;
        let want = Want {
            limit_mb: row.boot.memory_mb,
            need_mb: BASELINE_NEED_MB,
        };
        let entry = self.admit(row, want).await?;
        let started = Instant::now();
        let result = self.boot(&entry).await;
        self.metrics.create.observe(started.elapsed());
        result
    }

    /// Reserves room and registers the entry, atomically with the name check. When the
    /// host is full the request waits, up to `admission_wait_secs`, for room (idle named
    /// sandboxes are suspended to make it, see [`Manager::relieve_pressure`]), then is
    /// refused with 429 naming what is full.
    pub(super) async fn admit(&self, row: SandboxRow, want: Want) -> Result<Arc<Entry>> {
        let wait = Duration::from_secs(self.config.admission_wait_secs);
        let deadline = Instant::now() + wait;
        let mut relieved = false;
        loop {
            let released = self.released.notified();
            let refusal = match self.try_admit(&row, want)? {
                Ok(entry) => return Ok(entry),
                Err(refusal) => refusal,
            };
            self.check_open()?;
            // Ready forks in the pool give their room to a request first.
            if !matches!(refusal, Refusal::Disk(_)) && self.pool_evict(None).await > 0 {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                let waited = if wait.is_zero() {
                    String::new()
                } else {
                    format!(" (waited {} s for room)", wait.as_secs())
                };
                self.metrics.admission_refusals.inc();
                return Err(Error::OverCapacity(format!(
                    "{}{waited}",
                    refusal.message()
                )));
            }
            if matches!(refusal, Refusal::Memory(_)) && !relieved {
                relieved = true;
                self.relieve_pressure(want.need_mb).await;
                continue;
            }
            let _ = tokio::time::timeout((deadline - now).min(ADMIT_POLL), released).await;
        }
    }

    /// One admission attempt: `Err` for a request that can never pass (a taken name),
    /// `Ok(Err)` for one that may pass once there is room.
    pub(super) fn try_admit(
        &self,
        row: &SandboxRow,
        want: Want,
    ) -> Result<std::result::Result<Arc<Entry>, Refusal>> {
        let (host, disk) = (self.backend.host_memory(), self.backend.host_disk());
        let mut reg = self.registry_mut();
        check_name_free(&reg, row)?;
        check_disk_fits(
            row.boot.disk_mb,
            disk,
            reg.admission.policy().disk_reserve_mb,
        )?;
        if let Err(refusal) = reg
            .admission
            .reserve(&row.view.id, want, host, disk, Instant::now())
        {
            return Ok(Err(refusal));
        }
        let entry = Entry::new(row.clone());
        reg.entries.insert(entry.view().id, entry.clone());
        self.emit_created(&row.view);
        Ok(Ok(entry))
    }

    /// `created`, or `forked` for a child of a fork.
    fn emit_created(&self, view: &Sandbox) {
        let kind = if view.fork.is_some() {
            api_types::EventKind::Forked
        } else {
            api_types::EventKind::Created
        };
        self.events.emit(kind, view, view.snapshot_id.clone(), None);
    }

    async fn boot(&self, entry: &Arc<Entry>) -> Result<Sandbox> {
        let t = self.transition(entry, Op::Boot).await?;
        let row = entry.row();
        let id = row.view.id.clone();
        if let Err(e) = self.store.put_sandbox(row.clone()).await {
            self.registry_mut().entries.remove(&id);
            self.registry_mut().admission.release(&id);
            return Err(e.into());
        }
        let booted = match self.backend.create(&row.boot).await {
            Ok(booted) => self.start_entrypoint(&id, &row.view).await.map(|()| booted),
            Err(e) => Err(e),
        };
        match booted {
            Ok(booted) => {
                lock(&entry.row).view.network.address = booted.address;
                let view = t.succeed().await?;
                entry.touch();
                tracing::info!(sandbox = %id, image = %row.view.image, "sandbox created");
                Ok(view)
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "sandbox create failed");
                let _ = self.backend.destroy(&id).await;
                let msg = format!("Create failed: {e}");
                Err(t.fail(Some(msg), e).await)
            }
        }
    }
}

impl Manager {
    /// Starts a new sandbox's entrypoint as a background process.
    async fn start_entrypoint(
        &self,
        id: &str,
        view: &Sandbox,
    ) -> std::result::Result<(), crate::backend::BackendError> {
        let Some((command, args)) = view.entrypoint.as_ref().and_then(|a| a.split_first()) else {
            return Ok(());
        };
        let exec = proto::agent::ExecRequest {
            command: command.clone(),
            args: args.to_vec(),
            ..Default::default()
        };
        self.backend.spawn(id, exec.into()).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_catches_bad_requests() {
        let bad = [
            CreateSandbox {
                image: Some("a".into()),
                snapshot_id: Some("s".into()),
                ..Default::default()
            },
            CreateSandbox {
                name: Some("has space".into()),
                ..Default::default()
            },
            CreateSandbox {
                cpus: Some(f64::NAN),
                ..Default::default()
            },
            CreateSandbox {
                memory_mb: Some(1),
                ..Default::default()
            },
            CreateSandbox {
                disk_mb: Some(1 << 50),
                ..Default::default()
            },
            CreateSandbox {
                env: BTreeMap::from([("A=B".into(), "x".into())]),
                ..Default::default()
            },
            CreateSandbox {
                allow_internet_access: Some(true),
                allow_out: Some(vec!["not a host".into()]),
                ..Default::default()
            },
            CreateSandbox {
                allow_internet_access: Some(true),
                deny_out: Some(vec!["*.*.example.com".into()]),
                ..Default::default()
            },
            CreateSandbox {
                allow_internet_access: Some(true),
                allow_out: Some(vec!["2001:db8::/32".into()]),
                ..Default::default()
            },
        ];
        for req in bad {
            assert_eq!(validate(&req).unwrap_err().status_code().0, 400, "{req:?}");
        }
        let deny_without_net = CreateSandbox {
            allow_internet_access: Some(false),
            deny_out: Some(vec!["10.0.0.0/8".into()]),
            ..Default::default()
        };
        assert_eq!(
            validate(&deny_without_net).unwrap_err().status_code().0,
            422
        );
        let ok = CreateSandbox {
            allow_internet_access: Some(true),
            deny_out: Some(vec!["10.0.0.0/8".into()]),
            ..Default::default()
        };
        validate(&ok).unwrap();
    }

    #[test]
    fn a_disk_past_the_free_space_beyond_the_reserve_is_refused() {
        let free = Some(HostDisk { free_mb: 5000 });
        check_disk_fits(0, free, 1024).unwrap();
        check_disk_fits(3976, free, 1024).unwrap();
        let e = check_disk_fits(3977, free, 1024).unwrap_err();
        assert_eq!(e.status_code().0, 400);
        assert!(e.message().contains("leaves 3976 MiB"), "{e:?}");
        check_disk_fits(1 << 20, None, 1024).unwrap();
        check_disk_fits(1, Some(HostDisk { free_mb: 100 }), 1024).unwrap_err();
    }
}
