//! Typed metrics, rendered in the Prometheus text format at `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use model::State;

use crate::backend::HostMerge;

/// Latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A latency histogram.
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, bound) in BUCKETS.iter().enumerate() {
            let n = self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {n}");
        }
        let count = self.count();
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// Every metric of the daemon.
#[derive(Default)]
pub struct Metrics {
    pub create: Histogram,
    pub exec: Histogram,
    pub checkpoint: Histogram,
    pub restore: Histogram,
    /// Sandboxes suspended to make room under memory pressure.
    pub pressure_suspends: Counter,
    /// Requests refused by admission after waiting for room.
    pub admission_refusals: Counter,
    /// Children handed over from the pool of ready forks.
    pub pool_hits: Counter,
    /// Children of poolable snapshots restored because the pool had none ready.
    pub pool_misses: Counter,
    /// Ready forks removed unused (idle, budget, room for a request, snapshot deleted).
    pub pool_evictions: Counter,
    /// Pulled snapshots dropped from the object store cache.
    pub remote_evictions: Counter,
    errors: Mutex<BTreeMap<&'static str, u64>>,
}

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(std::sync::atomic::AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
            self.get()
        );
    }
}

impl Metrics {
    /// Counts one error of `kind` (the API error code).
    pub fn error(&self, kind: &'static str) {
        if let Ok(mut e) = self.errors.lock() {
            *e.entry(kind).or_default() += 1;
        }
    }

    /// The error count of `kind`.
    pub fn errors_of(&self, kind: &str) -> u64 {
        self.errors
            .lock()
            .map(|e| e.get(kind).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Renders everything; `states` is the current count of sandboxes per state, `merge`
    /// what page merging has done (when it is on).
    pub fn render(
        &self,
        states: &BTreeMap<State, u64>,
        merge: Option<HostMerge>,
        pool: PoolGauge,
    ) -> String {
        let mut out = String::new();
        render_states(&mut out, states);
        if let Some(m) = merge {
            render_merge(&mut out, m);
        }
        render_pool(&mut out, pool);
        self.pool_hits.render(
            &mut out,
            "sandfork_pool_hits_total",
            "Children handed over from the pool of ready forks.",
        );
        self.pool_misses.render(
            &mut out,
            "sandfork_pool_misses_total",
            "Children of hot memory snapshots restored because no ready fork was left.",
        );
        self.pool_evictions.render(
            &mut out,
            "sandfork_pool_evictions_total",
            "Ready forks removed unused.",
        );
        self.remote_evictions.render(
            &mut out,
            "sandfork_object_store_cache_evictions_total",
            "Pulled snapshots dropped from the object store cache.",
        );
        self.create.render(
            &mut out,
            "sandfork_create_seconds",
            "Sandbox create latency.",
        );
        self.exec.render(
            &mut out,
            "sandfork_exec_seconds",
            "Exec latency (start to exit).",
        );
        self.checkpoint.render(
            &mut out,
            "sandfork_checkpoint_seconds",
            "Checkpoint latency.",
        );
        self.restore
            .render(&mut out, "sandfork_restore_seconds", "Restore latency.");
        self.pressure_suspends.render(
            &mut out,
            "sandfork_pressure_suspends_total",
            "Idle sandboxes suspended to make room under memory pressure.",
        );
        self.admission_refusals.render(
            &mut out,
            "sandfork_admission_refusals_total",
            "Requests refused by admission after waiting for room.",
        );
        let _ = writeln!(
            out,
            "# HELP sandfork_errors_total API errors by kind.\n# TYPE sandfork_errors_total counter"
        );
        if let Ok(errors) = self.errors.lock() {
            for (kind, n) in errors.iter() {
                let _ = writeln!(out, "sandfork_errors_total{{kind=\"{kind}\"}} {n}");
            }
        }
        out
    }
}

fn render_pool(out: &mut String, p: PoolGauge) {
    let gauges = [
        (
            "sandfork_pool_forks",
            "Ready forks parked in the pool.",
            p.forks,
        ),
        (
            "sandfork_pool_memory_bytes",
            "What the pool's ready forks are charged against its memory budget.",
            p.memory_bytes,
        ),
        (
            "sandfork_pool_snapshots",
            "Snapshots with ready forks in the pool.",
            p.snapshots,
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
}

fn render_merge(out: &mut String, m: HostMerge) {
    let gauges = [
        (
            "sandfork_memory_merge_saved_bytes",
            "gauge",
            "Memory saved by merging equal pages across sandboxes (host-wide KSM).",
            m.saved_bytes as f64,
        ),
        (
            "sandfork_memory_merge_cpu_seconds_total",
            "counter",
            "CPU the kernel's page merging (ksmd) has used since boot.",
            m.cpu_ms as f64 / 1000.0,
        ),
        (
            "sandfork_memory_merge_full_scans_total",
            "counter",
            "Complete passes of the page merging over mergeable memory.",
            m.full_scans as f64,
        ),
    ];
    for (name, kind, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
}

fn render_states(out: &mut String, states: &BTreeMap<State, u64>) {
    let _ = writeln!(
        out,
        "# HELP sandfork_sandboxes Sandboxes by state.\n# TYPE sandfork_sandboxes gauge"
    );
    for s in model::ALL_STATES {
        let n = states.get(&s).copied().unwrap_or(0);
        let _ = writeln!(out, "sandfork_sandboxes{{state=\"{s}\"}} {n}");
    }
}

/// Per-sandbox series of every running sandbox, labelled with its id, name, image and
/// its own labels (as `label_<key>`, the key's other characters as `_`).
pub fn render_sandboxes(out: &mut String, rows: &[(api_types::Sandbox, api_types::SandboxStats)]) {
    type Read = fn(&api_types::SandboxStats) -> f64;
    let series: [(&str, &str, &str, Read); 10] = [
        (
            "sandfork_sandbox_cpu_seconds_total",
            "counter",
            "CPU time used.",
            |s| s.usage.cpu_seconds,
        ),
        (
            "sandfork_sandbox_memory_bytes",
            "gauge",
            "Memory in use.",
            |s| s.usage.memory_bytes as f64,
        ),
        (
            "sandfork_sandbox_memory_limit_bytes",
            "gauge",
            "Memory limit.",
            |s| s.usage.memory_limit_bytes as f64,
        ),
        (
            "sandfork_sandbox_pids",
            "gauge",
            "Processes and threads.",
            |s| s.usage.pids as f64,
        ),
        (
            "sandfork_sandbox_oom_kills_total",
            "counter",
            "Processes killed for want of memory.",
            |s| s.usage.oom_kills as f64,
        ),
        (
            "sandfork_sandbox_disk_used_bytes",
            "gauge",
            "Root disk in use.",
            |s| s.usage.disk_used_bytes as f64,
        ),
        (
            "sandfork_sandbox_disk_total_bytes",
            "gauge",
            "Root disk size.",
            |s| s.usage.disk_total_bytes as f64,
        ),
        (
            "sandfork_sandbox_network_receive_bytes_total",
            "counter",
            "Bytes received.",
            |s| s.usage.net_rx_bytes as f64,
        ),
        (
            "sandfork_sandbox_network_transmit_bytes_total",
            "counter",
            "Bytes sent.",
            |s| s.usage.net_tx_bytes as f64,
        ),
        (
            "sandfork_sandbox_cpus",
            "gauge",
            "CPU limit in cores.",
            |s| s.cpus,
        ),
    ];
    let labels: Vec<String> = rows.iter().map(|(v, _)| series_labels(v)).collect();
    for (name, kind, help, read) in series {
        let _ = writeln!(
            out,
            "# HELP {name} A running sandbox's {}\n# TYPE {name} {kind}",
            help.to_lowercase()
        );
        for ((_, stats), l) in rows.iter().zip(&labels) {
            let _ = writeln!(out, "{name}{{{l}}} {}", read(stats));
        }
    }
}

/// `sandbox="…",name="…",image="…",label_k="…"` for one sandbox.
fn series_labels(v: &api_types::Sandbox) -> String {
    let mut pairs = vec![
        ("sandbox".to_string(), v.id.clone()),
        ("name".to_string(), v.name.clone().unwrap_or_default()),
        ("image".to_string(), v.image.clone()),
    ];
    for (k, val) in &v.labels {
        let key: String = k
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let key = format!("label_{key}");
        // Two keys that differ only in punctuation: the first (in key order) is shown.
        if !pairs.iter().any(|(k, _)| *k == key) {
            pairs.push((key, val.clone()));
        }
    }
    pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A label value as the Prometheus text format writes it.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Counters given as (name, help, value).
pub fn render_counters(out: &mut String, counters: &[(&str, &str, u64)]) {
    for (name, help, value) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    }
}

/// What the pool holds now (for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolGauge {
    pub forks: u64,
    pub memory_bytes: u64,
    pub snapshots: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandboxes_render_with_their_labels_escaped() {
        let view: api_types::Sandbox = serde_json::from_value(serde_json::json!({
            "id": "sb-1", "name": "w", "state": "running", "image": "python", "cpus": 1.0,
            "memory_mb": 64, "disk_mb": 0, "timeout_secs": 0,
            "network": {"mode": "none", "allow_out": [], "deny_out": []},
            "labels": {"team/x": "r\"l", "team.x": "shadowed"},
            "created_at": "t", "last_active_at": "t"
        }))
        .unwrap();
        let stats: api_types::SandboxStats = serde_json::from_value(serde_json::json!({
            "id": "sb-1", "sampled_at": "t", "cpu_seconds": 1.5, "cpus": 1.0,
            "memory_bytes": 4096, "memory_limit_bytes": 8192, "pids": 2, "oom_kills": 0,
            "disk_used_bytes": 1, "disk_total_bytes": 2, "net_rx_bytes": 3, "net_tx_bytes": 4,
            "net_rx_packets": 5, "net_tx_packets": 6
        }))
        .unwrap();
        let mut out = String::new();
        render_sandboxes(&mut out, &[(view, stats)]);
        let labels = r#"sandbox="sb-1",name="w",image="python",label_team_x="shadowed""#;
        assert!(
            out.contains(&format!(
                "sandfork_sandbox_cpu_seconds_total{{{labels}}} 1.5\n"
            )),
            "{out}"
        );
        assert!(
            out.contains(&format!("sandfork_sandbox_memory_bytes{{{labels}}} 4096\n")),
            "{out}"
        );
        assert!(out.contains("# TYPE sandfork_sandbox_network_receive_bytes_total counter"));
        assert_eq!(escape_label("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }

    #[test]
    fn histogram_counts_cumulatively() {
        let m = Metrics::default();
        m.exec.observe(Duration::from_millis(7));
        m.exec.observe(Duration::from_secs(3));
        let text = m.render(&BTreeMap::new(), None, PoolGauge::default());
        assert!(text.contains("sandfork_exec_seconds_bucket{le=\"0.005\"} 0"));
        assert!(text.contains("sandfork_exec_seconds_bucket{le=\"0.01\"} 1"));
        assert!(text.contains("sandfork_exec_seconds_bucket{le=\"5\"} 2"));
        assert!(text.contains("sandfork_exec_seconds_count 2"));
    }

    #[test]
    fn errors_and_states_render() {
        let m = Metrics::default();
        m.error("not_found");
        m.error("not_found");
        let states = BTreeMap::from([(State::Running, 3)]);
        let text = m.render(&states, None, PoolGauge::default());
        assert!(text.contains("sandfork_errors_total{kind=\"not_found\"} 2"));
        assert!(text.contains("sandfork_sandboxes{state=\"running\"} 3"));
        assert!(text.contains("sandfork_sandboxes{state=\"failed\"} 0"));
    }

    #[test]
    fn page_merging_renders_when_on() {
        let m = Metrics::default();
        let merge = HostMerge {
            saved_bytes: 4096 * 10,
            cpu_ms: 1500,
            full_scans: 3,
        };
        let text = m.render(&BTreeMap::new(), Some(merge), PoolGauge::default());
        assert!(text.contains("sandfork_memory_merge_saved_bytes 40960\n"));
        assert!(text.contains("sandfork_memory_merge_cpu_seconds_total 1.5\n"));
        assert!(text.contains("sandfork_memory_merge_full_scans_total 3\n"));
        let off = m.render(&BTreeMap::new(), None, PoolGauge::default());
        assert!(!off.contains("memory_merge"));
    }
}
