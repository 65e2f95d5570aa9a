//! `#[distributed_lock]` on every kind of function, through the global
//! registry (a memory engine behind a call counter).

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use dlock::engines::conformance::Faults;
use dlock::engines::memory::MemoryEngine;
use dlock::kit::Engine;
use dlock::{Error, LostReason, Ran, Registry, Settings, distributed_lock};
use tokio::sync::Barrier;

#[derive(Debug)]
enum AppError {
    Lock(Error),
    Declined,
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Lock(e)
    }
}

type AppResult<T> = Result<T, AppError>;

/// The engine behind the global registry, installed on first use.
fn engine() -> &'static Faults {
    static FAULTS: OnceLock<Arc<Faults>> = OnceLock::new();
    FAULTS.get_or_init(|| {
        let faults = Arc::new(Faults::new(Arc::new(MemoryEngine::new()) as Arc<dyn Engine>));
        dlock::install(Registry::with_engine("main", faults.clone(), Settings::default()).expect("registry"))
            .expect("install");
        faults
    })
}

/// Whether another task could take the lock now.
async fn is_free(group: &str, name: &str) -> bool {
    let lock = dlock::lock(group, name);
    tokio::spawn(async move {
        match lock.try_lock().await.expect("try") {
            Some(guard) => guard.release().await.is_ok(),
            None => false,
        }
    })
    .await
    .expect("task")
}

async fn eventually_free(group: &str, name: &str) -> bool {
    for _ in 0..100 {
        if is_free(group, name).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

fn current_name() -> String {
    dlock::current()
        .expect("inside a locked fn")
        .key()
        .name()
        .to_owned()
}

// --- free functions: exclusion, key rendering, fence ---

static BALANCE: AtomicU64 = AtomicU64::new(0);
static INSIDE: AtomicU64 = AtomicU64::new(0);
static OVERLAPS: AtomicU64 = AtomicU64::new(0);

#[distributed_lock(group = "attr-account", key = "<tenant>:<account>")]
async fn deposit(tenant: &str, account: u32, amount: u64) -> AppResult<u64> {
    if INSIDE.fetch_add(1, Ordering::SeqCst) != 0 {
        OVERLAPS.fetch_add(1, Ordering::SeqCst);
    }
    let balance = BALANCE.load(Ordering::SeqCst);
    tokio::task::yield_now().await;
    BALANCE.store(balance + amount, Ordering::SeqCst);
    INSIDE.fetch_sub(1, Ordering::SeqCst);
    assert_eq!(current_name(), format!("{tenant}:{account}"));
    Ok(balance + amount)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_exclude_each_other() {
    engine();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            tokio::spawn(async {
                for _ in 0..20 {
                    deposit("acme", 7, 1).await.expect("deposit");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(OVERLAPS.load(Ordering::SeqCst), 0, "bodies overlapped");
    assert_eq!(BALANCE.load(Ordering::SeqCst), 320, "lost updates");
}

struct Order {
    id: u64,
    lines: (u32, u32),
}

#[distributed_lock(group = "attr-render", key = "{literal}:<tenant>:<order.id>:<order.lines.1>")]
async fn render_key(tenant: &str, order: &Order) -> Result<(String, u64), AppError> {
    let held = dlock::current().expect("held");
    assert_eq!(dlock::fence(), Some(held.fence()));
    let _ = (tenant, order);
    Ok((held.key().to_string(), held.fence()))
}

#[tokio::test]
async fn keys_render_params_and_field_paths_and_fences_rise() {
    engine();
    let order = Order {
        id: 42,
        lines: (1, 9),
    };
    let (first_key, first) = render_key("acme", &order).await.expect("call");
    let (_, second) = render_key("acme", &order).await.expect("call");
    assert_eq!(first_key, "attr-render/{literal}:acme:42:9");
    assert!(second > first, "fence did not rise");
    assert_eq!(dlock::fence(), None, "no lock outside an annotated fn");
}

/// An extractor-shaped wrapper, as axum's `Path` is.
struct Wrapped<T>(T);

#[distributed_lock(group = "attr-pattern", key = "<id>:<name>")]
async fn destructured(Wrapped(id): Wrapped<u64>, (name, _): (&str, u8)) -> Result<String, AppError> {
    Ok(dlock::current().expect("held").key().to_string())
}

#[tokio::test]
async fn keys_name_what_parameter_patterns_bind() {
    engine();
    let key = destructured(Wrapped(7), ("ann", 1)).await.expect("call");
    assert_eq!(key, "attr-pattern/7:ann");
}

#[distributed_lock(group = "attr-default-key")]
async fn nightly_report() -> AppResult<String> {
    Ok(current_name())
}

#[tokio::test]
async fn without_a_key_the_function_name_is_the_lock() {
    engine();
    assert_eq!(nightly_report().await.expect("call"), "nightly_report");
}

// --- methods, trait impls, async_trait, generics ---

struct Account {
    id: u32,
    balance: u64,
}

impl Account {
    #[distributed_lock(group = "attr-method", key = "<self.id>", mode = "read")]
    async fn balance(&self) -> AppResult<(u64, String)> {
        Ok((self.balance, current_name()))
    }

    #[distributed_lock(group = "attr-method", key = "<self.id>")]
    async fn add(&mut self, amount: u64) -> AppResult<String> {
        self.balance += amount;
        Ok(current_name())
    }

    #[distributed_lock(group = "attr-method", key = "<self.id>")]
    async fn close(self) -> AppResult<u64> {
        Ok(self.balance)
    }
}

#[tokio::test]
async fn methods_by_ref_mut_ref_and_value() {
    engine();
    let mut account = Account { id: 5, balance: 10 };
    assert_eq!(account.add(5).await.expect("add"), "5");
    assert_eq!(account.balance().await.expect("balance"), (15, "5".to_owned()));
    assert_eq!(account.close().await.expect("close"), 15);
    assert!(is_free("attr-method", "5").await);
}

#[async_trait]
trait Store {
    async fn put(&self, key: &str, value: u64) -> AppResult<String>;
}

struct MemStore {
    name: String,
}

#[async_trait]
impl Store for MemStore {
    #[distributed_lock(group = "attr-store", key = "<self.name>/<key>")]
    async fn put(&self, key: &str, value: u64) -> AppResult<String> {
        assert!(
            !is_free("attr-store", &format!("{}/{key}", self.name)).await,
            "not held in the body"
        );
        let _ = value;
        Ok(current_name())
    }
}

/// A trait with a native `async fn` (no `#[async_trait]`).
trait Repo {
    async fn load(&self, id: u64) -> AppResult<String>;
}

struct Users;

impl Repo for Users {
    #[distributed_lock(group = "attr-repo", key = "user-<id>", mode = "read")]
    async fn load(&self, id: u64) -> AppResult<String> {
        Ok(current_name())
    }
}

trait Named {
    fn name(&self) -> String;
}

struct Cart;

impl Named for Cart {
    fn name(&self) -> String {
        "cart".into()
    }
}

impl Cart {
    #[distributed_lock(group = "attr-store", key = "<item>")]
    async fn take<T: Display + Send + Sync>(&self, item: T) -> AppResult<String> {
        Ok(format!("{}:{}", self.name(), current_name()))
    }
}

#[distributed_lock(group = "attr-generic", key = "<id>")]
async fn generic<T: Display + Sync>(id: T) -> AppResult<String> {
    Ok(current_name())
}

#[distributed_lock(group = "attr-generic", key = "<id>")]
async fn impl_arg(id: impl Display + Send) -> AppResult<String> {
    Ok(current_name())
}

struct Request {
    user_id: u64,
}

#[distributed_lock(group = "attr-request", key = "user-<req.user_id>")]
async fn handle(req: &Request) -> AppResult<String> {
    Ok(current_name())
}

#[tokio::test]
async fn trait_impls_async_trait_generics_and_reference_fields() {
    engine();
    let store: Box<dyn Store + Send + Sync> = Box::new(MemStore { name: "mem".into() });
    assert_eq!(store.put("k1", 1).await.expect("put"), "mem/k1");
    assert_eq!(Cart.take(7u8).await.expect("take"), "cart:7");
    assert_eq!(Users.load(3).await.expect("load"), "user-3");
    assert_eq!(generic("g-1").await.expect("generic"), "g-1");
    assert_eq!(generic(99).await.expect("generic"), "99");
    assert_eq!(impl_arg('x').await.expect("impl arg"), "x");
    assert_eq!(
        handle(&Request { user_id: 314 }).await.expect("handle"),
        "user-314"
    );
}

// --- several locks: one order, all or nothing ---

fn fence_of(group: &str, name: &str) -> u64 {
    dlock::held_lock(group, name).expect("held").fence()
}

#[distributed_lock(group = "attr-order", key = "b")]
#[distributed_lock(group = "attr-order", key = "a", mode = "read")]
async fn both() -> AppResult<(Option<u64>, u64, u64)> {
    Ok((
        dlock::fence(),
        fence_of("attr-order", "a"),
        fence_of("attr-order", "b"),
    ))
}

#[tokio::test]
async fn several_attributes_lock_by_name_not_as_written_each_in_its_mode() {
    engine();
    let b = dlock::lock("attr-order", "b").lock().await.expect("lock b");
    let call = tokio::spawn(both());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !is_free("attr-order", "a").await,
        "`a` (written last) comes first by name, taken before waiting on `b`"
    );
    let reader = dlock::lock("attr-order", "a").try_read().await.expect("try read");
    assert!(reader.is_some(), "`a` is held for read, as its attribute says");
    drop(reader);
    b.release().await.expect("release");
    let (fence, a, b) = call.await.expect("task").expect("both");
    assert_eq!(fence, None, "with several locks no one fence is the function's");
    assert_ne!(a, b, "each lock has its own fence");
    assert!(eventually_free("attr-order", "a").await && eventually_free("attr-order", "b").await);
}

static MOVED: AtomicU64 = AtomicU64::new(0);

#[distributed_lock(group = "attr-transfer", keys = ["<from>", "<to>"], wait = "5s")]
async fn transfer(from: u32, to: u32) -> AppResult<()> {
    let (_, _) = (from, to);
    tokio::time::sleep(Duration::from_millis(1)).await;
    MOVED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_of_the_same_keys_never_deadlock() {
    engine();
    // Written-order locking deadlocks here within a few rounds: each task
    // would hold one account and wait for the other's.
    let forth = tokio::spawn(async {
        for _ in 0..100 {
            transfer(1, 2).await.expect("1 -> 2");
        }
    });
    let back = tokio::spawn(async {
        for _ in 0..100 {
            transfer(2, 1).await.expect("2 -> 1");
        }
    });
    forth.await.expect("task");
    back.await.expect("task");
    assert_eq!(MOVED.load(Ordering::SeqCst), 200);
}

#[distributed_lock(group = "attr-audit", key = "<account>")]
async fn audit(account: u32, other: u32) -> AppResult<(u64, u64)> {
    let outer = dlock::fence().expect("one lock");
    let inner = keyed_fences(account, other).await?;
    assert_eq!(inner.0, outer, "the held key is reentered, not taken again");
    Ok(inner)
}

#[distributed_lock(group = "attr-audit", keys = ["<a>", "<b>", "<a>"])]
async fn keyed_fences(a: u32, b: u32) -> AppResult<(u64, u64)> {
    Ok((
        fence_of("attr-audit", &a.to_string()),
        fence_of("attr-audit", &b.to_string()),
    ))
}

#[tokio::test]
async fn a_set_reenters_what_the_task_holds_and_takes_a_repeated_key_once() {
    engine();
    let (a, b) = audit(21, 20).await.expect("audit");
    assert_ne!(a, b);
    assert!(is_free("attr-audit", "20").await && is_free("attr-audit", "21").await);
}

#[tokio::test]
async fn a_set_that_cannot_have_every_lock_within_its_wait_keeps_none() {
    engine();
    let accounts = dlock::locks("attr-set");
    // Held by another task: this one would reenter it.
    let (taken, release) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let busy = tokio::spawn({
        let (lock, taken, release) = (accounts.get("9"), taken.clone(), release.clone());
        async move {
            let guard = lock.lock().await.expect("lock 9");
            taken.wait().await;
            release.wait().await;
            guard.release().await.expect("release");
        }
    });
    taken.wait().await;
    let set = dlock::LockSet::new()
        .write(accounts.get("8"))
        .read(accounts.get("9"))
        .write(accounts.get("10"));
    match set.acquire_for(Duration::from_millis(100)).await {
        Err(Error::Timeout { key, .. }) => assert_eq!(key.name(), "9"),
        other => panic!("expected a timeout on 9, got {other:?}"),
    }
    assert!(
        eventually_free("attr-set", "8").await,
        "what was taken is released"
    );
    assert!(set.try_acquire().await.expect("try").is_none());
    assert!(eventually_free("attr-set", "10").await && eventually_free("attr-set", "8").await);
    release.wait().await;
    busy.await.expect("task");

    let twice = dlock::LockSet::new()
        .read(accounts.get("8"))
        .write(accounts.get("8"));
    let guards = twice.acquire().await.expect("acquire");
    let taken: Vec<_> = guards
        .iter()
        .map(|g| (g.key().name().to_owned(), g.mode()))
        .collect();
    assert_eq!(taken, [("8".to_owned(), dlock::Mode::Write)], "once, for write");
    assert!(guards.get("attr-set", "8").is_some() && guards.get("attr-set", "9").is_none());
    guards.release().await.expect("release");
    assert!(is_free("attr-set", "8").await);
}

// --- every exit path releases ---

#[distributed_lock(group = "attr-exit", key = "<name>")]
async fn fails(name: &str) -> AppResult<()> {
    let _ = name;
    Err(AppError::Declined)?;
    Ok(())
}

#[distributed_lock(group = "attr-exit", key = "<name>")]
async fn panics(name: &str) -> AppResult<()> {
    panic!("body panicked for {name}");
}

#[distributed_lock(group = "attr-exit", key = "<name>", lease = "1m")]
async fn slow(name: &str) -> AppResult<()> {
    let _ = name;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok(())
}

#[tokio::test]
async fn question_mark_panic_and_cancellation_all_release() {
    engine();
    assert!(matches!(fails("q").await, Err(AppError::Declined)));
    assert!(is_free("attr-exit", "q").await, "not released after `?`");

    let panicked = tokio::spawn(panics("p")).await.expect_err("panicked");
    assert!(panicked.is_panic());
    assert!(
        eventually_free("attr-exit", "p").await,
        "not released after a panic"
    );

    let cancelled = tokio::time::timeout(Duration::from_millis(100), slow("c")).await;
    assert!(cancelled.is_err(), "slow body finished?");
    assert!(
        eventually_free("attr-exit", "c").await,
        "not released after the caller dropped the future"
    );
}

// --- options ---

#[distributed_lock(group = "attr-options", key = "busy", wait = "0s")]
async fn try_once() -> AppResult<()> {
    Ok(())
}

#[distributed_lock(group = "attr-options", key = "busy", wait = "150ms")]
async fn wait_briefly() -> AppResult<()> {
    Ok(())
}

#[distributed_lock(group = "attr-options", key = "x", engine = "nope")]
async fn unknown_engine() -> AppResult<()> {
    Ok(())
}

#[tokio::test]
async fn wait_engine_and_their_errors() {
    engine();
    // Held by this task; the calls run in others (this task would reenter).
    let holder = dlock::lock("attr-options", "busy").lock().await.expect("lock");
    let started = std::time::Instant::now();
    let tried = tokio::spawn(try_once()).await.expect("task");
    assert!(
        matches!(tried, Err(AppError::Lock(Error::Timeout { .. }))),
        "{tried:?}"
    );
    if let Err(AppError::Lock(e)) = &tried {
        assert!(e.to_string().contains("is busy"), "a try-once reads as busy: {e}");
    }
    // Waiting would mean the default wait, forever: a busy machine's slow
    // spawn is far below the bound.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "wait = 0s must not wait"
    );
    let started = std::time::Instant::now();
    let waited = tokio::spawn(wait_briefly()).await.expect("task");
    assert!(
        matches!(waited, Err(AppError::Lock(Error::Timeout { .. }))),
        "{waited:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(150));
    holder.release().await.expect("release");
    tokio::spawn(try_once()).await.expect("task").expect("free now");
    match unknown_engine().await {
        Err(AppError::Lock(Error::Config { field, message })) => {
            assert_eq!(field, "engine");
            assert!(message.contains("`nope`"), "{message}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
}

static READERS: OnceLock<Barrier> = OnceLock::new();

#[distributed_lock(group = "attr-read", key = "catalog", mode = "read")]
async fn browse() -> AppResult<()> {
    let barrier = READERS.get_or_init(|| Barrier::new(3));
    tokio::time::timeout(Duration::from_secs(5), barrier.wait())
        .await
        .map_err(|_| AppError::Declined)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_mode_calls_share_the_lock() {
    engine();
    let calls: Vec<_> = (0..3).map(|_| tokio::spawn(browse())).collect();
    for call in calls {
        call.await.expect("task").expect("readers did not overlap");
    }
}

/// The attribute checks `lease` at compile time against its own copy of the
/// core's minimum (a proc-macro crate cannot use the core's constant): the
/// minimum itself compiles and is accepted at run time, and both say 30 ms.
#[distributed_lock(group = "attr-min-lease", lease = "30ms")]
async fn with_the_shortest_lease() -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn the_attribute_and_the_core_agree_on_the_shortest_lease() {
    assert_eq!(
        dlock::MIN_LEASE,
        Duration::from_millis(30),
        "update dlock-macros/src/attr.rs too"
    );
    with_the_shortest_lease()
        .await
        .expect("the minimum lease is accepted");
}

// --- semaphores: `permits = N` ---

static EXPORTS: OnceLock<dlock::engines::conformance::Occupancy> = OnceLock::new();

fn exports() -> &'static dlock::engines::conformance::Occupancy {
    EXPORTS.get_or_init(|| dlock::engines::conformance::Occupancy::new(2))
}

#[distributed_lock(group = "attr-export", key = "<tenant>", permits = 2, wait = "10s")]
async fn export(tenant: &str) -> AppResult<Option<u32>> {
    exports().visit(Duration::from_millis(20)).await;
    Ok(dlock::current().expect("inside").permits())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permits_admit_that_many_calls_at_once_and_no_more() {
    engine();
    let calls: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async {
                for _ in 0..5 {
                    assert_eq!(export("acme").await.expect("export"), Some(2));
                }
            })
        })
        .collect();
    for call in calls {
        call.await.expect("task");
    }
    let inside = exports();
    assert_eq!(inside.over(), 0, "more than 2 calls inside at once");
    assert_eq!(inside.most(), 2, "the two permits never ran together");
    assert_eq!(inside.entries(), 40);
    assert!(
        is_free("attr-export", "acme").await,
        "the lock of the name is another thing"
    );
}

#[distributed_lock(group = "attr-partner", key = "calls", permits = 3)]
#[distributed_lock(group = "attr-invoice", key = "<id>")]
async fn bill(id: u32) -> AppResult<(Option<u32>, Option<u32>)> {
    let permit = dlock::held_lock("attr-partner", "calls").expect("the permit");
    let lock = dlock::held_lock("attr-invoice", &id.to_string()).expect("the lock");
    Ok((permit.permits(), lock.permits()))
}

#[tokio::test]
async fn a_function_holds_a_permit_and_a_lock_together() {
    engine();
    assert_eq!(bill(4).await.expect("bill"), (Some(3), None));
    let wrong = dlock::semaphore("attr-partner", "calls", 2)
        .acquire()
        .await
        .expect("idle: a new count");
    let refused = bill(5).await;
    assert!(
        matches!(
            refused,
            Err(AppError::Lock(Error::PermitCount {
                asked: 3,
                in_use: 2,
                ..
            }))
        ),
        "{refused:?}"
    );
    wrong.release().await.expect("release");
    assert!(
        eventually_free("attr-invoice", "5").await,
        "the set let go of what it took"
    );
}

static JOB_RUNS: AtomicU64 = AtomicU64::new(0);

#[distributed_lock(group = "jobs", key = "<name>", if_held = "skip", hold_at_least = "300ms")]
async fn nightly(name: &str) -> Result<Ran<u64>, AppError> {
    let _ = name;
    Ok(JOB_RUNS.fetch_add(1, Ordering::SeqCst) + 1)
}

#[distributed_lock(group = "jobs", key = "hung", hold_at_most = "200ms")]
async fn hung() -> AppResult<()> {
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

/// A job skips while another holds its lock, and for its `hold_at_least`
/// after a run of its own; its body returns `T`, its caller gets `Ran<T>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_skips_while_held_and_for_its_hold_at_least_after_a_run() {
    engine();
    let holder = tokio::spawn(async { dlock::lock("jobs", "daily").lock().await });
    let guard = holder.await.expect("task").expect("lock");
    let before = JOB_RUNS.load(Ordering::SeqCst);
    assert!(matches!(nightly("daily").await, Ok(Ran::Skipped)));
    assert_eq!(
        JOB_RUNS.load(Ordering::SeqCst),
        before,
        "a skipped run ran its body"
    );
    guard.release().await.expect("release");

    let started = tokio::time::Instant::now();
    let Ok(Ran::Done(n)) = nightly("daily").await else {
        panic!("a free lock skipped the run");
    };
    assert_eq!(n, before + 1);
    // Released at once, the lock stays taken until 300 ms after the run began.
    assert!(matches!(nightly("daily").await, Ok(Ran::Skipped)));
    tokio::time::sleep_until(started + Duration::from_millis(300)).await;
    assert!(
        eventually_free("jobs", "daily").await,
        "kept past its hold_at_least"
    );
    assert!(matches!(nightly("daily").await, Ok(Ran::Done(_))));
}

/// A body that outruns `hold_at_most` is cancelled there, with a reason
/// that says so, and the lock is free again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_its_hold_at_most_is_cancelled_and_the_lock_freed() {
    engine();
    let started = tokio::time::Instant::now();
    match hung().await {
        Err(AppError::Lock(Error::Lost { reason, .. })) => assert_eq!(reason, LostReason::TimeLimit),
        other => panic!("a hung body past hold_at_most: {other:?}"),
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(200), "cancelled after {took:?}");
    assert!(took < Duration::from_secs(5), "ran on for {took:?}");
    assert!(
        is_free("jobs", "hung").await,
        "the lock is still held after the cancel"
    );
}
