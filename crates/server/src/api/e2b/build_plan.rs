//! E2B's template steps as a Dockerfile for sandfork's builder.
//!
//! A build start (`POST /v2/templates/{id}/builds/{buildID}`) names a base (`fromImage` or
//! `fromTemplate`) and steps (`RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`). Each becomes one
//! or a few Dockerfile lines; the uploaded files of a COPY are in the build context under
//! their `filesHash`. What the Dockerfile cannot say safely (a value with a quote, a path
//! with a space) is refused with the step named, never written half-way.
//!
//! The template's own settings ride on the image as labels (`e2b.start_cmd`,
//! `e2b.ready_cmd` hex-encoded, `e2b.cpu_count`, `e2b.memory_mb`); the router reads them
//! back when a sandbox is created from the template.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// Label of the command a template's sandboxes start with (hex of its UTF-8).
pub const START_LABEL: &str = "e2b.start_cmd";
/// Label of the command that says a template's sandbox is ready (hex of its UTF-8).
pub const READY_LABEL: &str = "e2b.ready_cmd";
pub const CPU_LABEL: &str = "e2b.cpu_count";
pub const MEMORY_LABEL: &str = "e2b.memory_mb";
/// The most steps one build may have.
const MAX_STEPS: usize = 1000;
/// The most sources a wildcard COPY may expand to.
const MAX_MATCHES: usize = 10_000;

/// `TemplateBuildStartV2`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStart {
    pub from_image: Option<String>,
    pub from_template: Option<String>,
    pub from_image_registry: Option<serde_json::Value>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    #[serde(default)]
    pub steps: Vec<StepIn>,
    #[serde(default)]
    pub force: bool,
}

/// `TemplateStep` (unknown fields, such as the JS SDK's `resolveSymlinks`, are ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepIn {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub force: bool,
    pub files_hash: Option<String>,
}

/// The template's settings from `POST /v3/templates`.
#[derive(Debug, Default, Clone)]
pub struct Settings {
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
}

/// A build as the builder runs it.
#[derive(Debug)]
pub struct Plan {
    pub dockerfile: String,
    /// The E2B step (1-based, as the SDKs number them) of each Dockerfile line that runs
    /// or copies something.
    pub step_of_line: BTreeMap<usize, usize>,
    /// The `filesHash` directories the build reads.
    pub hashes: Vec<String>,
}

/// Why a build cannot start: the message names the step.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused(pub String);

/// Where the uploaded files of each hash are (`<context>/<hash>/…`).
pub trait Uploads {
    fn dir(&self, hash: &str) -> Option<std::path::PathBuf>;
}

impl Uploads for std::path::PathBuf {
    fn dir(&self, hash: &str) -> Option<std::path::PathBuf> {
        let d = self.join(hash);
        d.is_dir().then_some(d)
    }
}

/// Whether `h` is a files hash as the SDKs make them (SHA-256, lowercase hex).
pub fn valid_hash(h: &str) -> bool {
    h.len() == 64
        && h.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The Dockerfile of `start` on base image `from`, whose processes run as `base_user`.
/// `marker` (the build id) makes a forced step and every later one miss the cache.
pub fn plan(
    start: &BuildStart,
    from: &str,
    base_user: &str,
    settings: &Settings,
    marker: &str,
    uploads: &dyn Uploads,
) -> Result<Plan, Refused> {
    if start.steps.len() > MAX_STEPS {
        return Err(Refused(format!("a template has at most {MAX_STEPS} steps")));
    }
    let mut out = Out::default();
    plain(from, "the base image")?;
    out.line(format!("FROM {from}"), None);
    let mut user = base_user.to_string();
    let mut forced = false;
    for (i, step) in start.steps.iter().enumerate() {
        let n = i + 1;
        let what = format!("step {n} ({})", step.kind);
        let refuse = |why: String| Refused(format!("{what}: {why}"));
        if (start.force || step.force) && !forced && makes_layer(&step.kind) {
            // The cache key of every later step names this one's layer.
            forced = true;
            out.line(
                format!(
                    "RUN {}",
                    exec_form(&["/bin/sh", "-c", &format!(": {marker}")])?
                ),
                Some(n),
            );
        }
        match step.kind.as_str() {
            "RUN" => {
                let (cmd, as_user) = match step.args.as_slice() {
                    [cmd] => (cmd, None),
                    [cmd, u] => (cmd, Some(u.as_str()).filter(|u| !u.is_empty())),
                    _ => return Err(refuse("RUN takes a command and an optional user".into())),
                };
                let argv = exec_form(&["/bin/bash", "-c", cmd]).map_err(|e| refuse(e.0))?;
                out.as_user(&user, as_user, format!("RUN {argv}"), n)
                    .map_err(|e| refuse(e.0))?;
            }
            "COPY" => {
                let hash = step.files_hash.as_deref().unwrap_or_default();
                if !valid_hash(hash) {
                    return Err(refuse("COPY needs the filesHash of its files".into()));
                }
                let dir = uploads
                    .dir(hash)
                    .ok_or_else(|| refuse(format!("the files of hash {hash} were not uploaded")))?;
                copy(&mut out, &user, &step.args, hash, &dir, n).map_err(|e| refuse(e.0))?;
                if !out.hashes.iter().any(|h| h == hash) {
                    out.hashes.push(hash.to_string());
                }
            }
            "ENV" => {
                if step.args.is_empty() || !step.args.len().is_multiple_of(2) {
                    return Err(refuse("ENV takes pairs of a name and a value".into()));
                }
                let mut pairs = Vec::new();
                for kv in step.args.chunks(2) {
                    let (k, v) = (&kv[0], &kv[1]);
                    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                        return Err(refuse(format!(
                            "the variable name {k:?} is not supported (letters, digits, _)"
                        )));
                    }
                    if v.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
                        return Err(refuse(format!(
                            "the value of {k} has a quote, a backslash or a control character, which sandfork's Dockerfile builder cannot carry"
                        )));
                    }
                    pairs.push(format!("{k}=\"{v}\""));
                }
                out.line(format!("ENV {}", pairs.join(" ")), None);
            }
            "WORKDIR" => {
                let [dir] = step.args.as_slice() else {
                    return Err(refuse("WORKDIR takes one path".into()));
                };
                plain(dir, "the directory").map_err(|e| refuse(e.0))?;
                if !dir.starts_with('/') {
                    return Err(refuse(format!(
                        "WORKDIR {dir:?}: an absolute path is needed"
                    )));
                }
                out.line(format!("WORKDIR {dir}"), None);
            }
            "USER" => {
                let [u] = step.args.as_slice() else {
                    return Err(refuse("USER takes one user".into()));
                };
                plain(u, "the user").map_err(|e| refuse(e.0))?;
                user = u.clone();
                out.line(format!("USER {u}"), None);
            }
            other => {
                return Err(refuse(format!(
                    "the build step type {other:?} is not supported by sandfork"
                )))
            }
        }
    }
    if let Some(cmd) = start.start_cmd.as_deref().filter(|c| !c.trim().is_empty()) {
        out.line(
            format!("CMD {}", exec_form(&["/bin/bash", "-l", "-c", cmd])?),
            None,
        );
        out.line(format!("LABEL {START_LABEL}={}", hex(cmd)), None);
    }
    if let Some(cmd) = start.ready_cmd.as_deref().filter(|c| !c.trim().is_empty()) {
        out.line(format!("LABEL {READY_LABEL}={}", hex(cmd)), None);
    }
    if let Some(c) = settings.cpu_count {
        out.line(format!("LABEL {CPU_LABEL}={c}"), None);
    }
    if let Some(m) = settings.memory_mb {
        out.line(format!("LABEL {MEMORY_LABEL}={m}"), None);
    }
    Ok(Plan {
        dockerfile: out.text,
        step_of_line: out.steps,
        hashes: out.hashes,
    })
}

fn makes_layer(kind: &str) -> bool {
    matches!(kind, "RUN" | "COPY")
}

#[derive(Default)]
struct Out {
    text: String,
    lines: usize,
    steps: BTreeMap<usize, usize>,
    hashes: Vec<String>,
}

impl Out {
    fn line(&mut self, line: String, step: Option<usize>) {
        self.lines += 1;
        if let Some(n) = step {
            self.steps.insert(self.lines, n);
        }
        self.text.push_str(&line);
        self.text.push('\n');
    }

    /// `line` run as `as_user` (when it is not `current`), then back to `current`.
    fn as_user(
        &mut self,
        current: &str,
        as_user: Option<&str>,
        line: String,
        step: usize,
    ) -> Result<(), Refused> {
        match as_user.filter(|u| *u != current) {
            Some(u) => {
                plain(u, "the user")?;
                self.line(format!("USER {u}"), None);
                self.line(line, Some(step));
                self.line(format!("USER {current}"), None);
            }
            None => self.line(line, Some(step)),
        }
        Ok(())
    }
}

/// A COPY: `args` = `[src, dest, user, mode]` (user and mode may be empty), the files
/// under `<hash>/<src>` in the context.
fn copy(
    out: &mut Out,
    user: &str,
    args: &[String],
    hash: &str,
    dir: &Path,
    step: usize,
) -> Result<(), Refused> {
    let (src, dest) = match args {
        [src, dest, ..] => (src, dest),
        _ => return Err(Refused("COPY takes a source and a destination".into())),
    };
    let owner = args.get(2).map(String::as_str).unwrap_or_default();
    let mode = args.get(3).map(String::as_str).unwrap_or_default();
    plain(src, "the source")?;
    plain(dest, "the destination")?;
    let src = src.trim_start_matches("./");
    let sources: Vec<String> = if src.contains(['*', '?', '[']) {
        let found = matches(dir, src);
        if found.is_empty() {
            return Err(Refused(format!("no uploaded file matches {src:?}")));
        }
        found
    } else {
        vec![src.to_string()]
    };
    let mut words: Vec<String> = sources.iter().map(|s| format!("{hash}/{s}")).collect();
    // Several sources go into a directory (Docker's rule): say so explicitly.
    let dest_dir = dest.ends_with('/') || sources.len() > 1;
    let dest_word = if sources.len() > 1 && !dest.ends_with('/') {
        format!("{dest}/")
    } else {
        dest.clone()
    };
    words.push(dest_word);
    out.line(format!("COPY {}", words.join(" ")), Some(step));
    if owner.is_empty() && mode.is_empty() {
        return Ok(());
    }
    // Ownership and mode of exactly what the COPY wrote, set as root.
    let mut targets = Vec::new();
    for s in &sources {
        let local = dir.join(s);
        let name = Path::new(s)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if local.is_dir() {
            let entries = std::fs::read_dir(&local)
                .map_err(|e| Refused(format!("the uploaded {s:?}: {e}")))?;
            for e in entries.flatten() {
                targets.push(join(dest, &e.file_name().to_string_lossy()));
            }
        } else if dest_dir {
            targets.push(join(dest, &name));
        } else {
            targets.push(dest.clone());
        }
    }
    if targets.is_empty() {
        return Ok(());
    }
    let quoted: Vec<String> = targets.iter().map(|t| shell_quote(t)).collect();
    let mut script = String::new();
    if !owner.is_empty() {
        plain(owner, "the owner")?;
        script += &format!("chown -R {} -- {}", shell_quote(owner), quoted.join(" "));
    }
    if !mode.is_empty() {
        if !(3..=4).contains(&mode.len()) || !mode.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return Err(Refused(format!("the mode {mode:?} is not an octal mode")));
        }
        if !script.is_empty() {
            script += " && ";
        }
        script += &format!(
            "find {} -type f -exec chmod {mode} {{}} +",
            quoted.join(" ")
        );
    }
    let argv = exec_form(&["/bin/sh", "-c", &script])?;
    out.as_user(user, Some("root"), format!("RUN {argv}"), step)
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// A word the Dockerfile carries as written: no whitespace, quotes, backslashes or
/// control characters, and no `$` (it would be substituted).
fn plain(word: &str, what: &str) -> Result<(), Refused> {
    if word.is_empty() {
        return Err(Refused(format!("{what} is empty")));
    }
    if word
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '\\' | '$'))
    {
        return Err(Refused(format!(
            "{what} {word:?} has whitespace, a quote, a backslash, `$` or a control character, which sandfork's Dockerfile builder cannot carry"
        )));
    }
    Ok(())
}

/// A JSON-form argument list as the Dockerfile parser reads it back.
fn exec_form(argv: &[&str]) -> Result<String, Refused> {
    let mut parts = Vec::new();
    for a in argv {
        let mut s = String::from("\"");
        for c in a.chars() {
            match c {
                '"' => s += "\\\"",
                '\\' => s += "\\\\",
                '\n' => s += "\\n",
                '\t' => s += "\\t",
                '\r' => s += "\\r",
                c if c.is_control() => {
                    return Err(Refused(format!(
                        "the command has the control character {c:?}"
                    )))
                }
                c => s.push(c),
            }
        }
        s.push('"');
        parts.push(s);
    }
    Ok(format!("[{}]", parts.join(", ")))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

pub fn hex(s: &str) -> String {
    hex_bytes(s.as_bytes())
}

pub fn hex_bytes(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// The relative paths under `dir` that `pattern` matches (`*` and `?` within a name,
/// `**` across directories), sorted.
fn matches(dir: &Path, pattern: &str) -> Vec<String> {
    let pat: Vec<&str> = pattern.split('/').filter(|p| !p.is_empty()).collect();
    let mut found = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new(), 0usize)];
    while let Some((path, rel, depth)) = stack.pop() {
        if found.len() >= MAX_MATCHES || depth > 64 {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let parts: Vec<&str> = r.split('/').collect();
            if path_matches(&pat, &parts) {
                found.push(r.clone());
            } else if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), r, depth + 1));
            }
        }
    }
    found.sort();
    found
}

fn path_matches(pat: &[&str], parts: &[&str]) -> bool {
    match (pat.first(), parts.first()) {
        (None, None) => true,
        (Some(&"**"), _) => {
            path_matches(&pat[1..], parts) || (!parts.is_empty() && path_matches(pat, &parts[1..]))
        }
        (Some(p), Some(n)) => {
            name_matches(p.as_bytes(), n.as_bytes()) && path_matches(&pat[1..], &parts[1..])
        }
        _ => false,
    }
}

fn name_matches(p: &[u8], n: &[u8]) -> bool {
    match (p.first(), n.first()) {
        (None, None) => true,
        (Some(b'*'), _) => name_matches(&p[1..], n) || (!n.is_empty() && name_matches(p, &n[1..])),
        (Some(b'?'), Some(_)) => name_matches(&p[1..], &n[1..]),
        (Some(a), Some(b)) if a == b => name_matches(&p[1..], &n[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(std::path::PathBuf);
    impl Uploads for Fake {
        fn dir(&self, hash: &str) -> Option<std::path::PathBuf> {
            Some(self.0.join(hash))
        }
    }

    fn step(kind: &str, args: &[&str]) -> StepIn {
        StepIn {
            kind: kind.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn steps_become_a_dockerfile_the_builder_parses_back() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(H).join("data")).unwrap();
        std::fs::write(dir.path().join(H).join("data/a.txt"), "a").unwrap();
        std::fs::write(dir.path().join(H).join("data/b.txt"), "b").unwrap();
        let mut copy = step("COPY", &["data/a.txt", "/home/user/a.txt", "user", "0640"]);
        copy.files_hash = Some(H.into());
        let mut glob = step("COPY", &["data/*.txt", "/opt/all", "", ""]);
        glob.files_hash = Some(H.into());
        let multi = "echo \"hi\" > /tmp/x\ncat <<'EOF' > /tmp/y\n$HOME \\ ok\nEOF";
        let start = BuildStart {
            from_image: Some("base".into()),
            start_cmd: Some("python3 -m http.server 8000".into()),
            ready_cmd: Some("[ -n \"$(ss -Htuln sport = :8000)\" ]".into()),
            steps: vec![
                step("USER", &["root"]),
                step("WORKDIR", &["/"]),
                step("ENV", &["GREETING", "hello world", "PATH2", "$PATH:/x"]),
                step("RUN", &[multi]),
                copy,
                glob,
                step("RUN", &["whoami > /tmp/who", "user"]),
            ],
            ..Default::default()
        };
        let settings = Settings {
            cpu_count: Some(2),
            memory_mb: Some(1024),
        };
        let plan = plan(
            &start,
            "base",
            "root",
            &settings,
            "b1",
            &Fake(dir.path().into()),
        )
        .unwrap();
        let parsed =
            runtime::image::dockerfile::parse(&plan.dockerfile, &Default::default()).unwrap();
        assert_eq!(parsed.from, "base");
        use runtime::image::dockerfile::StepKind;
        let runs: Vec<&Vec<String>> = parsed
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::Run { argv, .. } => Some(argv),
                _ => None,
            })
            .collect();
        assert_eq!(
            runs[0],
            &vec!["/bin/bash".to_string(), "-c".into(), multi.into()]
        );
        assert!(
            runs[1][2].contains("chown -R 'user' -- '/home/user/a.txt'"),
            "{:?}",
            runs[1]
        );
        assert!(runs[1][2].contains("chmod 0640"));
        let envs: Vec<_> = parsed
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::Env(v) => Some(v.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(envs[0][0], ("GREETING".into(), "hello world".into()));
        let copies: Vec<_> = parsed
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::Copy { sources, dest } => Some((sources.clone(), dest.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            copies[0],
            (vec![format!("{H}/data/a.txt")], "/home/user/a.txt".into())
        );
        assert_eq!(
            copies[1],
            (
                vec![format!("{H}/data/a.txt"), format!("{H}/data/b.txt")],
                "/opt/all/".into()
            )
        );
        // The USER around the step run as another user, and back.
        let users: Vec<_> = parsed
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::User(u) => Some(u.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(users, ["root", "user", "root"]);
        // Labels carry the start and ready commands exactly.
        let labels: BTreeMap<String, String> = parsed
            .steps
            .iter()
            .filter_map(|s| match &s.kind {
                StepKind::Label(l) => Some(l.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(
            unhex(&labels[READY_LABEL]).as_deref(),
            start.ready_cmd.as_deref()
        );
        assert_eq!(
            unhex(&labels[START_LABEL]).as_deref(),
            start.start_cmd.as_deref()
        );
        assert_eq!(labels[CPU_LABEL], "2");
        // Every line that runs something maps back to its E2B step.
        let steps: Vec<usize> = plan.step_of_line.values().copied().collect();
        assert_eq!(steps, [4, 5, 5, 6, 7]);
        assert_eq!(plan.hashes, [H]);
    }

    #[test]
    fn what_the_dockerfile_cannot_carry_is_refused_with_its_step() {
        let dir = tempfile::tempdir().unwrap();
        let uploads = Fake(dir.path().into());
        let cases = [
            step("ENV", &["A", "has \"quote\""]),
            step("ENV", &["A B", "x"]),
            step("ENV", &["A"]),
            step("USER", &["root\nRUN evil"]),
            step("WORKDIR", &["relative"]),
            step("COPY", &["a", "/b"]),
            step("HEALTHCHECK", &["x"]),
            step("RUN", &["a", "b", "c"]),
        ];
        for (i, s) in cases.into_iter().enumerate() {
            let kind = s.kind.clone();
            let start = BuildStart {
                steps: vec![step("RUN", &["true"]), s],
                ..Default::default()
            };
            let err = plan(&start, "base", "root", &Settings::default(), "b", &uploads)
                .expect_err(&format!("case {i}"));
            assert!(err.0.starts_with(&format!("step 2 ({kind})")), "{}", err.0);
        }
        let start = BuildStart::default();
        assert!(plan(&start, "a b", "root", &Settings::default(), "b", &uploads).is_err());
    }

    #[test]
    fn a_forced_step_adds_a_marker_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut forced = step("RUN", &["echo b"]);
        forced.force = true;
        let start = BuildStart {
            steps: vec![step("RUN", &["echo a"]), forced, step("RUN", &["echo c"])],
            ..Default::default()
        };
        let p = plan(
            &start,
            "base",
            "root",
            &Settings::default(),
            "build-1",
            &Fake(dir.path().into()),
        )
        .unwrap();
        let lines: Vec<&str> = p.dockerfile.lines().collect();
        assert!(lines[2].contains(": build-1"), "{lines:?}");
        assert!(lines[3].contains("echo b"));
    }

    #[test]
    fn globs_match_names_and_directories() {
        assert!(name_matches(b"*.txt", b"a.txt"));
        assert!(!name_matches(b"*.txt", b"a.txt.bak"));
        assert!(name_matches(b"a?c", b"abc"));
        assert!(path_matches(&["**", "*.py"], &["src", "pkg", "m.py"]));
        assert!(path_matches(&["src", "*"], &["src", "x"]));
        assert!(!path_matches(&["src", "*"], &["src", "x", "y"]));
        assert_eq!(unhex(&hex("ünï $x")).as_deref(), Some("ünï $x"));
        assert_eq!(unhex("zz"), None);
        assert!(valid_hash(H) && !valid_hash("../x") && !valid_hash(&H.to_uppercase()));
    }
}
