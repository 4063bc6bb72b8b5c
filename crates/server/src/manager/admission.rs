//! Admission: whether the host can take one more sandbox.
//!
//! A sandbox's `memory_mb` is a cap (its cgroup limit), not a reservation: most sandboxes use
//! a fraction of it. So, as container runtimes do, admission overcommits limits and checks
//! what the host really has. A sandbox is admitted when
//! - fewer than `max_sandboxes` are live;
//! - the charges of the live sandboxes, its own included, add up to no more than the
//!   overcommit cap (`max_memory_mb`; by default `memory_overcommit` × host memory). A
//!   sandbox is charged its memory limit, except a child of a memory snapshot (a fork or a
//!   warm restore), see [`Policy::charge_mb`]: its snapshot's pages are shared with its
//!   siblings until written, so it is charged what it may hold privately;
//! - the host's available memory, less the reserve kept free and less what sandboxes
//!   admitted in the last [`SETTLE`] have yet to take, covers what the new one needs to
//!   start: its snapshot's memory images for a warm restore (merging comes later, so this
//!   is never discounted), [`BASELINE_NEED_MB`] for a cold boot;
//! - the host disk of the data directory keeps at least `disk_reserve_mb` free (sandbox
//!   disks are thin and grow into it as their guests write; a full host disk fails their
//!   writeback, so new sandboxes are refused well before).
//!
//! A refusal names what is full. A create or a single restore is queued for a bounded time
//! first (and may suspend idle sandboxes to make room), see `Manager::admit`; the children of
//! a fork are admitted at once, as many as fit, see `Manager::admit_children`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::backend::{HostDisk, HostMemory};
use crate::config::Config;

/// What a cold-booted sandbox takes at first: its agent, its disk server and the first
/// pages of its image.
pub const BASELINE_NEED_MB: u64 = 64;

/// How long a new sandbox's start-up need counts as still to come: by then what it took
/// shows in the host's available memory.
pub const SETTLE: Duration = Duration::from_secs(10);

/// The caps admission enforces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub max_sandboxes: usize,
    /// Cap on the summed memory limits of live sandboxes, in MiB (the overcommit cap).
    pub max_limits_mb: u64,
    /// Host memory kept free, in MiB.
    pub reserve_mb: u64,
    /// Host disk space kept free, in MiB.
    pub disk_reserve_mb: u64,
    /// What a child of a memory snapshot is charged against the cap beyond the pages it
    /// holds privately, as a fraction of its limit (`fork_memory_charge`; 1 = its limit).
    pub fork_charge: f64,
    /// Children of one memory snapshot share its pages (`memory_merge`).
    pub merge: bool,
}

impl Policy {
    /// The caps `config` sets on a host with `host_total_mb` of memory (0 = unknown).
    pub fn from_config(config: &Config, host_total_mb: u64) -> Policy {
        let max_limits_mb = match (config.max_memory_mb, host_total_mb) {
            (0, 0) => u64::MAX,
            (0, total) => (total as f64 * config.memory_overcommit) as u64,
            (cap, _) => cap,
        };
        let reserve_mb = match config.memory_reserve_mb {
            0 => (host_total_mb / 20).max(512),
            r => r,
        };
        Policy {
            max_sandboxes: config.max_sandboxes as usize,
            max_limits_mb,
            reserve_mb,
            disk_reserve_mb: config.disk_reserve_mb,
            fork_charge: config.fork_memory_charge,
            merge: config.memory_merge,
        }
    }

    /// What a sandbox with a `limit_mb` memory limit is charged against the overcommit cap,
    /// in MiB. `image_mb` is, for a child of a memory snapshot, the memory images it is
    /// restored from; `None` for any other sandbox, which is charged its limit.
    ///
    /// A child starts with its snapshot's pages. With merging they stay shared with its
    /// siblings until written, so what it may hold privately is what it writes: it is
    /// charged `fork_charge` × its limit (rounded up). Without merging each child holds a
    /// copy of the images, charged on top. Never more than its limit, which caps it anyway.
    pub fn charge_mb(&self, limit_mb: u64, image_mb: Option<u64>) -> u64 {
        let Some(image_mb) = image_mb else {
            return limit_mb;
        };
        let private_mb = if self.merge { 0 } else { image_mb };
        let growth_mb = (limit_mb as f64 * self.fork_charge).ceil() as u64;
        private_mb.saturating_add(growth_mb).min(limit_mb)
    }
}

/// What a new sandbox asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    /// What it is charged against the overcommit cap: its memory limit (`memory_mb`), less
    /// for a child of a memory snapshot (see [`Policy::charge_mb`]).
    pub limit_mb: u64,
    /// What it takes to start.
    pub need_mb: u64,
}

/// Why a sandbox was not admitted: what is full, in a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The number of live sandboxes.
    Count(String),
    /// The cap on summed memory limits.
    Limits(String),
    /// The host's memory: making room (suspending idle sandboxes) can help.
    Memory(String),
    /// The host disk of the data directory.
    Disk(String),
}

impl Refusal {
    pub fn message(&self) -> &str {
        match self {
            Refusal::Count(m) | Refusal::Limits(m) | Refusal::Memory(m) | Refusal::Disk(m) => m,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Held {
    limit_mb: u64,
    need_mb: u64,
    since: Instant,
}

/// The live sandboxes admission knows of.
#[derive(Debug)]
pub struct Admission {
    policy: Policy,
    held: HashMap<String, Held>,
}

impl Admission {
    pub fn new(policy: Policy) -> Self {
        Admission {
            policy,
            held: HashMap::new(),
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Admits sandbox `id`, or says what is full. `host` is `None` where host memory
    /// cannot be read (only the caps apply then).
    pub fn reserve(
        &mut self,
        id: &str,
        want: Want,
        host: Option<HostMemory>,
        disk: Option<HostDisk>,
        now: Instant,
    ) -> Result<(), Refusal> {
        if let Some(disk) = disk.filter(|d| d.free_mb < self.policy.disk_reserve_mb) {
            return Err(Refusal::Disk(format!(
                "Host disk is full: {} MiB free where the data directory keeps {} MiB free",
                disk.free_mb, self.policy.disk_reserve_mb
            )));
        }
        self.check(want, host, now)?;
        self.held.insert(
            id.to_string(),
            Held {
                limit_mb: want.limit_mb,
                need_mb: want.need_mb,
                since: now,
            },
        );
        Ok(())
    }

    fn check(&self, want: Want, host: Option<HostMemory>, now: Instant) -> Result<(), Refusal> {
        let p = self.policy;
        if self.held.len() >= p.max_sandboxes {
            return Err(Refusal::Count(format!(
                "Sandbox limit reached: {} of {} in use",
                self.held.len(),
                p.max_sandboxes
            )));
        }
        let limits = self.limits_mb();
        if limits.saturating_add(want.limit_mb) > p.max_limits_mb {
            return Err(Refusal::Limits(format!(
                "Cap on summed memory limits reached: {} MiB requested, {} of {} MiB free \
                 (max_memory_mb, the overcommit cap)",
                want.limit_mb,
                p.max_limits_mb.saturating_sub(limits),
                p.max_limits_mb
            )));
        }
        let Some(host) = host else {
            return Ok(());
        };
        let pending = self.pending_mb(now);
        let free = host
            .available_mb
            .saturating_sub(p.reserve_mb)
            .saturating_sub(pending);
        if want.need_mb > free {
            return Err(Refusal::Memory(format!(
                "Host memory is full: {} MiB needed to start, {} MiB available of {} MiB \
                 ({} MiB kept free, {} MiB still to be taken by sandboxes just started)",
                want.need_mb, host.available_mb, host.total_mb, p.reserve_mb, pending
            )));
        }
        Ok(())
    }

    /// Start-up needs of sandboxes admitted less than [`SETTLE`] ago.
    fn pending_mb(&self, now: Instant) -> u64 {
        self.held
            .values()
            .filter(|h| now.saturating_duration_since(h.since) < SETTLE)
            .map(|h| h.need_mb)
            .sum()
    }

    /// `id` begins to start now: its start-up need counts as still to come for another
    /// [`SETTLE`] (a fork's children are admitted together and restored a few at a time).
    pub fn starting(&mut self, id: &str, now: Instant) {
        if let Some(h) = self.held.get_mut(id) {
            h.since = now;
        }
    }

    /// Holds room for a sandbox recovered after a restart (or resumed), even past the caps.
    pub fn force(&mut self, id: &str, limit_mb: u64) {
        self.held.insert(
            id.to_string(),
            Held {
                limit_mb,
                need_mb: 0,
                since: Instant::now(),
            },
        );
    }

    /// Releases `id` (idempotent).
    pub fn release(&mut self, id: &str) {
        self.held.remove(id);
    }

    /// Summed memory limits of the live sandboxes.
    pub fn limits_mb(&self) -> u64 {
        self.held.values().map(|h| h.limit_mb).sum()
    }

    /// Number of live sandboxes.
    pub fn count(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            max_sandboxes: 2,
            max_limits_mb: 1000,
            reserve_mb: 100,
            disk_reserve_mb: 1024,
            fork_charge: 1.0,
            merge: true,
        }
    }

    #[test]
    fn admission_overcommits_the_hosts_memory_unless_capped() {
        let c = Config::default();
        let p = Policy::from_config(&c, 24 << 10);
        assert_eq!(p.max_limits_mb, 48 << 10);
        assert_eq!(p.reserve_mb, (24 << 10) / 20);
        assert_eq!(Policy::from_config(&c, 4 << 10).reserve_mb, 512);
        let capped = Config {
            max_memory_mb: 300,
            memory_reserve_mb: 7,
            ..Config::default()
        };
        let p = Policy::from_config(&capped, 24 << 10);
        assert_eq!((p.max_limits_mb, p.reserve_mb), (300, 7));
        let bad = Config {
            memory_overcommit: 0.0,
            ..Config::default()
        };
        assert!(bad.validate().is_err());
        assert_eq!((p.fork_charge, p.merge), (0.25, true));
        for charge in [0.0, -1.0, 1.5, f64::NAN] {
            let bad = Config {
                fork_memory_charge: charge,
                ..Config::default()
            };
            assert!(bad.validate().is_err(), "{charge}");
        }
    }

    fn want(limit_mb: u64, need_mb: u64) -> Want {
        Want { limit_mb, need_mb }
    }

    #[test]
    fn caps_count_and_summed_limits() {
        let mut a = Admission::new(policy());
        let now = Instant::now();
        a.reserve("a", want(600, 10), None, None, now).unwrap();
        let e = a.reserve("b", want(500, 10), None, None, now).unwrap_err();
        assert!(matches!(e, Refusal::Limits(_)), "{e:?}");
        assert!(e.message().contains("overcommit"), "{e:?}");
        a.reserve("b", want(400, 10), None, None, now).unwrap();
        let e = a.reserve("c", want(1, 1), None, None, now).unwrap_err();
        assert!(e.message().contains("Sandbox limit"), "{e:?}");
        a.release("a");
        a.release("a");
        assert_eq!(a.count(), 1);
        a.reserve("c", want(600, 10), None, None, now).unwrap();
        assert_eq!(a.limits_mb(), 1000);
    }

    #[test]
    fn limits_are_caps_not_reservations() {
        // Five 4 GiB sandboxes on an 8 GiB host with plenty of memory actually free.
        let mut a = Admission::new(Policy {
            max_sandboxes: 10,
            max_limits_mb: 16 << 10,
            reserve_mb: 512,
            disk_reserve_mb: 1024,
            ..policy()
        });
        let host = HostMemory {
            total_mb: 8 << 10,
            available_mb: 7 << 10,
        };
        let now = Instant::now();
        for i in 0..4 {
            a.reserve(&format!("s{i}"), want(4096, 300), Some(host), None, now)
                .unwrap();
        }
    }

    #[test]
    fn a_nearly_full_host_disk_refuses_new_sandboxes() {
        let mut a = Admission::new(policy());
        let now = Instant::now();
        let full = Some(HostDisk { free_mb: 900 });
        let e = a.reserve("a", want(64, 10), None, full, now).unwrap_err();
        assert!(matches!(e, Refusal::Disk(_)), "{e:?}");
        assert!(e.message().contains("900 MiB free"), "{e:?}");
        a.reserve(
            "a",
            want(64, 10),
            None,
            Some(HostDisk { free_mb: 5000 }),
            now,
        )
        .unwrap();
    }

    #[test]
    fn real_memory_and_recent_starts_bound_admission() {
        let mut a = Admission::new(Policy {
            max_sandboxes: 10,
            max_limits_mb: 1 << 20,
            reserve_mb: 100,
            disk_reserve_mb: 1024,
            ..policy()
        });
        let host = HostMemory {
            total_mb: 1000,
            available_mb: 700,
        };
        let t0 = Instant::now();
        a.reserve("a", want(4096, 400), Some(host), None, t0)
            .unwrap();
        // 700 - 100 kept free - 400 about to be taken by "a" leaves 200.
        let e = a
            .reserve("b", want(4096, 300), Some(host), None, t0)
            .unwrap_err();
        assert!(matches!(e, Refusal::Memory(_)), "{e:?}");
        assert!(e.message().contains("300 MiB needed"), "{e:?}");
        a.reserve("b", want(4096, 200), Some(host), None, t0)
            .unwrap();
        // Once they settled, what they took shows in the host's figure instead.
        let later = t0 + SETTLE;
        a.reserve("c", want(4096, 550), Some(host), None, later)
            .unwrap();
    }

    /// A 1.5 GiB cap holding a 512 MiB parent: forks of its 60 MiB memory snapshot.
    fn fan_out(fork_charge: f64) -> (Admission, u64) {
        let p = Policy {
            max_sandboxes: 100,
            max_limits_mb: 1536,
            reserve_mb: 100,
            disk_reserve_mb: 1024,
            fork_charge,
            merge: true,
        };
        let mut a = Admission::new(p);
        a.reserve("parent", want(512, 64), None, None, Instant::now())
            .unwrap();
        (a, p.charge_mb(512, Some(60)))
    }

    fn forks_that_fit(a: &mut Admission, charge_mb: u64, host: Option<HostMemory>) -> usize {
        let now = Instant::now();
        (0..50)
            .take_while(|i| {
                a.reserve(&format!("c{i}"), want(charge_mb, 64), host, None, now)
                    .is_ok()
            })
            .count()
    }

    #[test]
    fn fork_children_are_charged_what_they_may_hold_privately() {
        // Summed limits alone (charge 1) fit two 512 MiB children beside their parent.
        let (mut a, charge) = fan_out(1.0);
        assert_eq!(charge, 512);
        assert_eq!(forks_that_fit(&mut a, charge, None), 2);
        // Sharing their snapshot's pages, each may grow privately by a quarter of its
        // limit: eight fit.
        let (mut a, charge) = fan_out(0.25);
        assert_eq!(charge, 128);
        assert_eq!(forks_that_fit(&mut a, charge, None), 8);
        assert_eq!(a.limits_mb(), 512 + 8 * 128);
        let e = a
            .reserve("more", want(charge, 64), None, None, Instant::now())
            .unwrap_err();
        assert!(matches!(e, Refusal::Limits(_)), "{e:?}");
        assert!(
            e.message().contains("Cap on summed memory limits reached")
                && e.message().contains("0 of 1536 MiB free"),
            "{e:?}"
        );
    }

    #[test]
    fn without_merging_a_child_is_charged_its_copy_of_the_images() {
        let p = Policy {
            fork_charge: 0.25,
            merge: false,
            ..policy()
        };
        assert_eq!(p.charge_mb(512, Some(100)), 100 + 128);
        assert_eq!(p.charge_mb(512, Some(600)), 512, "never above its limit");
        assert_eq!(p.charge_mb(512, None), 512, "not a fork: its limit");
        assert_eq!(p.charge_mb(100, Some(0)), 25);
        let merged = Policy { merge: true, ..p };
        assert_eq!(merged.charge_mb(512, Some(100)), 128);
        assert_eq!(merged.charge_mb(10, Some(0)), 3, "rounded up");
    }

    #[test]
    fn host_memory_still_bounds_fork_children() {
        // The cap would take eight; the host has room to start three at once (364 MiB
        // available, 100 kept free, 64 still to be taken by the parent).
        let (mut a, charge) = fan_out(0.25);
        let host = HostMemory {
            total_mb: 1000,
            available_mb: 364,
        };
        assert_eq!(forks_that_fit(&mut a, charge, Some(host)), 3);
        let e = a
            .reserve("more", want(charge, 64), Some(host), None, Instant::now())
            .unwrap_err();
        assert!(matches!(e, Refusal::Memory(_)), "{e:?}");
    }

    #[test]
    fn a_child_starting_late_counts_as_still_to_come() {
        let mut a = Admission::new(Policy {
            max_sandboxes: 10,
            max_limits_mb: 1 << 20,
            ..policy()
        });
        let host = HostMemory {
            total_mb: 1000,
            available_mb: 700,
        };
        let t0 = Instant::now();
        a.reserve("a", want(128, 400), Some(host), None, t0)
            .unwrap();
        let later = t0 + SETTLE;
        assert_eq!(a.pending_mb(later), 0);
        // Admitted with its fork, restored only now: what it takes is not in the host's
        // figure yet.
        a.starting("a", later);
        assert_eq!(a.pending_mb(later), 400);
        let e = a
            .reserve("b", want(128, 300), Some(host), None, later)
            .unwrap_err();
        assert!(matches!(e, Refusal::Memory(_)), "{e:?}");
        a.starting("gone", later);
    }
}
