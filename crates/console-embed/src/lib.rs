//! The web console's files (HTML, scripts, styles), built from `console/` when this crate
//! is built and carried inside the binary: the daemon serves them under `/ui/` with no
//! files of its own on disk.

/// Every file of the built console: its path relative to `/ui/`, and its bytes.
pub static ASSETS: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/assets.rs"));

/// The file at `path` (relative to `/ui/`) and its media type.
pub fn asset(path: &str) -> Option<(&'static [u8], &'static str)> {
    let path = if path.is_empty() { "index.html" } else { path };
    ASSETS
        .iter()
        .find(|(name, _)| *name == path)
        .map(|(_, bytes)| (*bytes, media_type(path)))
}

fn media_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("woff2") => "font/woff2",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_is_built_in() {
        let (index, kind) = asset("").expect("index.html");
        assert!(kind.starts_with("text/html"));
        let text = String::from_utf8_lossy(index);
        assert!(
            text.contains("/ui/assets/"),
            "assets are addressed under /ui/"
        );
        assert!(ASSETS.iter().any(|(name, _)| name.ends_with(".js")));
        assert!(asset("../Cargo.toml").is_none());
    }
}
