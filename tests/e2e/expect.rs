//! Where the code knowingly differs from the README today. Each constant is the behaviour the
//! suite expects now; when the code changes, the scenario using it fails until the constant is
//! flipped, so a change in behaviour is never silent.

/// A selector Lock with only negative terms (`NotIn`, `DoesNotExist`) also selects a Scale (an
/// object without labels), so it refuses `kubectl scale` of every Deployment in its namespace.
/// The README says selector locks do not cover scale updates.
pub const NEGATIVE_SELECTOR_COVERS_SCALE: bool = true;

/// A Namespace DELETE is refused by any live Enforce Lock in it, even one with
/// `operations: [UPDATE]` that would not refuse the DELETE of its own object.
pub const UPDATE_ONLY_LOCK_BLOCKS_NAMESPACE_DELETION: bool = true;

/// `kubectl lock` creates Locks in namespaces the registration never sends (kube-system,
/// kube-node-lease), where they cannot be enforced.
pub const PLUGIN_LOCKS_EXCLUDED_NAMESPACES: bool = true;
