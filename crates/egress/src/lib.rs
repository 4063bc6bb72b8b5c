//! Egress rules by name, and the per-sandbox resolver that enforces them.
//!
//! A sandbox's `allow_out` and `deny_out` lists hold addresses and CIDRs (enforced by the
//! runtime's nftables chain alone) and hostnames or wildcards (`*.example.com`). Names
//! are enforced twice: at resolve time by [`Resolver`], which answers the sandbox's DNS,
//! and at connect time by the addresses it learned from the answers it gave, which are
//! the only ones a name rule lets through. Connecting to an address directly, or to one
//! a rebinding answer pointed at, finds it in no set and is dropped.

mod resolver;
mod rules;

#[cfg(feature = "fuzzing")]
pub use resolver::fuzzing;
pub use resolver::{
    Learn, Learned, Net4, Policy, Resolver, ResolverConfig, MAX_LEARN_TTL, MIN_LEARN_TTL,
};
pub use rules::{parse_entry, Entry, NamePattern, NameRules, RuleError, Verdict};
