//! A deadlock that stands until its youngest member gives up: two clients,
//! as two processes would be (a registry each), each holding one lock and
//! asking for the other's. For the pages and commands that show cycles.

use std::sync::Arc;

use dlock_core::{Config, Error, Registry};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

/// The two members of the cycle, each answering how its wait ended.
pub struct CycleOfTwo(Vec<JoinHandle<Result<(), Error>>>);

impl CycleOfTwo {
    /// Members on the engines of `config`, holding `group/a` and `group/b`
    /// and asking for the other.
    pub async fn start(config: &Config, group: &str) -> Self {
        let barrier = Arc::new(Barrier::new(2));
        let mut members = Vec::new();
        for (first, next) in [("a", "b"), ("b", "a")] {
            let registry = Registry::build(config, &dlock_engines::kinds())
                .await
                .expect("registry");
            let (barrier, locks) = (barrier.clone(), registry.locks(group));
            members.push(tokio::spawn(async move {
                let _registry = registry;
                let held = locks.get(first).lock().await.expect("its first lock");
                barrier.wait().await;
                let answer = locks.get(next).lock().await.map(drop);
                held.release().await.expect("release");
                answer
            }));
        }
        CycleOfTwo(members)
    }

    /// Waits for both; checks that exactly one gave up with
    /// `Error::Deadlock` and the other got its second lock.
    pub async fn one_gave_up(self) {
        let mut gave_up = 0;
        for member in self.0 {
            match member.await.expect("a member") {
                Ok(()) => {}
                Err(Error::Deadlock { .. }) => gave_up += 1,
                Err(other) => panic!("a member failed otherwise: {other}"),
            }
        }
        assert_eq!(gave_up, 1, "exactly one member gives up");
    }
}
