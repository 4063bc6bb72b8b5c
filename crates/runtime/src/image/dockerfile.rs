//! Dockerfiles: parsed by `dockerfile-parser` and turned into a build plan of typed steps,
//! with `ARG` and `ENV` values substituted as Docker does (`$NAME`, `${NAME}`,
//! `${NAME:-default}`, `${NAME:+alt}`) everywhere but in `RUN`, whose shell sees them as
//! environment. Anything this builder cannot do is refused with the instruction's line.

use std::collections::BTreeMap;

use dockerfile_parser::{Dockerfile as Parsed, Instruction, ShellOrExecExpr};

use crate::error::{Error, Result};

/// A Dockerfile as a build runs it: one base, then steps in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    /// The `FROM` image (a local name or a registry reference).
    pub from: String,
    pub steps: Vec<Step>,
}

/// One instruction after `FROM`, with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub line: usize,
    /// The instruction as written (for progress and for the cache key).
    pub text: String,
    pub kind: StepKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    /// A command in a build sandbox (`sh -c` for the shell form), with the `ARG` values
    /// in scope added to its environment.
    Run {
        argv: Vec<String>,
        args: BTreeMap<String, String>,
    },
    /// Files of the build context (`COPY`, `ADD` of local files) to `dest`.
    Copy {
        sources: Vec<String>,
        dest: String,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
    Entrypoint(Vec<String>),
    Cmd(Vec<String>),
    Label(Vec<(String, String)>),
    Expose(Vec<String>),
}

impl StepKind {
    /// Whether the step changes the file system (and so makes a layer).
    pub fn makes_layer(&self) -> bool {
        matches!(self, StepKind::Run { .. } | StepKind::Copy { .. })
    }
}

/// The most bytes substitution may produce over one Dockerfile, counting the `ARG` values
/// each `RUN` gets: variables that refer to each other (`ENV A=$A$A`, line after line)
/// would otherwise grow the plan exponentially from a few hundred bytes of input.
pub const MAX_EXPANDED: usize = 8 << 20;

fn bad(line: usize, msg: impl std::fmt::Display) -> Error {
    Error::Image(format!("Dockerfile line {line}: {msg}"))
}

/// Parses a Dockerfile; `build_args` set `ARG` values (`--build-arg`).
pub fn parse(text: &str, build_args: &BTreeMap<String, String>) -> Result<Dockerfile> {
    let parsed = Parsed::parse(text).map_err(|e| Error::Image(format!("Dockerfile: {e}")))?;
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    let mut from: Option<String> = None;
    let mut steps = Vec::new();
    let expanded = std::cell::Cell::new(0usize);
    let charge = |line: usize, n: usize| {
        expanded.set(expanded.get().saturating_add(n));
        if expanded.get() > MAX_EXPANDED {
            return Err(bad(
                line,
                format!(
                    "variables expand past {} MiB over the Dockerfile",
                    MAX_EXPANDED >> 20
                ),
            ));
        }
        Ok(())
    };
    for ins in &parsed.instructions {
        let span = span_of(ins);
        let line = line_of(span.0);
        let raw = text[span.0..span.1.min(text.len())].trim().to_string();
        let sub = |s: &str| {
            let out = substitute(s, &vars).map_err(|e| bad(line, e))?;
            charge(line, out.len())?;
            Ok(out)
        };
        let kind = match ins {
            Instruction::From(f) => {
                if from.is_some() {
                    return Err(bad(
                        line,
                        "multi-stage builds (a second FROM) are not supported yet",
                    ));
                }
                if !f.flags.is_empty() {
                    return Err(bad(line, "FROM flags (--platform) are not supported"));
                }
                from = Some(sub(&f.image.content)?);
                continue;
            }
            Instruction::Arg(a) => {
                let name = a.name.content.clone();
                let value = build_args
                    .get(&name)
                    .cloned()
                    .or_else(|| a.value.as_ref().map(|v| v.content.clone()))
                    .map(|v| sub(&unquote(&v)))
                    .transpose()?
                    .unwrap_or_default();
                args.insert(name.clone(), value.clone());
                vars.entry(name).or_insert(value);
                continue;
            }
            _ if from.is_none() => {
                return Err(bad(line, "the first instruction must be FROM (or ARG)"));
            }
            Instruction::Run(r) => {
                // Each `RUN` carries the `ARG` values in scope: counted, or a few large
                // values and many `RUN`s would make a plan quadratic in the input.
                charge(line, args.iter().map(|(k, v)| k.len() + v.len()).sum())?;
                StepKind::Run {
                    argv: argv_of(&r.expr),
                    args: args.clone(),
                }
            }
            Instruction::Copy(c) => {
                if let Some(flag) = c.flags.first() {
                    return Err(bad(
                        line,
                        format!("COPY --{} is not supported yet", flag.name.content),
                    ));
                }
                StepKind::Copy {
                    sources: c
                        .sources
                        .iter()
                        .map(|s| sub(&s.content))
                        .collect::<Result<_>>()?,
                    dest: sub(&c.destination.content)?,
                }
            }
            Instruction::Env(e) => {
                // Values see the variables as they were before this instruction.
                let set = e
                    .vars
                    .iter()
                    .map(|v| Ok((v.key.content.clone(), sub(&unquote(&v.value.to_string()))?)))
                    .collect::<Result<Vec<_>>>()?;
                vars.extend(set.iter().cloned());
                StepKind::Env(set)
            }
            Instruction::Label(l) => StepKind::Label(
                l.labels
                    .iter()
                    .map(|x| {
                        Ok((
                            sub(&unquote(&x.name.content))?,
                            sub(&unquote(&x.value.content))?,
                        ))
                    })
                    .collect::<Result<_>>()?,
            ),
            Instruction::Entrypoint(e) => StepKind::Entrypoint(argv_of(&e.expr)),
            Instruction::Cmd(c) => StepKind::Cmd(argv_of(&c.expr)),
            Instruction::Misc(m) => {
                let name = m.instruction.content.to_ascii_uppercase();
                let arg = m.arguments.to_string().trim().to_string();
                misc(&name, &arg, line, &sub)?
            }
        };
        steps.push(Step {
            line,
            text: raw,
            kind,
        });
    }
    let from = from.ok_or_else(|| Error::Image("Dockerfile: no FROM instruction".into()))?;
    Ok(Dockerfile { from, steps })
}

fn misc(
    name: &str,
    arg: &str,
    line: usize,
    sub: &dyn Fn(&str) -> Result<String>,
) -> Result<StepKind> {
    Ok(match name {
        "WORKDIR" => {
            let dir = sub(arg)?;
            if !dir.starts_with('/') {
                return Err(bad(line, "WORKDIR must be an absolute path"));
            }
            StepKind::Workdir(dir)
        }
        "USER" => StepKind::User(sub(arg)?),
        "EXPOSE" => StepKind::Expose(
            sub(arg)?
                .split_whitespace()
                .map(|p| {
                    if p.contains('/') {
                        p.to_string()
                    } else {
                        format!("{p}/tcp")
                    }
                })
                .collect(),
        ),
        "ADD" => {
            let words: Vec<String> = arg.split_whitespace().map(sub).collect::<Result<_>>()?;
            if words.iter().any(|w| w.starts_with("--")) {
                return Err(bad(line, "ADD flags are not supported yet"));
            }
            let Some((dest, sources)) = words.split_last().filter(|(_, s)| !s.is_empty()) else {
                return Err(bad(line, "ADD needs a source and a destination"));
            };
            for s in sources {
                if s.contains("://") {
                    return Err(bad(
                        line,
                        "ADD from a URL is not supported; RUN a download instead",
                    ));
                }
                if [".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2"]
                    .iter()
                    .any(|x| s.ends_with(x))
                {
                    return Err(bad(
                        line,
                        "ADD of an archive (extracted) is not supported yet; COPY it and RUN tar",
                    ));
                }
            }
            StepKind::Copy {
                sources: sources.to_vec(),
                dest: dest.clone(),
            }
        }
        "SHELL" | "ONBUILD" | "HEALTHCHECK" | "STOPSIGNAL" | "VOLUME" => {
            return Err(bad(line, format!("{name} is not supported yet")))
        }
        other => return Err(bad(line, format!("unknown instruction {other}"))),
    })
}

fn span_of(ins: &Instruction) -> (usize, usize) {
    let s = match ins {
        Instruction::From(i) => i.span,
        Instruction::Arg(i) => i.span,
        Instruction::Label(i) => i.span,
        Instruction::Run(i) => i.span,
        Instruction::Entrypoint(i) => i.span,
        Instruction::Cmd(i) => i.span,
        Instruction::Copy(i) => i.span,
        Instruction::Env(i) => i.span,
        Instruction::Misc(i) => i.span,
    };
    (s.start, s.end)
}

/// The exec form as it is; the shell form through `/bin/sh -c`.
fn argv_of(expr: &ShellOrExecExpr) -> Vec<String> {
    match expr {
        ShellOrExecExpr::Exec(a) => a.elements.iter().map(|e| e.content.clone()).collect(),
        ShellOrExecExpr::Shell(s) => vec![
            "/bin/sh".into(),
            "-c".into(),
            s.to_string().trim().to_string(),
        ],
    }
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['"', '\''] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return s[1..s.len() - 1].to_string();
        }
    }
    s.to_string()
}

/// Docker's variable substitution: `$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME:+word}`;
/// `\$` is a literal `$`; an unset variable is empty.
pub fn substitute(s: &str, vars: &BTreeMap<String, String>) -> std::result::Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'$') => {
                out.push('$');
                chars.next();
            }
            '$' if chars.peek() == Some(&'{') => {
                chars.next();
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(ch) => inner.push(ch),
                        None => return Err(format!("unclosed ${{ in {s:?}")),
                    }
                }
                let (name, op) = match inner.find(':') {
                    Some(i) => (&inner[..i], Some(&inner[i..])),
                    None => (inner.as_str(), None),
                };
                let value = vars.get(name).filter(|v| !v.is_empty());
                out.push_str(&match op {
                    None => value.cloned().unwrap_or_default(),
                    Some(o) if o.starts_with(":-") => {
                        value.cloned().unwrap_or_else(|| o[2..].to_string())
                    }
                    Some(o) if o.starts_with(":+") => {
                        value.map(|_| o[2..].to_string()).unwrap_or_default()
                    }
                    Some(o) => return Err(format!("unsupported substitution ${{{name}{o}}}")),
                });
            }
            '$' if chars
                .peek()
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == '_') =>
            {
                let mut name = String::new();
                while let Some(&ch) = chars.peek() {
                    if ch.is_ascii_alphanumeric() || ch == '_' {
                        name.push(ch);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push_str(vars.get(&name).map(String::as_str).unwrap_or(""));
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dockerfile_becomes_steps() {
        let text = "ARG BASE=busybox\nFROM $BASE\nARG GREETING=hi\nENV NAME=world DIR=/srv\n\
            WORKDIR ${DIR}/app\nCOPY a.txt b/ ${DIR}/\nRUN echo $GREETING \\\n  && echo done\n\
            USER 1000:1000\nLABEL team=rl\nEXPOSE 8080 53/udp\nENTRYPOINT [\"/bin/sh\"]\nCMD [\"-c\", \"echo\"]\n";
        let args = BTreeMap::from([("GREETING".to_string(), "hello".to_string())]);
        let d = parse(text, &args).unwrap();
        assert_eq!(d.from, "busybox");
        let kinds: Vec<&StepKind> = d.steps.iter().map(|s| &s.kind).collect();
        assert_eq!(
            kinds[0],
            &StepKind::Env(vec![
                ("NAME".into(), "world".into()),
                ("DIR".into(), "/srv".into())
            ])
        );
        assert_eq!(kinds[1], &StepKind::Workdir("/srv/app".into()));
        assert_eq!(
            kinds[2],
            &StepKind::Copy {
                sources: vec!["a.txt".into(), "b/".into()],
                dest: "/srv/".into()
            }
        );
        let StepKind::Run { argv, args } = kinds[3] else {
            panic!("{:?}", kinds[3])
        };
        assert_eq!(argv[..2], ["/bin/sh".to_string(), "-c".to_string()]);
        assert!(
            argv[2].contains("echo $GREETING") && argv[2].contains("echo done"),
            "{argv:?}"
        );
        assert_eq!(args.get("GREETING").map(String::as_str), Some("hello"));
        assert_eq!(kinds[4], &StepKind::User("1000:1000".into()));
        assert_eq!(
            kinds[5],
            &StepKind::Label(vec![("team".into(), "rl".into())])
        );
        assert_eq!(
            kinds[6],
            &StepKind::Expose(vec!["8080/tcp".into(), "53/udp".into()])
        );
        assert_eq!(kinds[7], &StepKind::Entrypoint(vec!["/bin/sh".into()]));
        assert_eq!(kinds[8], &StepKind::Cmd(vec!["-c".into(), "echo".into()]));
        assert_eq!(d.steps[3].line, 7);
    }

    #[test]
    fn what_cannot_be_built_is_refused_with_its_line() {
        let cases = [
            (
                "FROM a\nFROBNICATE x\n",
                "line 2: unknown instruction FROBNICATE",
            ),
            ("RUN true\n", "line 1: the first instruction must be FROM"),
            ("FROM a\nFROM b\n", "line 2: multi-stage"),
            ("FROM a\nADD https://x/y /y\n", "line 2: ADD from a URL"),
            (
                "FROM a\nWORKDIR rel\n",
                "line 2: WORKDIR must be an absolute path",
            ),
            ("FROM a\nCOPY --chown=1 a /a\n", "line 2: COPY --chown"),
            ("ENV A=1\n", "the first instruction must be FROM"),
            ("", "no FROM"),
        ];
        for (text, want) in cases {
            let e = parse(text, &BTreeMap::new()).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn variables_cannot_expand_without_bound() {
        // The bound `scripts/fuzz dockerfile` asserts: each line doubles the value, so 40
        // short lines asked for terabytes.
        let doubling = format!("FROM a\nENV A=xxxxxxxx\n{}", "ENV A=$A$A\n".repeat(40));
        let e = parse(&doubling, &BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("expand past"), "{e}");
        // Many RUNs each carrying a large ARG value: quadratic, refused the same way.
        let quadratic = format!(
            "FROM a\nARG BIG={}\n{}",
            "x".repeat(100_000),
            "RUN true\n".repeat(200)
        );
        let e = parse(&quadratic, &BTreeMap::new()).unwrap_err().to_string();
        assert!(e.contains("expand past"), "{e}");
        // What real Dockerfiles do still works.
        let ok = "FROM a\nENV PATH=/bin\nENV PATH=$PATH:/opt/bin\nRUN true\n";
        assert!(parse(ok, &BTreeMap::new()).is_ok());
    }

    #[test]
    fn substitution_follows_docker() {
        let vars = BTreeMap::from([
            ("A".to_string(), "x".to_string()),
            ("E".to_string(), String::new()),
        ]);
        let s = |t: &str| substitute(t, &vars).unwrap();
        assert_eq!(
            s("$A/${A}/${B:-d}/${A:+alt}/${B:+alt}/\\$A"),
            "x/x/d/alt//$A"
        );
        assert_eq!(s("${E:-empty}"), "empty");
        assert!(substitute("${A", &vars).is_err());
    }
}
