//! Deadlocks across clients: locks taken one inside another in a ring of
//! orders, each client as another process would be (a registry of its
//! own). The cycle is found, exactly one member gives up with
//! `Error::Deadlock`, and the others go on.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, Registry};
use tokio::sync::Barrier;
use tokio::time::Instant;

use super::super::{Harness, SETTINGS};

/// Two clients, each holding one lock and asking for the other's.
pub async fn a_deadlock_between_two_clients_is_broken(h: &Harness) {
    ring(h, 2).await;
}

/// Three clients in a ring: each holds one lock and asks for the next's.
pub async fn a_deadlock_among_three_clients_is_broken(h: &Harness) {
    ring(h, 3).await;
}

/// How soon a member gives up: two looks, half a `deadlock_check` apart,
/// after the first, and the reads they make on a busy machine.
const FOUND_WITHIN: Duration = Duration::from_millis(2500);

async fn ring(h: &Harness, clients: usize) {
    // Each client past the two a harness has is a registry of its own,
    // kept for the case.
    let others: Vec<Registry> = (2..clients)
        .map(|i| Registry::with_engine(&format!("client-{i}"), h.engine.clone(), SETTINGS).expect("registry"))
        .collect();
    let clients_locks: Vec<_> = [&h.registry, &h.peer]
        .into_iter()
        .chain(others.iter())
        .take(clients)
        .map(|registry| registry.locks(&h.group))
        .collect();
    let barrier = Arc::new(Barrier::new(clients));
    let mut tasks = Vec::new();
    for (i, locks) in clients_locks.iter().enumerate() {
        let (first, next) = (
            locks.get(format!("ring-{i}")),
            locks.get(format!("ring-{}", (i + 1) % clients)),
        );
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let held = first.lock().await.expect("each takes its own lock first");
            barrier.wait().await;
            let asked = Instant::now();
            let answer = next.lock().await;
            let waited = asked.elapsed();
            let answer = match answer {
                Ok(inner) => {
                    inner.release().await.expect("release");
                    Ok(())
                }
                Err(e) => Err(e),
            };
            held.release().await.expect("release");
            (answer, waited)
        }));
    }
    let mut gave_up = Vec::new();
    for task in tasks {
        match task.await.expect("a member") {
            (Ok(()), _) => {}
            (Err(Error::Deadlock { key, cycle }), waited) => gave_up.push((key, cycle, waited)),
            (Err(other), _) => panic!("a member failed otherwise: {other}"),
        }
    }
    assert_eq!(gave_up.len(), 1, "exactly one member gives up: {gave_up:?}");
    let (key, cycle, waited) = &gave_up[0];
    println!("conformance: a cycle of {clients} found after {waited:?}: {cycle}");
    assert!(
        *waited < FOUND_WITHIN,
        "the cycle was found only after {waited:?}"
    );
    assert_eq!(cycle.links.len(), clients, "{cycle}");
    assert!(
        cycle
            .links
            .iter()
            .all(|link| link.group == h.group && link.holder.is_some()),
        "each link names its lock and its holder's label: {cycle}"
    );
    // Its first link is its own hold; its holder waits for the next's lock.
    assert_eq!(cycle.links[1 % clients].name, key.name(), "{cycle}");
}
