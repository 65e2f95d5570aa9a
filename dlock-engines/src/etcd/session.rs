//! The engine's etcd session: one lease, kept alive, replaced when it ends.
//!
//! A session *ends* for dlock when the server says the lease is gone
//! (expired or revoked), or when no keep-alive has succeeded for half the
//! lease's TTL. The server expires a lease one TTL after the last keep-alive
//! it received, and every keep-alive was sent after the one it answered, so
//! a holder cut off learns of the loss at least half a TTL before the server
//! can give its lock to anyone else. Keep-alives go every third of the TTL,
//! so one lost reply ends nothing. An ended session's lease is revoked when
//! the server can be reached, so its keys go at once rather than at expiry.

use std::time::Duration;

use dlock_core::kit::EngineError;
use dlock_core::kit::session::{Ender, Ends, SessionEnd};
use etcd_client::{
    Client, Error as EtcdError, KvClient, LeaseKeepAliveStream, LeaseKeeper, Txn, TxnResponse,
};
use tokio::time::{Instant, sleep_until, timeout_at};
use tonic::Code;

pub(crate) struct Session {
    pub lease: i64,
    end: SessionEnd,
    client: Client,
    kv: KvClient,
}

impl Ends for Session {
    fn end(&self) -> &SessionEnd {
        &self.end
    }
}

impl Session {
    /// Grants a lease of `ttl` (whole seconds) and starts keeping it alive.
    pub async fn open(client: &Client, ttl: Duration) -> Result<Session, EngineError> {
        let granted = retry_while(Instant::now() + ttl, || {
            let mut client = client.clone();
            async move { client.lease_grant(ttl.as_secs() as i64, None).await }
        })
        .await
        .map_err(EngineError::failed)?;
        // The server may raise a short TTL to its minimum; time by its answer.
        let granted_ttl = Duration::from_secs(granted.ttl().max(1) as u64);
        let end = SessionEnd::default();
        tokio::spawn(keep_alive(client.clone(), granted.id(), granted_ttl, end.ender()));
        Ok(Session {
            lease: granted.id(),
            end,
            client: client.clone(),
            kv: client.kv_client(),
        })
    }

    pub fn is_ended(&self) -> bool {
        self.end.is_ended()
    }

    /// Resolves when the session ends.
    pub fn ended(&self) -> impl Future<Output = ()> + Send + 'static {
        self.end.ended()
    }

    /// An operation's failure; one that says the lease is gone ends the
    /// session at once (the keep-alive may hear of it later).
    pub fn failed(&self, e: EtcdError) -> EngineError {
        if lease_gone(&e) {
            self.end.end();
        }
        EngineError::failed(e)
    }

    /// Runs `op` again while it fails for want of a connection or a leader
    /// and the session lives: such a failure says nothing about the lock.
    /// Only for operations that are safe to repeat.
    pub async fn retry<T, F, Fut>(&self, op: F) -> Result<T, EngineError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, EtcdError>>,
    {
        let end = self.end.ended();
        tokio::select! {
            done = retry_while(far_future(), op) => done.map_err(|e| self.failed(e)),
            _ = end => Err(EngineError::failed("the etcd session ended")),
        }
    }

    /// A transaction, retried as [`retry`](Self::retry) does: only for
    /// transactions that are safe to repeat.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, EngineError> {
        self.retry(|| {
            let mut client = self.kv();
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await
    }

    /// Whether the server still has this session's lease.
    pub async fn lives(&self) -> Result<bool, EngineError> {
        let answer = self
            .retry(|| {
                let mut client = self.client.lease_client();
                async move { client.time_to_live(self.lease, None).await }
            })
            .await?;
        Ok(answer.ttl() > 0)
    }

    /// Lease `id`'s granted TTL and what is left of it, if it lives.
    pub async fn lease_left(&self, id: i64) -> Result<Option<(Duration, Duration)>, EngineError> {
        let answer = self
            .retry(|| {
                let mut client = self.client.lease_client();
                async move { client.time_to_live(id, None).await }
            })
            .await?;
        let seconds = |ttl: i64| Duration::from_secs(ttl as u64);
        Ok((answer.ttl() >= 0).then(|| (seconds(answer.granted_ttl()), seconds(answer.ttl()))))
    }

    /// A lease of its own, not kept alive, that ends at least `ttl` from
    /// now (whole seconds, rounded up; the server may raise a short one to
    /// its minimum): its id, and how long it lives.
    pub async fn lease_for(&self, ttl: Duration) -> Result<(i64, Duration), EngineError> {
        let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let granted = self
            .retry(|| {
                let mut client = self.client.lease_client();
                async move { client.grant(seconds.max(1) as i64, None).await }
            })
            .await?;
        Ok((granted.id(), Duration::from_secs(granted.ttl().max(1) as u64)))
    }

    /// Every key-value call made for this session goes through this
    /// client (a clone of the whole `Client` copies every service's).
    pub fn kv(&self) -> KvClient {
        self.kv.clone()
    }
}

impl Drop for Session {
    /// Nobody uses the session any more: revoke its lease, so that its keys
    /// go now rather than one TTL later.
    fn drop(&mut self) {
        self.end.end();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(revoke(self.client.clone(), self.lease));
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

/// How long the first attempt of a call may take; see [`retry_while`].
pub(crate) const FIRST_ATTEMPT: Duration = Duration::from_secs(1);

/// Runs `op` until it succeeds, fails for a reason other than the
/// connection or the leader, or `until` passes. Each attempt gets a time
/// limit of its own, doubling from 1 s: a member whose leader just died
/// holds a forwarded request for its whole request timeout (6 s with a
/// 500 ms election) before it says so, while a retry goes to the new leader.
async fn retry_while<T, F, Fut>(until: Instant, mut op: F) -> Result<T, EtcdError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, EtcdError>>,
{
    let mut pause = Duration::from_millis(10);
    let mut limit = FIRST_ATTEMPT;
    loop {
        let attempt = timeout_at(until.min(Instant::now() + limit), op()).await;
        let failed = match attempt {
            Ok(Err(e)) if transient(&e) => e,
            Ok(done) => return done,
            Err(_) => {
                limit *= 2;
                EtcdError::IoError(std::io::ErrorKind::TimedOut.into())
            }
        };
        if Instant::now() + pause >= until {
            return Err(failed);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

/// A failure of the connection or of the cluster's leadership, not of the
/// operation: trying again may succeed. Every gRPC status counts but those
/// that say the request itself is wrong or refused.
pub(crate) fn transient(e: &EtcdError) -> bool {
    use etcd_client::Error::*;
    match e {
        TransportError(_) | IoError(_) => true,
        GRpcStatus(status) => !matches!(
            status.code(),
            Code::InvalidArgument
                | Code::NotFound
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::FailedPrecondition
                | Code::OutOfRange
                | Code::Unimplemented
                | Code::Unauthenticated
        ),
        _ => false,
    }
}

/// The server says the lease does not exist (expired or revoked).
fn lease_gone(e: &EtcdError) -> bool {
    matches!(e, EtcdError::GRpcStatus(status) if status.message().contains("lease not found"))
}

/// Keeps the lease alive every third of its TTL; ends the session when the
/// server says the lease is gone or when half the TTL passes without a
/// keep-alive answered; stops once nobody uses the session.
async fn keep_alive(client: Client, lease: i64, ttl: Duration, end: Ender) {
    let mut deadline = Instant::now() + ttl / 2;
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut next = Instant::now() + ttl / 3;
    loop {
        tokio::select! {
            _ = sleep_until(next) => {}
            _ = end.unused() => return,
        }
        let sent = Instant::now();
        let answer = timeout_at(deadline, async {
            if stream.is_none() {
                stream = Some(client.clone().lease_keep_alive(lease).await?);
            }
            let (keeper, answers) = stream.as_mut().expect("opened above");
            keeper.keep_alive().await?;
            answers.message().await
        })
        .await;
        match answer {
            Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                deadline = sent + ttl / 2;
                next = sent + ttl / 3;
            }
            // The server forgot the lease: expired or revoked.
            Ok(Ok(Some(_))) => break,
            // The stream broke: open another, soon, while time is left.
            Ok(Ok(None) | Err(_)) => {
                stream = None;
                next = Instant::now() + Duration::from_millis(50).min(ttl / 10);
            }
            Err(_) => break,
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    end.end();
    tokio::spawn(revoke(client, lease));
}

/// Revokes `lease`, trying for a while: best effort, the lease expires anyway.
async fn revoke(client: Client, lease: i64) {
    let _ = retry_while(Instant::now() + Duration::from_secs(10), || {
        let mut client = client.clone();
        async move { client.lease_revoke(lease).await }
    })
    .await;
}
