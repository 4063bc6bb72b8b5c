//! Timestamps as the API and the state database write them: RFC 3339 in UTC with
//! milliseconds (`2026-12-02T06:05:12.345Z`), which sort as text in time order.

use std::time::{SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;

/// `at` in RFC 3339 with milliseconds, UTC.
pub fn rfc3339_millis(at: SystemTime) -> String {
    let ms = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i128,
        Err(e) => -(e.duration().as_millis() as i128),
    };
    from_unix_millis(ms as i64)
}

/// The Unix time `ms` (milliseconds) in RFC 3339 with milliseconds, UTC.
pub fn from_unix_millis(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// Milliseconds since the Unix epoch of an RFC 3339 time, any offset and precision
/// (`2026-12-02T06:05:12.345Z`, `2026-12-07T14:19:51.930581+00:00`); `None` for anything
/// that is not one.
pub fn unix_millis(rfc3339: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(
        rfc3339.trim(),
        &time::format_description::well_known::Rfc3339,
    )
    .ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Now, as [`rfc3339_millis`] writes it.
pub fn now() -> String {
    rfc3339_millis(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_as_the_api_always_did() {
        assert_eq!(from_unix_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            from_unix_millis(1_764_655_512_345),
            "2025-12-02T06:05:12.345Z"
        );
        assert_eq!(
            unix_millis("2025-12-02T06:05:12.345Z"),
            Some(1_764_655_512_345)
        );
        assert_eq!(
            unix_millis("2025-12-02T07:05:12.345+01:00"),
            Some(1_764_655_512_345)
        );
        assert_eq!(unix_millis("yesterday"), None);
        let a = now();
        assert!(a.len() == 24 && a.ends_with('Z'), "{a}");
    }
}
