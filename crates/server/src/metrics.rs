//! Typed metrics, rendered in the Prometheus text format at `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use model::State;

use crate::backend::HostMerge;
use crate::manager::PoolGauge;

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

#[cfg(test)]
mod tests {
    use super::*;

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
