//! A Dockerfile (the build API's input): any text is turned into a build plan or refused
//! with a typed error, never a panic; parsing is deterministic and bounded — what the
//! plan holds (every string of every step, after `ARG`/`ENV` substitution) stays within
//! the parser's expansion cap however the variables refer to each other — and every step
//! keeps its 1-based line and its text as written.
#![no_main]

/// The runtime's error type, as far as the parser uses it.
mod error {
    #[derive(Debug)]
    pub enum Error {
        Image(String),
    }
    pub type Result<T> = std::result::Result<T, Error>;
}

#[path = "../../src/image/dockerfile.rs"]
#[allow(dead_code)]
mod dockerfile;

use std::collections::BTreeMap;

use dockerfile::StepKind;
use libfuzzer_sys::fuzz_target;

fn kind_bytes(k: &StepKind) -> usize {
    let pairs = |v: &[(String, String)]| v.iter().map(|(a, b)| a.len() + b.len()).sum::<usize>();
    let list = |v: &[String]| v.iter().map(String::len).sum::<usize>();
    match k {
        StepKind::Run { argv, args } => {
            list(argv) + args.iter().map(|(a, b)| a.len() + b.len()).sum::<usize>()
        }
        StepKind::Copy { sources, dest } => {
            assert!(!sources.is_empty(), "a copy without sources");
            list(sources) + dest.len()
        }
        StepKind::Env(v) | StepKind::Label(v) => pairs(v),
        StepKind::Workdir(s) | StepKind::User(s) => {
            if let StepKind::Workdir(d) = k {
                assert!(d.starts_with('/'), "relative WORKDIR {d:?}");
            }
            s.len()
        }
        StepKind::Entrypoint(v) | StepKind::Cmd(v) | StepKind::Expose(v) => list(v),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args = BTreeMap::from([("V".to_string(), "value".to_string())]);
    let first = dockerfile::parse(text, &args);
    let again = dockerfile::parse(text, &args);
    let Ok(plan) = first else {
        assert!(again.is_err(), "parsing is not deterministic");
        return;
    };
    assert_eq!(
        Some(&plan),
        again.as_ref().ok(),
        "parsing is not deterministic"
    );
    let lines = text.matches('\n').count() + 1;
    let mut last = 0;
    // Step text and the `RUN` argv are input, the rest substitution's output: bounded by
    // the expansion cap.
    let mut expanded = plan.from.len();
    for step in &plan.steps {
        assert!(
            (1..=lines).contains(&step.line) && step.line >= last,
            "step line {} of {lines}",
            step.line
        );
        last = step.line;
        assert!(
            text.contains(step.text.as_str()),
            "step text not from the input"
        );
        expanded += kind_bytes(&step.kind);
    }
    assert!(
        expanded <= dockerfile::MAX_EXPANDED + 8 * text.len(),
        "{expanded} bytes of plan from {} bytes of Dockerfile",
        text.len()
    );
});
