//! What a run-once job's call did.

/// What a call of a run-once job did: `#[distributed_lock(if_held =
/// "skip")]` makes the function return `Result<Ran<T>, E>` while its body
/// returns `Result<T, E>`.
///
/// ```
/// use dlock::{Ran, distributed_lock};
///
/// #[distributed_lock(group = "jobs", key = "nightly-report", if_held = "skip", hold_at_least = "50s")]
/// async fn nightly_report() -> Result<Ran<u32>, dlock::Error> {
///     Ok(42) // rows written; the body never sees `Ran`
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// match nightly_report().await? {
///     Ran::Done(rows) => println!("wrote {rows} rows"),
///     Ran::Skipped => println!("another instance has it"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a skipped run did nothing: tell it from a done one"]
pub enum Ran<T> {
    /// The body ran, holding the lock, and returned this.
    Done(T),
    /// Another holder had the lock: the body did not run.
    Skipped,
}

impl<T> Ran<T> {
    /// What the body returned, if it ran.
    pub fn done(self) -> Option<T> {
        match self {
            Ran::Done(value) => Some(value),
            Ran::Skipped => None,
        }
    }

    /// Whether the run was skipped.
    pub fn is_skipped(&self) -> bool {
        matches!(self, Ran::Skipped)
    }
}
