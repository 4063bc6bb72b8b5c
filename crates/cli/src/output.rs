//! Human output: aligned tables; `--json` prints the daemon's JSON instead.

use serde_json::Value;

/// Prints rows under headers, columns padded to their widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// A JSON field as display text ("-" when absent).
pub fn field(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// An optional value as display text ("-" when absent).
pub fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".into())
}

/// Pretty JSON on stdout.
pub fn json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Bytes in a human unit.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// A JSON array of strings as one space-separated line ("" when absent).
pub fn joined(v: &Value) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// A JSON object of strings as `k=v` pairs on one line ("" when absent).
pub fn pairs(v: &Value) -> String {
    v.as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_fields_render() {
        assert_eq!(size(12), "12 B");
        assert_eq!(size(1536), "1.5 KiB");
        let v = serde_json::json!({"a": "x", "n": 3});
        assert_eq!(field(&v, "a"), "x");
        assert_eq!(field(&v, "n"), "3");
        assert_eq!(field(&v, "missing"), "-");
    }
}
