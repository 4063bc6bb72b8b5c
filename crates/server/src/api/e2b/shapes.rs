//! E2B's control-plane JSON and its translation to and from the daemon's types.
//!
//! E2B metadata becomes sandfork labels: a key that is a valid label key is kept as it
//! is; any other (spaces, `&`, non-ASCII…) is stored hex-encoded under `e2b.m/`. The
//! layer's own labels (`e2b.template`, `e2b.auto_resume`) start with `e2b.` and are not
//! metadata.

use std::collections::BTreeMap;

/// The envd version reported to the SDKs: every feature of the protocol they gate on it
/// is served (upload metadata is refused with an error naming it).
pub const ENVD_VERSION: &str = "0.6.4";

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use api_types::Sandbox;
use model::State;

/// The template a sandbox was created from.
pub const TEMPLATE_LABEL: &str = "e2b.template";
/// Set when a paused sandbox resumes on traffic (`autoResume`).
pub const AUTO_RESUME_LABEL: &str = "e2b.auto_resume";
const ENCODED_PREFIX: &str = "e2b.m/";
const OWN_PREFIX: &str = "e2b.";

/// `POST /v2/sandboxes`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub timeout: Option<u64>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    pub network: Option<NetworkConfig>,
    pub auto_pause: Option<bool>,
    pub auto_resume: Option<AutoResume>,
    pub mcp: Option<Value>,
    pub iam: Option<Value>,
    pub volume_mounts: Option<Vec<VolumeMount>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct AutoResume {
    #[serde(default)]
    pub enabled: bool,
}

#[derive(Debug, Deserialize)]
pub struct VolumeMount {
    pub name: String,
    pub path: String,
}

/// `SandboxNetworkConfig` (create) and `SandboxNetworkUpdateConfig` (`PUT …/network`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
    pub allow_public_traffic: Option<bool>,
    pub mask_request_host: Option<String>,
    pub https_ports: Option<Vec<u16>>,
    pub rules: Option<Value>,
    pub egress_proxy: Option<Value>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
}

impl NetworkConfig {
    /// The first setting sandfork has no equivalent for.
    pub fn unsupported(&self) -> Option<&'static str> {
        if self.mask_request_host.is_some() {
            return Some("network.maskRequestHost (rewriting the Host of port traffic)");
        }
        if self.https_ports.as_ref().is_some_and(|p| !p.is_empty()) {
            return Some("network.httpsPorts");
        }
        if self
            .rules
            .as_ref()
            .is_some_and(|r| !r.is_null() && r != &json!({}))
        {
            return Some("network.rules (header transforms of egress traffic)");
        }
        if self.egress_proxy.as_ref().is_some_and(|p| !p.is_null()) {
            return Some("network.egressProxy");
        }
        None
    }
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize)]
pub struct Timeout {
    pub timeout: u64,
}

/// `POST /v2/sandboxes/{id}/connect` (`memory: false`, a cold resume, gets a warm one).
#[derive(Debug, Default, Deserialize)]
pub struct ConnectBody {
    pub timeout: Option<u64>,
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Default, Deserialize)]
pub struct ForkBody {
    pub count: Option<u32>,
    pub timeout: Option<u64>,
}

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Default, Deserialize)]
pub struct SnapshotBody {
    pub name: Option<String>,
    pub memory: Option<bool>,
}

/// `Sandbox`: the answer of create, connect and each fork.
#[derive(Debug, Serialize)]
pub struct SandboxOut {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    #[serde(rename = "envdVersion")]
    pub envd_version: &'static str,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: String,
    #[serde(rename = "trafficAccessToken")]
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
    pub alias: Option<String>,
}

/// The E2B state of a sandfork sandbox: `running`, `paused`, or none (gone to E2B).
pub fn state(s: State) -> Option<&'static str> {
    match s {
        State::Creating | State::Running | State::Checkpointing | State::Resuming => {
            Some("running")
        }
        State::Suspending | State::Suspended => Some("paused"),
        _ => None,
    }
}

/// The template of a sandbox.
pub fn template(v: &Sandbox) -> String {
    v.labels
        .get(TEMPLATE_LABEL)
        .cloned()
        .unwrap_or_else(|| v.image.clone())
}

pub fn auto_resumes(labels: &BTreeMap<String, String>) -> bool {
    labels.get(AUTO_RESUME_LABEL).is_some_and(|v| v == "true")
}

/// `ListedSandbox` (and the base of `SandboxDetail`).
pub fn listed(v: &Sandbox, e2b_state: &str) -> Value {
    let end = v.expires_at.clone().unwrap_or_else(|| far_end(v));
    json!({
        "templateID": template(v),
        "alias": template(v),
        "sandboxID": v.id,
        "clientID": "sandfork",
        "startedAt": v.created_at,
        "endAt": end,
        "cpuCount": v.cpus.ceil().max(1.0) as u64,
        "memoryMB": v.memory_mb,
        "diskSizeMB": v.disk_mb,
        "state": e2b_state,
        "envdVersion": ENVD_VERSION,
        "metadata": metadata(&v.labels),
    })
}

/// When a sandbox without a running timeout ends: never, written as far away.
fn far_end(v: &Sandbox) -> String {
    if v.timeout_secs == 0 {
        "9999-12-31T23:59:59Z".into()
    } else {
        v.last_active_at.clone()
    }
}

/// `SandboxDetail`.
pub fn detail(v: &Sandbox, e2b_state: &str, token: &str) -> Value {
    let mut out = listed(v, e2b_state);
    let deny_all =
        v.network.deny_out.iter().any(|d| d == "0.0.0.0/0") && v.network.allow_out.is_empty();
    let allow_internet = v.network.mode == api_types::NetworkModeName::Internet && !deny_all;
    let extra = json!({
        "envdAccessToken": token,
        "domain": null,
        "allowInternetAccess": allow_internet,
        "network": {
            "allowOut": v.network.allow_out,
            "denyOut": v.network.deny_out,
            "allowPublicTraffic": v.public_ports,
        },
        "lifecycle": {
            "autoResume": auto_resumes(&v.labels),
            "onTimeout": if v.on_timeout == Some(api_types::OnTimeout::Suspend) { "pause" } else { "kill" },
        },
    });
    if let (Some(o), Value::Object(e)) = (out.as_object_mut(), extra) {
        o.extend(e);
    }
    out
}

/// E2B metadata as labels (see the module's comment).
pub fn labels_of(metadata: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    metadata
        .iter()
        .map(|(k, v)| (label_key(k), v.clone()))
        .collect()
}

pub fn label_key(key: &str) -> String {
    if model::labels::check_key(key).is_ok() && !key.starts_with(OWN_PREFIX) {
        key.to_string()
    } else {
        let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
        format!("{ENCODED_PREFIX}{hex}")
    }
}

/// The E2B metadata of a sandbox's labels.
pub fn metadata(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter_map(|(k, v)| {
            if let Some(hex) = k.strip_prefix(ENCODED_PREFIX) {
                return unhex(hex).map(|k| (k, v.clone()));
            }
            (!k.starts_with(OWN_PREFIX)).then(|| (k.clone(), v.clone()))
        })
        .collect()
}

fn unhex(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// The `metadata` list filter: one parameter holding a form-encoded map whose keys and
/// values were percent-encoded once more before.
pub fn metadata_filter(param: &str) -> BTreeMap<String, String> {
    form_urlencoded::parse(param.as_bytes())
        .map(|(k, v)| (percent_decode(&k), percent_decode(&v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_survives_as_labels_whatever_its_keys() {
        let md: BTreeMap<String, String> = [("case", "x"), ("odd key", "a&b=c"), ("e2b.x", "y")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut labels = labels_of(&md);
        assert!(model::labels::check(&labels).is_ok());
        labels.insert(TEMPLATE_LABEL.into(), "base".into());
        assert_eq!(metadata(&labels), md);
    }

    #[test]
    fn the_list_filter_is_decoded_twice() {
        // what the SDKs send for {"odd key": "a&b=c", "n": "1"}, after the query's own decoding
        let f = metadata_filter("odd%2520key=a%2526b%253Dc&n=1");
        assert_eq!(f.get("odd key").map(String::as_str), Some("a&b=c"));
        assert_eq!(f.get("n").map(String::as_str), Some("1"));
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn unsupported_network_settings_are_named() {
        let n = NetworkConfig {
            mask_request_host: Some("h".into()),
            ..Default::default()
        };
        assert!(n.unsupported().unwrap().contains("maskRequestHost"));
        assert!(NetworkConfig::default().unsupported().is_none());
        let empty_rules = NetworkConfig {
            rules: Some(json!({})),
            ..Default::default()
        };
        assert!(empty_rules.unsupported().is_none());
    }
}
