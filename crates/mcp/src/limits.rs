//! Bounds on what goes back to the client: a command's output, a file read, a listing.
//! Whatever is cut is said so, with how much there was.

/// A command's stdout and stderr are each cut here unless the call asks for less or more.
pub const DEFAULT_OUTPUT_BYTES: usize = 64 << 10;
/// The most a call may ask for, per stream.
pub const MAX_OUTPUT_BYTES: usize = 1 << 20;
/// A file read (tool or resource) is cut here unless the call asks otherwise.
pub const DEFAULT_READ_BYTES: usize = 256 << 10;
/// The most a file read may return.
pub const MAX_READ_BYTES: usize = 4 << 20;
/// A directory listing shows at most this many entries.
pub const MAX_LIST_ENTRIES: usize = 1000;
/// A log resource shows the last this many lines.
pub const LOG_TAIL_LINES: usize = 1000;
/// The most children one fork call may ask for.
pub const MAX_FORK_COUNT: u32 = 64;
/// A command's timeout unless the call gives one, and the most it may give (seconds).
pub const DEFAULT_TIMEOUT_SECS: f64 = 300.0;
pub const MAX_TIMEOUT_SECS: f64 = 3600.0;

/// A byte buffer that keeps the first `cap` bytes and counts the rest.
#[derive(Debug, Default)]
pub struct Capped {
    cap: usize,
    kept: Vec<u8>,
    total: u64,
}

impl Capped {
    pub fn new(cap: usize) -> Capped {
        Capped {
            cap,
            kept: Vec::new(),
            total: 0,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// Whether anything was dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }

    pub fn is_full(&self) -> bool {
        self.kept.len() >= self.cap
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Sets the total when more is known than was read (a read cut short).
    pub fn set_total(&mut self, total: u64) {
        self.total = total.max(self.kept.len() as u64);
    }

    pub fn kept_len(&self) -> usize {
        self.kept.len()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.kept
    }

    /// The kept bytes as text: the UTF-8 they hold (a character cut at the end by the cap
    /// is left out), or `None` when they are not UTF-8.
    pub fn text(&self) -> Option<String> {
        as_text(&self.kept, self.truncated())
    }
}

/// Bytes as UTF-8 text; when `cut`, an incomplete character at the very end is dropped.
pub fn as_text(bytes: &[u8], cut: bool) -> Option<String> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Some(s.to_string()),
        Err(e) if cut && e.error_len().is_none() => {
            Some(String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned())
        }
        Err(_) => None,
    }
}

/// The note put after output that was cut.
pub fn truncation_note(what: &str, kept: usize, total: u64) -> String {
    format!("[{what} truncated: showing the first {kept} of {total} bytes]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_bytes_and_counts_all() {
        let mut c = Capped::new(4);
        c.push(b"ab");
        c.push(b"cdef");
        assert!(c.truncated());
        assert_eq!(c.total(), 6);
        assert_eq!(c.text().as_deref(), Some("abcd"));
    }

    #[test]
    fn a_character_cut_by_the_cap_is_left_out() {
        let mut c = Capped::new(2);
        c.push("aé".as_bytes());
        assert_eq!(c.text().as_deref(), Some("a"));
        assert_eq!(as_text(&[0xff, 0x00], false), None);
    }
}
