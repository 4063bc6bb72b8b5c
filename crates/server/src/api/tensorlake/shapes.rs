//! Tensorlake's request and response bodies (WIRE.md §6) and their translation to and from
//! the daemon's API types. Requests ignore fields they do not know (newer SDKs may send
//! more); fields that are known but cannot be honoured are refused by name.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer, Serialize};

use super::super::ApiError;
use super::errors::unsupported;
use api_types::{CreateSandbox, NetworkModeName, Sandbox, Snapshot, SnapshotType, State};

/// `resources` of a create, an update or a pool.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Resources {
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub disk_mb: Option<u64>,
    /// The JS SDK's spelling of `disk_mb` (pools).
    pub ephemeral_disk_mb: Option<u64>,
    #[serde(default)]
    pub gpus: Vec<IgnoredAny>,
}

/// `network` of a create or an update.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct NetworkPolicy {
    #[serde(default = "yes")]
    pub allow_internet_access: bool,
    #[serde(default)]
    pub allow_out: Vec<String>,
    #[serde(default)]
    pub deny_out: Vec<String>,
}

fn yes() -> bool {
    true
}

/// `POST {P}/sandboxes` (WIRE.md §6.1).
#[derive(Debug, Default, Deserialize)]
pub struct CreateBody {
    pub image: Option<String>,
    pub resources: Option<Resources>,
    pub timeout_secs: Option<u64>,
    pub entrypoint: Option<Vec<String>>,
    pub network: Option<NetworkPolicy>,
    pub snapshot_id: Option<String>,
    pub name: Option<String>,
    #[serde(default)]
    pub file_systems: Vec<IgnoredAny>,
    pub allow_unauthenticated_access: Option<bool>,
    pub exposed_ports: Option<Vec<u16>>,
    pub auto_resume: Option<bool>,
    /// sandfork's own labels (no Tensorlake SDK sends them).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Refuses `auto_resume: false`: a suspended sandfork sandbox always resumes on its next
/// request.
pub fn check_auto_resume(auto_resume: Option<bool>) -> Result<(), ApiError> {
    if auto_resume == Some(false) {
        return Err(unsupported(
            "auto_resume=false is not supported by sandfork: a suspended sandbox always \
             resumes on its next request",
        ));
    }
    Ok(())
}

impl CreateBody {
    /// The daemon's create request. A restore ignores `resources`: a snapshot brings its
    /// own (the JS SDK sends its defaults on every create).
    pub fn into_native(self) -> Result<CreateSandbox, ApiError> {
        if !self.file_systems.is_empty() {
            return Err(unsupported(
                "file_systems are not supported by sandfork: mount its named volumes \
                 through its native API",
            ));
        }
        check_auto_resume(self.auto_resume)?;
        let restore = self.snapshot_id.is_some();
        let r = match self.resources {
            Some(r) if !restore => r,
            _ => Resources::default(),
        };
        if !r.gpus.is_empty() {
            return Err(unsupported(
                "GPUs are not supported by sandfork (resources.gpus)",
            ));
        }
        let net = self.network;
        Ok(CreateSandbox {
            image: self.image,
            snapshot_id: self.snapshot_id,
            entrypoint: self.entrypoint,
            name: self.name,
            cpus: r.cpus,
            memory_mb: r.memory_mb,
            disk_mb: r.disk_mb.or(r.ephemeral_disk_mb),
            timeout_secs: self.timeout_secs,
            allow_internet_access: net.as_ref().map(|n| n.allow_internet_access),
            allow_out: net.as_ref().map(|n| n.allow_out.clone()),
            deny_out: net.map(|n| n.deny_out),
            labels: self.labels,
            public_ports: self.allow_unauthenticated_access,
            exposed_ports: self.exposed_ports,
            ..Default::default()
        })
    }
}

/// `PATCH {P}/sandboxes/{id}` (WIRE.md §6.4).
#[derive(Debug, Default, Deserialize)]
pub struct UpdateBody {
    pub name: Option<String>,
    pub allow_unauthenticated_access: Option<bool>,
    pub exposed_ports: Option<Vec<u16>>,
    pub auto_resume: Option<bool>,
    pub resources: Option<Resources>,
    /// Absent: kept; `null`: cleared; an object: set.
    #[serde(default, deserialize_with = "present")]
    pub network: Option<Option<NetworkPolicy>>,
    /// sandfork's own: labels and the idle timeout (no Tensorlake SDK sends them).
    pub labels: Option<BTreeMap<String, String>>,
    pub timeout_secs: Option<u64>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<NetworkPolicy>>, D::Error> {
    Option::<NetworkPolicy>::deserialize(d).map(Some)
}

/// Tensorlake's sandbox status names.
pub fn status(state: State) -> &'static str {
    match state {
        State::Creating | State::Resuming => "pending",
        State::Running => "running",
        State::Checkpointing => "snapshotting",
        State::Suspending => "suspending",
        State::Suspended => "suspended",
        State::Terminating | State::Terminated => "terminated",
        State::Failed | State::Lost => "failed",
    }
}

/// Whether the SDKs may connect to the sandbox (a suspended one resumes on access).
fn reachable(state: State) -> bool {
    !matches!(
        state,
        State::Terminating | State::Terminated | State::Failed | State::Lost
    )
}

/// `resources` as answered.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResourcesView {
    pub cpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub ephemeral_disk_mb: u64,
}

/// The answer to a resize (WIRE.md §6.3 `resource_resize`).
#[derive(Debug, Clone, Serialize)]
pub struct ResourceResize {
    pub generation: u64,
    pub requested: ResizeRequested,
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResizeRequested {
    pub cpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
}

/// SandboxInfo (WIRE.md §6.3).
#[derive(Debug, Clone, Serialize)]
pub struct SandboxInfo {
    /// Only `id`: the SDKs read `sandbox_id` as another name of it, and refuse both.
    pub id: String,
    pub namespace: String,
    pub status: &'static str,
    pub image: String,
    pub name: Option<String>,
    pub resources: ResourcesView,
    pub timeout_secs: u64,
    pub entrypoint: Option<Vec<String>>,
    pub network_policy: NetworkPolicy,
    pub created_at: String,
    pub allow_unauthenticated_access: bool,
    pub exposed_ports: Vec<u16>,
    pub auto_resume: bool,
    pub sandbox_url: Option<String>,
    pub error_details: Option<String>,
    pub snapshot_id: Option<String>,
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_resize: Option<ResourceResize>,
}

impl SandboxInfo {
    pub fn of(s: Sandbox, namespace: &str, url: Option<&str>) -> SandboxInfo {
        let internet = s.network.mode == NetworkModeName::Internet;
        SandboxInfo {
            namespace: namespace.to_string(),
            status: status(s.state),
            resources: ResourcesView {
                cpus: s.cpus,
                memory_mb: s.memory_mb,
                disk_mb: s.disk_mb,
                ephemeral_disk_mb: s.disk_mb,
            },
            network_policy: NetworkPolicy {
                allow_internet_access: internet,
                allow_out: s.network.allow_out,
                deny_out: s.network.deny_out,
            },
            allow_unauthenticated_access: s.public_ports,
            exposed_ports: s.exposed_ports.unwrap_or_default(),
            auto_resume: true,
            sandbox_url: url.filter(|_| reachable(s.state)).map(str::to_string),
            error_details: s.error,
            id: s.id,
            image: s.image,
            name: s.name,
            timeout_secs: s.timeout_secs,
            entrypoint: s.entrypoint,
            created_at: s.created_at,
            snapshot_id: s.snapshot_id,
            labels: s.labels,
            resource_resize: None,
        }
    }
}

/// CreateSandboxResponse (WIRE.md §6.2), also each copy of a copy.
#[derive(Debug, Clone, Serialize)]
pub struct Created {
    pub sandbox_id: String,
    pub status: &'static str,
    pub name: Option<String>,
    pub sandbox_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_details: Option<String>,
}

impl Created {
    pub fn of(s: Sandbox, url: Option<&str>) -> Created {
        Created {
            status: status(s.state),
            sandbox_url: url.filter(|_| reachable(s.state)).map(str::to_string),
            error_details: s.error,
            sandbox_id: s.id,
            name: s.name,
            reason: None,
        }
    }
}

/// SnapshotInfo (WIRE.md §6.5). A sandfork snapshot exists only once complete.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    /// Only `id` (`snapshot_id` is another name of it).
    pub id: String,
    pub namespace: String,
    pub sandbox_id: String,
    pub status: &'static str,
    pub snapshot_type: SnapshotType,
    pub base_image: String,
    pub size_bytes: u64,
    pub created_at: String,
    pub name: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl SnapshotInfo {
    pub fn of(s: Snapshot, namespace: &str) -> SnapshotInfo {
        SnapshotInfo {
            id: s.id,
            namespace: namespace.to_string(),
            sandbox_id: s.source_sandbox_id.unwrap_or_default(),
            status: "completed",
            snapshot_type: s.kind,
            base_image: s.image,
            size_bytes: s.size_bytes,
            created_at: s.created_at,
            name: s.name,
            labels: s.labels,
        }
    }
}

/// `POST {P}/sandboxes/{id}/snapshot`: a type, or no body at all.
#[derive(Debug, Default, Deserialize)]
pub struct SnapshotBody {
    pub snapshot_type: Option<SnapshotType>,
}

/// Milliseconds since the Unix epoch of an RFC 3339 time as the daemon writes them
/// (`2026-12-02T06:05:12.345Z`); `None` for anything else.
pub fn unix_millis(rfc3339: &str) -> Option<i64> {
    model::timestamp::unix_millis(rfc3339)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_times_read_back() {
        assert_eq!(unix_millis("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(
            unix_millis("2025-12-02T06:05:12.345Z"),
            Some(1_764_655_512_345)
        );
        assert_eq!(unix_millis("yesterday"), None);
    }

    #[test]
    fn a_create_translates_and_a_restore_keeps_the_snapshots_resources() {
        let body: CreateBody = serde_json::from_str(
            r#"{"image": "busybox", "resources": {"cpus": 2.0, "memory_mb": 1024},
                "network": {"allow_internet_access": false}, "name": "n",
                "exposed_ports": [8080], "allow_unauthenticated_access": true,
                "something_new": 1}"#,
        )
        .unwrap();
        let c = body.into_native().unwrap();
        assert_eq!((c.cpus, c.memory_mb), (Some(2.0), Some(1024)));
        assert_eq!(c.allow_internet_access, Some(false));
        assert_eq!(c.public_ports, Some(true));
        let restore: CreateBody = serde_json::from_str(
            r#"{"snapshot_id": "snap-1", "resources": {"cpus": 1.0, "memory_mb": 1024}}"#,
        )
        .unwrap();
        let c = restore.into_native().unwrap();
        assert_eq!((c.cpus, c.memory_mb), (None, None));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        for (body, word) in [
            (
                r#"{"resources": {"cpus": 1, "gpus": [{"count": 1}]}}"#,
                "GPU",
            ),
            (
                r#"{"file_systems": [{"file_system_id": "f"}]}"#,
                "file_systems",
            ),
            (r#"{"auto_resume": false}"#, "auto_resume"),
        ] {
            let b: CreateBody = serde_json::from_str(body).unwrap();
            let e = b.into_native().unwrap_err();
            assert!(e.0.message().contains(word), "{body}: {}", e.0.message());
            assert_eq!(e.0.status_code().0, 422);
        }
    }

    #[test]
    fn an_update_tells_a_null_network_from_an_absent_one() {
        let absent: UpdateBody = serde_json::from_str("{}").unwrap();
        assert_eq!(absent.network, None);
        let null: UpdateBody = serde_json::from_str(r#"{"network": null}"#).unwrap();
        assert_eq!(null.network, Some(None));
        let set: UpdateBody =
            serde_json::from_str(r#"{"network": {"deny_out": ["10.0.0.0/8"]}}"#).unwrap();
        assert!(set.network.unwrap().unwrap().allow_internet_access);
    }

    #[test]
    fn every_state_has_a_tensorlake_status() {
        for s in model::lifecycle::ALL_STATES {
            assert!(!status(s).is_empty());
        }
        assert_eq!(status(State::Running), "running");
        assert_eq!(status(State::Suspended), "suspended");
    }
}
