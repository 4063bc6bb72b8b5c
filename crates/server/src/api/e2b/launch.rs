//! What a template built through E2B's template API asks of its sandboxes, read back
//! from its image's labels (see [`build_plan`]): the start command (run as the sandbox's
//! entrypoint), the ready command (waited for before the create answers), CPUs and
//! memory.

use std::collections::BTreeMap;

use axum::http::StatusCode;

use super::build_plan;
use super::errors::ApiErr;
use super::Shared;

/// What a template built here asks of its sandboxes: the start command (as the
/// sandbox's entrypoint), the ready command, CPUs and memory.
#[derive(Debug, Default, PartialEq)]
pub struct Launch {
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
}

impl Launch {
    pub fn of(labels: &BTreeMap<String, String>) -> Launch {
        Launch {
            start_cmd: labels
                .get(build_plan::START_LABEL)
                .and_then(|h| build_plan::unhex(h)),
            ready_cmd: labels
                .get(build_plan::READY_LABEL)
                .and_then(|h| build_plan::unhex(h)),
            cpus: labels
                .get(build_plan::CPU_LABEL)
                .and_then(|c| c.parse().ok()),
            memory_mb: labels
                .get(build_plan::MEMORY_LABEL)
                .and_then(|m| m.parse().ok()),
        }
    }

    /// The entrypoint that runs the start command.
    pub fn entrypoint(&self) -> Option<Vec<String>> {
        let cmd = self.start_cmd.as_ref()?;
        Some(vec![
            "/bin/bash".into(),
            "-l".into(),
            "-c".into(),
            cmd.clone(),
        ])
    }
}

/// How long a new sandbox's ready command may take to succeed.
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs the ready command until it succeeds (as E2B waits for it before a template's
/// sandbox is handed out); an error when it has not within [`READY_WITHIN`].
pub async fn wait_ready(s: &Shared, id: &str, ready: &str) -> Result<(), ApiErr> {
    let deadline = tokio::time::Instant::now() + READY_WITHIN;
    let mut last;
    loop {
        let args = vec!["-l".into(), "-c".into(), ready.to_string()];
        match super::filesystem::run(s, id, None, "/bin/bash", args).await {
            Ok((0, _, _)) => return Ok(()),
            Ok((code, out, err)) => last = format!("exit {code}: {}{}", out.trim(), err.trim()),
            Err(e) => last = e.message(),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiErr::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "The template's ready command did not succeed within {} s ({last})",
                    READY_WITHIN.as_secs()
                ),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_settings_come_back_from_labels() {
        let labels = BTreeMap::from([
            (
                build_plan::START_LABEL.to_string(),
                build_plan::hex("sleep 1"),
            ),
            (build_plan::CPU_LABEL.to_string(), "2".to_string()),
        ]);
        let l = Launch::of(&labels);
        assert_eq!(l.entrypoint().unwrap()[3], "sleep 1");
        assert_eq!((l.cpus, l.memory_mb, l.ready_cmd), (Some(2.0), None, None));
    }
}
