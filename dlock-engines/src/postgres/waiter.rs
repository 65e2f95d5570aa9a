//! A request that has to wait: a task of its own takes a permit (in order,
//! within the process), then a connection that holds nothing, and sleeps in
//! the server's lock queue on it until granted or withdrawn. The engine's
//! calls only read where it is.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::kit::{Wake, Woken};
use tokio::sync::watch;
use tokio_postgres::error::SqlState;

use super::conn::Conn;
use super::pool::Pool;
use super::want::Want;
use super::{Hold, Place};

/// Where a waiting request is.
#[derive(Clone)]
pub(super) enum Stage {
    Starting,
    /// In line in this process, behind other waiters or without a
    /// connection to wait on.
    Lined,
    /// In the server's queue on this connection (seen there asleep).
    Queued(Arc<Conn>),
    Granted(u64),
    Failed(Arc<str>),
    Withdrawn,
}

impl Stage {
    fn settled(&self) -> bool {
        matches!(self, Stage::Granted(_) | Stage::Failed(_) | Stage::Withdrawn)
    }
}

/// The handle on a waiting request's task.
#[derive(Clone)]
pub(super) struct Waiter {
    stage: watch::Receiver<Stage>,
    withdraw: Arc<watch::Sender<bool>>,
}

impl Waiter {
    /// Starts the request's task and puts it in `hold`, where the task
    /// records a grant.
    pub fn start(pool: Arc<Pool>, hold: Arc<Hold>, want: Want) -> Self {
        let (stage_tx, stage) = watch::channel(Stage::Starting);
        let (withdraw, withdrawn) = watch::channel(false);
        let waiter = Waiter {
            stage,
            withdraw: Arc::new(withdraw),
        };
        hold.set(Place::Waiting(waiter.clone()));
        pool.waiting.join(&want.key);
        tokio::spawn(async move {
            let stopped = async move {
                let mut withdrawn = withdrawn;
                let _ = withdrawn.wait_for(|w| *w).await;
            };
            let end = run(&pool, &hold, &want, &stage_tx, stopped).await;
            pool.waiting.leave(&want.key);
            stage_tx.send_replace(end);
            pool.changed.notify_waiters();
        });
        waiter
    }

    pub fn stage(&self) -> Stage {
        self.stage.borrow().clone()
    }

    /// The first stage past `Starting`: in line, queued or settled.
    pub async fn entered(&self) -> Stage {
        let mut stage = self.stage.clone();
        let entered = stage.wait_for(|s| !matches!(s, Stage::Starting)).await;
        entered.map(|s| s.clone()).unwrap_or(Stage::Withdrawn)
    }

    /// The stage it ends in.
    pub async fn settled(&self) -> Stage {
        let mut stage = self.stage.clone();
        let settled = stage.wait_for(Stage::settled).await;
        settled.map(|s| s.clone()).unwrap_or(Stage::Withdrawn)
    }

    pub fn withdraw(&self) {
        self.withdraw.send_replace(true);
    }

    /// Wakes the core when the request settles; a grant is handed over.
    pub fn wake(&self, lease: Duration) -> Wake {
        let waiter = self.clone();
        Box::pin(async move {
            match waiter.settled().await {
                Stage::Granted(fence) => Woken::Granted {
                    fence,
                    valid_for: lease,
                },
                _ => Woken::Retry,
            }
        })
    }
}

async fn run(
    pool: &Pool,
    hold: &Hold,
    want: &Want,
    stage: &watch::Sender<Stage>,
    stopped: impl Future<Output = ()>,
) -> Stage {
    tokio::pin!(stopped);
    let _permit = match pool.waits.clone().try_acquire_owned() {
        Ok(permit) => permit,
        Err(_) => {
            stage.send_replace(Stage::Lined);
            tokio::select! {
                permit = pool.waits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                () = &mut stopped => return Stage::Withdrawn,
            }
        }
    };
    let mut pause = Duration::from_millis(10);
    loop {
        let conn = match pool.for_waiting().await {
            Ok(conn) => conn,
            Err(e) => return Stage::Failed(e.to_string().into()),
        };
        if let Some(conn) = conn {
            match queue_on(pool, hold, want, &conn, stage, stopped.as_mut()).await {
                // A cancel this request never sent struck its wait; the
                // session ends (letting go of a grant it may have had), and
                // the request waits again on another.
                None => continue,
                Some(end) => return end,
            }
        }
        // Every connection holds something and no more may open: try now
        // and then instead, until a connection frees up.
        stage.send_replace(Stage::Lined);
        match pool.take_now(want).await {
            Ok(Some((conn, fence))) => return granted(hold, want, conn, fence),
            Ok(None) => {}
            Err(e) => return Stage::Failed(e.to_string().into()),
        }
        tokio::select! {
            () = pool.changed.notified() => {}
            () = tokio::time::sleep(pause) => {}
            () = &mut stopped => return Stage::Withdrawn,
        }
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Waits on `conn` in the server's queue. The request counts as queued
/// only once the server shows the session asleep there: from then on no
/// newcomer can pass it. `None`: a cancel it did not send ended the wait.
async fn queue_on(
    pool: &Pool,
    hold: &Hold,
    want: &Want,
    conn: &Arc<Conn>,
    stage: &watch::Sender<Stage>,
    stopped: impl Future<Output = ()>,
) -> Option<Stage> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut stop_tx = Some(stop_tx);
    let taking = conn.wait_take(want, async move {
        let _ = stop_rx.await;
    });
    let seen_asleep = async {
        // Until then a status check costs one round trip a millisecond.
        while !matches!(pool.is_waiting(conn.pid).await, Ok(true) | Err(_)) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::pin!(taking, stopped, seen_asleep);
    let (mut queued, mut withdrawn) = (false, false);
    let answer = loop {
        tokio::select! {
            answer = &mut taking => break answer,
            () = &mut seen_asleep, if !queued => {
                queued = true;
                stage.send_replace(Stage::Queued(conn.clone()));
            }
            () = &mut stopped, if !withdrawn => {
                withdrawn = true;
                if let Some(stop) = stop_tx.take() {
                    let _ = stop.send(());
                }
            }
        }
    };
    Some(match answer {
        Ok(Some(fence)) if !withdrawn => granted(hold, want, conn.clone(), fence),
        Ok(Some(_)) => match conn.give_back(want.key, want.mode).await {
            Ok(_) => Stage::Withdrawn,
            Err(e) => Stage::Failed(e.to_string().into()),
        },
        Ok(None) => Stage::Withdrawn,
        Err(e) if !withdrawn && e.code() == Some(&SqlState::QUERY_CANCELED) => return None,
        Err(e) => Stage::Failed(super::server::failed(e).to_string().into()),
    })
}

fn granted(hold: &Hold, want: &Want, conn: Arc<Conn>, fence: u64) -> Stage {
    hold.set(Place::Held {
        conn,
        mode: want.mode,
        fence,
    });
    Stage::Granted(fence)
}
