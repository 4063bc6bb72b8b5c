//! One lifecycle operation on one sandbox, start to end. A [`Transition`] holds the
//! sandbox's operation lock for as long as it lives, was checked against the state machine
//! (`model::plan`: the operation is allowed from the state the sandbox is in, else
//! `WrongState`), and sets each state the operation passes through — during, then success
//! or failure — by [`Manager::set_state`], which records the row and then announces the
//! event. Every operation that moves a sandbox through the state machine (create, restore,
//! checkpoint, suspend, resume, terminate, a failure found by the liveness probe) starts
//! here; what it does between the states is its own.

use std::sync::Arc;

use api_types::Sandbox;
use model::{plan, Op, Plan, State};
use tokio::sync::MutexGuard;

use super::{Entry, Manager};
use crate::error::{Error, Result};

/// An operation under way on a sandbox; its lock is released when dropped.
pub(super) struct Transition<'a> {
    m: &'a Manager,
    pub entry: &'a Arc<Entry>,
    pub plan: Plan,
    _op: MutexGuard<'a, ()>,
}

impl Manager {
    /// Starts `op` on the sandbox of `entry`: waits for its operation lock, then checks
    /// that `op` is allowed from its state. No state is set yet ([`Transition::begin`]).
    pub(super) async fn transition<'a>(
        &'a self,
        entry: &'a Arc<Entry>,
        op: Op,
    ) -> Result<Transition<'a>> {
        let guard = entry.op.lock().await;
        Transition::new(self, entry, op, guard)
    }

    /// [`Manager::transition`] without waiting: `None` while another operation holds the
    /// sandbox or when `op` is not allowed from its state (a background check's way).
    pub(super) fn try_transition<'a>(
        &'a self,
        entry: &'a Arc<Entry>,
        op: Op,
    ) -> Option<Transition<'a>> {
        let guard = entry.op.try_lock().ok()?;
        Transition::new(self, entry, op, guard).ok()
    }
}

impl<'a> Transition<'a> {
    fn new(
        m: &'a Manager,
        entry: &'a Arc<Entry>,
        op: Op,
        guard: MutexGuard<'a, ()>,
    ) -> Result<Self> {
        let state = entry.state();
        let Some(plan) = plan(state, op) else {
            let id = entry.view().id;
            return Err(Error::WrongState { id, state });
        };
        Ok(Transition {
            m,
            entry,
            plan,
            _op: guard,
        })
    }

    /// The sandbox's id.
    pub fn id(&self) -> String {
        self.entry.view().id
    }

    /// Sets the operation's state while it runs.
    pub async fn begin(&self) -> Result<()> {
        self.to(self.plan.during, None).await
    }

    /// Sets the state after success and returns the sandbox as it is then.
    pub async fn succeed(&self) -> Result<Sandbox> {
        self.to(self.plan.success, None).await?;
        Ok(self.entry.view())
    }

    /// Sets the state after failure (with `why`, when given) and returns `cause`, the
    /// error to answer with (or the recording's own error, if recording failed).
    pub async fn fail(&self, why: Option<String>, cause: impl Into<Error>) -> Error {
        self.fail_as(self.plan.failure, why, cause).await
    }

    /// [`Transition::fail`] into `state` instead of the plan's failure state (a sandbox
    /// left in no state it can go on from is `Failed`).
    pub async fn fail_as(
        &self,
        state: State,
        why: Option<String>,
        cause: impl Into<Error>,
    ) -> Error {
        match self.to(state, why).await {
            Ok(()) => cause.into(),
            Err(e) => e,
        }
    }

    /// Sets `state` (recorded, then announced).
    pub async fn to(&self, state: State, why: Option<String>) -> Result<()> {
        self.m.set_state(self.entry, state, why).await
    }
}
