//! Admission control: caps on live sandboxes and on their summed `memory_mb`, reserved
//! before anything is created and released when a sandbox stops holding resources.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// Reservations of live sandboxes.
#[derive(Debug)]
pub struct Admission {
    max_sandboxes: usize,
    max_memory_mb: u64,
    held: HashMap<String, u64>,
}

impl Admission {
    pub fn new(max_sandboxes: u32, max_memory_mb: u64) -> Self {
        Admission {
            max_sandboxes: max_sandboxes as usize,
            max_memory_mb,
            held: HashMap::new(),
        }
    }

    /// Reserves room for sandbox `id` with `memory_mb`, or refuses at once.
    pub fn reserve(&mut self, id: &str, memory_mb: u64) -> Result<()> {
        if self.held.len() >= self.max_sandboxes {
            return Err(Error::OverCapacity(format!(
                "Sandbox limit reached: {} of {} in use",
                self.held.len(),
                self.max_sandboxes
            )));
        }
        let used = self.memory_used();
        if used.saturating_add(memory_mb) > self.max_memory_mb {
            return Err(Error::OverCapacity(format!(
                "Memory limit reached: {memory_mb} MiB requested, {} of {} MiB free",
                self.max_memory_mb.saturating_sub(used),
                self.max_memory_mb
            )));
        }
        self.held.insert(id.to_string(), memory_mb);
        Ok(())
    }

    /// Holds room for a sandbox recovered after a restart, even past the caps.
    pub fn force(&mut self, id: &str, memory_mb: u64) {
        self.held.insert(id.to_string(), memory_mb);
    }

    /// Releases `id`'s reservation (idempotent).
    pub fn release(&mut self, id: &str) {
        self.held.remove(id);
    }

    /// Summed memory of all reservations.
    pub fn memory_used(&self) -> u64 {
        self.held.values().sum()
    }

    /// Number of reservations.
    pub fn count(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_count_and_memory() {
        let mut a = Admission::new(2, 1000);
        a.reserve("a", 600).unwrap();
        let e = a.reserve("b", 500).unwrap_err();
        assert_eq!(e.status_code().0, 429);
        assert!(e.to_string().contains("Memory limit"), "{e}");
        a.reserve("b", 400).unwrap();
        let e = a.reserve("c", 1).unwrap_err();
        assert!(e.to_string().contains("Sandbox limit"), "{e}");
        a.release("a");
        a.release("a");
        assert_eq!(a.count(), 1);
        a.reserve("c", 600).unwrap();
        assert_eq!(a.memory_used(), 1000);
    }
}
