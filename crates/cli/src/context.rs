//! The build context of a Dockerfile build: the directory as a tar, without what its
//! `.dockerignore` names (Docker's rules: `*`, `?`, `**` globs on paths relative to the
//! context; a matched directory leaves out all it holds; `!pattern` takes a path back; the
//! last matching line wins). A Dockerfile outside the context is added as
//! `.sandfork.Dockerfile`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The `.dockerignore` of a context.
pub struct Ignore {
    rules: Vec<(glob::Pattern, bool)>,
}

impl Ignore {
    pub fn parse(text: &str) -> Result<Ignore> {
        let mut rules = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (keep, pat) = match line.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, line),
            };
            let pat = pat
                .trim_start_matches("./")
                .trim_start_matches('/')
                .trim_end_matches('/');
            let p = glob::Pattern::new(pat)
                .with_context(|| format!(".dockerignore: bad pattern {line:?}"))?;
            rules.push((p, keep));
        }
        Ok(Ignore { rules })
    }

    /// Whether `rel` (relative to the context, `/`-separated) is left out.
    pub fn excludes(&self, rel: &str) -> bool {
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        let mut out = false;
        // The path or any directory above it.
        let mut prefixes = Vec::new();
        let mut acc = String::new();
        for part in rel.split('/') {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(part);
            prefixes.push(acc.clone());
        }
        for (p, keep) in &self.rules {
            if prefixes.iter().any(|x| p.matches_with(x, opts)) {
                out = !keep;
            }
        }
        out
    }
}

/// Writes the context at `dir` as a tar to a temporary file; returns it and the path of the
/// Dockerfile inside the context.
pub fn tar_context(dir: &Path, dockerfile: &Path) -> Result<(tempfile::NamedTempFile, String)> {
    let ignore = match std::fs::read_to_string(dir.join(".dockerignore")) {
        Ok(text) => Ignore::parse(&text)?,
        Err(_) => Ignore { rules: Vec::new() },
    };
    let out = tempfile::NamedTempFile::new().context("creating the context tar")?;
    let mut tar = tar::Builder::new(out.reopen()?);
    tar.follow_symlinks(false);
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let full = dir.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&full)
            .with_context(|| format!("reading {}", full.display()))?
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let r = rel.join(e.file_name());
            let key = r.to_string_lossy().replace('\\', "/");
            if ignore.excludes(&key) {
                continue;
            }
            let ft = e.file_type()?;
            if ft.is_dir() {
                tar.append_dir(&r, e.path())?;
                stack.push(r);
            } else if ft.is_file() || ft.is_symlink() {
                tar.append_path_with_name(e.path(), &r)?;
            }
        }
    }
    let canon_dir = dir.canonicalize()?;
    let canon_file = dockerfile
        .canonicalize()
        .with_context(|| format!("Dockerfile {}", dockerfile.display()))?;
    let name = match canon_file.strip_prefix(&canon_dir) {
        Ok(rel) if !ignore.excludes(&rel.to_string_lossy()) => rel.to_string_lossy().into_owned(),
        _ => {
            tar.append_path_with_name(&canon_file, ".sandfork.Dockerfile")?;
            ".sandfork.Dockerfile".into()
        }
    };
    tar.into_inner()?.sync_all()?;
    Ok((out, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerignore_follows_docker() {
        let i = Ignore::parse("# c\n*.log\nbuild/\n**/secret*\n!keep.log\nnode_modules\n").unwrap();
        assert!(i.excludes("x.log"));
        assert!(!i.excludes("keep.log"));
        assert!(!i.excludes("sub/x.log"), "* does not cross /");
        assert!(i.excludes("build/out/a.o"));
        assert!(i.excludes("a/b/secret.txt"));
        assert!(i.excludes("node_modules/x/y.js"));
        assert!(!i.excludes("src/main.c"));
    }
}
