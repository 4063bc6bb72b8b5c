//! Log rate limiting for events a sandbox can trigger (so a hostile guest cannot flood the
//! daemon's log): at most `burst` lines per key per window, then one summary of how many
//! were suppressed when the next window opens.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A per-key fixed-window limiter.
pub struct RateLimit {
    window: Duration,
    burst: u32,
    keys: Mutex<HashMap<String, Window>>,
}

struct Window {
    start: Instant,
    count: u32,
    suppressed: u64,
}

/// The verdict for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `suppressed` lines were dropped in the previous window.
    Log {
        suppressed: u64,
    },
    Drop,
}

impl RateLimit {
    pub fn new(window: Duration, burst: u32) -> Self {
        RateLimit {
            window,
            burst,
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// Whether an event under `key` may be logged now.
    pub fn check(&self, key: &str) -> Verdict {
        self.check_at(key, Instant::now())
    }

    fn check_at(&self, key: &str, now: Instant) -> Verdict {
        let Ok(mut keys) = self.keys.lock() else {
            return Verdict::Drop;
        };
        if keys.len() > 10_000 {
            keys.retain(|_, w| now.duration_since(w.start) < self.window);
        }
        let w = keys.entry(key.to_string()).or_insert(Window {
            start: now,
            count: 0,
            suppressed: 0,
        });
        let mut previous = 0;
        if now.duration_since(w.start) >= self.window {
            previous = std::mem::take(&mut w.suppressed);
            w.start = now;
            w.count = 0;
        }
        if w.count < self.burst {
            w.count += 1;
            Verdict::Log {
                suppressed: previous,
            }
        } else {
            w.suppressed += 1;
            Verdict::Drop
        }
    }
}

/// Logs a warning about a sandbox-triggered event through the daemon's limiter.
#[macro_export]
macro_rules! guest_warn {
    ($limiter:expr, $key:expr, $($arg:tt)+) => {
        if let $crate::logs::Verdict::Log { suppressed } = $limiter.check($key) {
            tracing::warn!(suppressed, $($arg)+);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_drops_then_reports() {
        let rl = RateLimit::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        assert_eq!(rl.check_at("a", t0), Verdict::Log { suppressed: 0 });
        assert_eq!(rl.check_at("a", t0), Verdict::Log { suppressed: 0 });
        assert_eq!(rl.check_at("a", t0), Verdict::Drop);
        assert_eq!(rl.check_at("a", t0), Verdict::Drop);
        assert_eq!(rl.check_at("b", t0), Verdict::Log { suppressed: 0 });
        let t1 = t0 + Duration::from_secs(11);
        assert_eq!(rl.check_at("a", t1), Verdict::Log { suppressed: 2 });
    }
}
