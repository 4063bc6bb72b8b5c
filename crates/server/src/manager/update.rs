//! Changing a live sandbox: its name, labels and egress lists.

use std::collections::BTreeMap;

use api_types::{LabelsPatch, NetworkModeName, Sandbox, UpdateSandbox};
use model::{labels, State};

use super::create::{check_egress_list, check_name};
use super::{lock, Manager};
use crate::error::{Error, Result};

impl Manager {
    /// Applies `req` to a live sandbox; egress lists take effect at once on a running one
    /// and at resume on a suspended one.
    pub async fn update(&self, id_or_name: &str, req: UpdateSandbox) -> Result<Sandbox> {
        self.check_open()?;
        if req == UpdateSandbox::default() {
            return Err(Error::InvalidArgument(
                "Nothing to change: give name, labels, allow_out, deny_out, timeout_secs, \
                 on_timeout, public_ports or exposed_ports"
                    .into(),
            ));
        }
        if let Some(name) = &req.name {
            check_name(name)?;
        }
        if let Some(new) = &req.labels {
            labels::check(new)?;
        }
        super::reaper::check_timeout(req.timeout_secs)?;
        let egress = req.allow_out.is_some() || req.deny_out.is_some();
        for list in [&req.allow_out, &req.deny_out].into_iter().flatten() {
            check_egress_list(list)?;
        }
        if let Some(allow) = &req.allow_out {
            self.check_guarded_egress(allow)?;
        }
        let exposed = req
            .exposed_ports
            .clone()
            .map(super::create::ports_list)
            .transpose()?;
        let entry = self.find(id_or_name)?;
        let _op = entry.op.lock().await;
        let view = entry.view();
        let id = view.id.clone();
        let state = view.state;
        if !matches!(state, State::Running | State::Suspended) {
            return Err(Error::WrongState { id, state });
        }
        if egress && view.network.mode != NetworkModeName::Internet {
            return Err(Error::Unsupported(format!(
                "Sandbox {id} has no internet access, so it has no egress lists to change"
            )));
        }
        let allow = req.allow_out.unwrap_or(view.network.allow_out);
        let deny = req.deny_out.unwrap_or(view.network.deny_out);
        if egress && state == State::Running {
            self.backend.set_egress(&id, &allow, &deny).await?;
        }
        self.rename_and_relabel(
            &entry,
            req.name,
            req.labels,
            egress.then_some((allow, deny)),
        )?;
        let ports = req.public_ports.is_some() || req.exposed_ports.is_some();
        if req.timeout_secs.is_some() || req.on_timeout.is_some() || ports {
            let mut row = lock(&entry.row);
            if let Some(list) = exposed {
                row.view.exposed_ports = Some(list);
            }
            if let Some(public) = req.public_ports {
                row.view.public_ports = public;
            }
            if let Some(secs) = req.timeout_secs {
                row.view.timeout_secs = secs;
            }
            if let Some(action) = req.on_timeout {
                row.view.on_timeout = Some(action);
            }
        }
        // A new timeout counts from now.
        if req.timeout_secs.is_some() {
            entry.touch();
        }
        self.store.put_sandbox(entry.row()).await?;
        tracing::info!(sandbox = %id, "sandbox updated");
        Ok(entry.view())
    }

    /// Sets the labels in `patch.set` and removes those in `patch.remove`, atomically;
    /// returns the sandbox's labels after the change.
    pub async fn patch_labels(
        &self,
        id_or_name: &str,
        patch: LabelsPatch,
    ) -> Result<BTreeMap<String, String>> {
        self.check_open()?;
        check_labels_patch(&patch)?;
        let entry = self.find(id_or_name)?;
        let _op = entry.op.lock().await;
        let view = entry.view();
        if !matches!(view.state, State::Running | State::Suspended) {
            return Err(Error::WrongState {
                id: view.id,
                state: view.state,
            });
        }
        let mut labels = view.labels;
        labels.extend(patch.set);
        for key in &patch.remove {
            labels.remove(key);
        }
        labels::check(&labels)?;
        lock(&entry.row).view.labels.clone_from(&labels);
        self.store.put_sandbox(entry.row()).await?;
        Ok(labels)
    }

    /// Sets the new fields, checking the name is free atomically with taking it.
    fn rename_and_relabel(
        &self,
        entry: &super::Entry,
        name: Option<String>,
        labels: Option<std::collections::BTreeMap<String, String>>,
        egress: Option<(Vec<String>, Vec<String>)>,
    ) -> Result<()> {
        let id = entry.view().id;
        let reg = self.registry_mut();
        if let Some(name) = &name {
            let taken = reg.entries.values().any(|e| {
                let r = lock(&e.row);
                r.view.id != id && r.view.state.is_live() && r.view.name.as_ref() == Some(name)
            });
            if taken {
                return Err(Error::Conflict(format!(
                    "A sandbox named {name} already exists"
                )));
            }
        }
        let mut row = lock(&entry.row);
        if name.is_some() {
            row.view.name = name;
        }
        if let Some(labels) = labels {
            row.view.labels = labels;
        }
        if let Some((allow, deny)) = egress {
            row.view.network.allow_out.clone_from(&allow);
            row.view.network.deny_out.clone_from(&deny);
            row.boot.network.allow_out = allow;
            row.boot.network.deny_out = deny;
        }
        Ok(())
    }
}

/// A patch's keys and new values follow the label rules (`model::labels`); a key both set
/// and removed, or a patch changing nothing, is refused.
fn check_labels_patch(patch: &LabelsPatch) -> Result<()> {
    for key in patch.set.keys().chain(&patch.remove) {
        labels::check_key(key)?;
    }
    for (key, value) in &patch.set {
        labels::check_value(key, value)?;
    }
    if let Some(key) = patch.remove.iter().find(|k| patch.set.contains_key(*k)) {
        return Err(Error::InvalidArgument(format!(
            "Label {key} is both set and removed"
        )));
    }
    if patch.set.is_empty() && patch.remove.is_empty() {
        return Err(Error::InvalidArgument(
            "Nothing to change: give set or remove".into(),
        ));
    }
    Ok(())
}
