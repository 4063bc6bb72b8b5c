//! The sandbox lifecycle: its states and the one table of allowed transitions.
//!
//! Every lifecycle operation is a [`Op`]; [`plan`] says, for the current state, which
//! transitional state the sandbox enters while the operation runs and where it ends on
//! success or failure. Anything not in the table is refused (the daemon answers HTTP 409
//! naming the state). Normal operation and recovery after a crash go through this table alike.

use serde::{Deserialize, Serialize};

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum State {
    Creating,
    Running,
    Checkpointing,
    Suspending,
    Suspended,
    Resuming,
    Terminating,
    Terminated,
    Failed,
    /// Its node is gone (reported by the cluster's gateway, never by a node itself): the
    /// sandbox can only be deleted; its published snapshots restore elsewhere.
    Lost,
}

/// All states, in display order.
pub const ALL_STATES: [State; 10] = [
    State::Creating,
    State::Running,
    State::Checkpointing,
    State::Suspending,
    State::Suspended,
    State::Resuming,
    State::Terminating,
    State::Terminated,
    State::Failed,
    State::Lost,
];

impl State {
    /// The lowercase name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Running => "running",
            State::Checkpointing => "checkpointing",
            State::Suspending => "suspending",
            State::Suspended => "suspended",
            State::Resuming => "resuming",
            State::Terminating => "terminating",
            State::Terminated => "terminated",
            State::Failed => "failed",
            State::Lost => "lost",
        }
    }

    /// Parses [`State::as_str`] output.
    pub fn parse(s: &str) -> Option<State> {
        ALL_STATES.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether the sandbox holds host resources (counts against admission).
    pub fn is_live(self) -> bool {
        !matches!(self, State::Terminated | State::Failed | State::Lost)
    }

    /// Whether an operation is in progress (a crash left it half-done).
    pub fn is_transitional(self) -> bool {
        matches!(
            self,
            State::Creating
                | State::Checkpointing
                | State::Suspending
                | State::Resuming
                | State::Terminating
        )
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lifecycle operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Boot a sandbox whose record was just written in `Creating`.
    Boot,
    /// Run something inside (exec, files, processes): no state change, needs `Running`.
    Use,
    Checkpoint,
    Suspend,
    Resume,
    Terminate,
    /// A part the sandbox cannot live without died (its agent, its disk server): it is
    /// failed at once, then its host resources are torn down.
    Fail,
}

/// How an allowed operation moves the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// State while the operation runs.
    pub during: State,
    /// State after it succeeded.
    pub success: State,
    /// State after it failed.
    pub failure: State,
}

const fn plan_of(during: State, success: State, failure: State) -> Option<Plan> {
    Some(Plan {
        during,
        success,
        failure,
    })
}

/// The transition table: `None` means the operation is not allowed in `from`.
pub fn plan(from: State, op: Op) -> Option<Plan> {
    use State::*;
    match (op, from) {
        (Op::Boot, Creating) => plan_of(Creating, Running, Failed),
        (Op::Use, Running) => plan_of(Running, Running, Running),
        (Op::Checkpoint, Running) => plan_of(Checkpointing, Running, Running),
        (Op::Suspend, Running) => plan_of(Suspending, Suspended, Running),
        (Op::Resume, Suspended) => plan_of(Resuming, Running, Suspended),
        (Op::Terminate, Running | Suspended | Failed | Creating) => {
            plan_of(Terminating, Terminated, Failed)
        }
        (Op::Fail, Running) => plan_of(Failed, Failed, Failed),
        _ => None,
    }
}

/// The operation a crash cut short when a sandbox was recorded in the transitional
/// `state`, with its plan. Recovery after a daemon restart ends it through the same table
/// as normal operation: in the plan's `success` state when the work turns out done, in its
/// `failure` state otherwise.
pub fn interrupted(state: State) -> Option<(Op, Plan)> {
    use State::*;
    let (op, from) = match state {
        Creating => (Op::Boot, Creating),
        Checkpointing => (Op::Checkpoint, Running),
        Suspending => (Op::Suspend, Running),
        Resuming => (Op::Resume, Suspended),
        Terminating => (Op::Terminate, Running),
        Running | Suspended | Terminated | Failed | Lost => return None,
    };
    plan(from, op).map(|p| (op, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transitional_state_has_the_operation_that_entered_it() {
        for s in ALL_STATES {
            match interrupted(s) {
                Some((_, p)) => assert_eq!(p.during, s, "{s}"),
                None => assert!(!s.is_transitional(), "{s}"),
            }
        }
        let (_, p) = interrupted(State::Checkpointing).unwrap();
        assert_eq!((p.success, p.failure), (State::Running, State::Running));
        let (_, p) = interrupted(State::Resuming).unwrap();
        assert_eq!((p.success, p.failure), (State::Running, State::Suspended));
    }

    #[test]
    fn names_round_trip() {
        for s in ALL_STATES {
            assert_eq!(State::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert_eq!(State::parse("bogus"), None);
    }

    #[test]
    fn table_allows_exactly_these() {
        use State::*;
        let allowed: &[(Op, &[State])] = &[
            (Op::Boot, &[Creating]),
            (Op::Use, &[Running]),
            (Op::Checkpoint, &[Running]),
            (Op::Suspend, &[Running]),
            (Op::Resume, &[Suspended]),
            (Op::Terminate, &[Running, Suspended, Failed, Creating]),
            (Op::Fail, &[Running]),
        ];
        for (op, states) in allowed {
            for s in ALL_STATES {
                assert_eq!(
                    plan(s, *op).is_some(),
                    states.contains(&s),
                    "{op:?} from {s}"
                );
            }
        }
    }

    #[test]
    fn terminal_states_admit_nothing_but_terminate_of_failed() {
        for op in [
            Op::Boot,
            Op::Use,
            Op::Checkpoint,
            Op::Suspend,
            Op::Resume,
            Op::Terminate,
            Op::Fail,
        ] {
            assert!(plan(State::Terminated, op).is_none());
        }
        assert_eq!(
            plan(State::Failed, Op::Terminate).unwrap().success,
            State::Terminated
        );
    }

    #[test]
    fn a_dead_part_fails_only_a_running_sandbox() {
        let p = plan(State::Running, Op::Fail).unwrap();
        assert_eq!(
            (p.during, p.success, p.failure),
            (State::Failed, State::Failed, State::Failed)
        );
        assert!(plan(State::Suspended, Op::Fail).is_none());
    }

    #[test]
    fn transitional_states_refuse_new_operations() {
        for s in ALL_STATES
            .into_iter()
            .filter(|s| s.is_transitional() && *s != State::Creating)
        {
            for op in [
                Op::Use,
                Op::Checkpoint,
                Op::Suspend,
                Op::Resume,
                Op::Terminate,
                Op::Fail,
            ] {
                assert!(plan(s, op).is_none(), "{op:?} from {s}");
            }
        }
    }
}
