//! The wall clock as the protocol carries it: milliseconds since the Unix epoch, for
//! when a process started and ended, when a log line was read, and when a supervised
//! process restarts.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in milliseconds since the Unix epoch (0 for a clock set before it).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
