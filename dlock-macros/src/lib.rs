//! The `#[distributed_lock]` attribute of dlock. Use it through the `dlock`
//! library (package `dlock-rs`): `use dlock::distributed_lock;`. Its
//! expansion calls `::dlock::__private`, so the dependency keeps the name
//! `dlock`. [`distributed_lock`] lists the options, with an example.
//!
//! # What one call expands to
//!
//! ```text
//! async fn pay(order_id: u64, amount: Cents) -> Result<Receipt, AppError> {
//!     static SITE: ::dlock::__private::Site = Site::new("order", None, None, Mode::Write, None, None,
//!         Cancel { on_lost: true, on_revoke: false },
//!         Job { skip: false, hold_at_least: None, hold_at_most: None });
//!     let name = ::dlock::__private::render(format_args!("{}", &order_id)); // the one allocation
//!     ::dlock::__private::run(&SITE, name, async move { /* the body, unchanged */ }).await
//! }
//! ```
//!
//! `run` looks up the group's engine once per call site, acquires (task-scoped
//! reentrancy, wait timeout, lease, watchdog), runs the body with the held
//! lock in a task-local (and, with `on_lost = "cancel"` or `on_revoke =
//! "cancel"`, races it against the lost or revoked signal), then releases. The guard also releases when the body returns
//! early through `?`, panics, or the caller drops the future.

#![warn(missing_docs)]

mod attr;
mod expand;
mod suggest;
mod template;

use proc_macro::TokenStream;
use proc_macro2::Span;

/// Wraps an `async fn` in a distributed lock, named from its arguments.
///
/// ```
/// use dlock::distributed_lock;
///
/// #[derive(Debug)]
/// enum AppError {
///     Lock(dlock::Error),
/// }
///
/// impl From<dlock::Error> for AppError {
///     fn from(e: dlock::Error) -> Self {
///         AppError::Lock(e)
///     }
/// }
///
/// struct Order {
///     id: u64,
/// }
///
/// #[distributed_lock(group = "order", key = "<tenant>:<order.id>", wait = "5s")]
/// async fn pay(tenant: &str, order: &Order) -> Result<(), AppError> {
///     // Held here; renewed by the watchdog; released on return, `?`, panic or cancellation.
///     let held = dlock::current().expect("inside an annotated fn");
///     assert_eq!(held.key().to_string(), "order/acme:42");
///     assert_eq!(dlock::fence(), Some(held.fence())); // hand it to storage with each write
///     let due = total(tenant, order).await?; // read under write: reenters, no engine call
///     assert_eq!(due, 100);
///     Ok(())
/// }
///
/// #[distributed_lock(group = "order", key = "<tenant>:<order.id>", mode = "read")]
/// async fn total(tenant: &str, order: &Order) -> Result<u64, AppError> {
///     Ok(100)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), AppError> {
/// pay("acme", &Order { id: 42 }).await?;
/// # Ok(())
/// # }
/// ```
///
/// # Options
///
/// | option | value | default |
/// |---|---|---|
/// | `group` | the lock's group, a non-empty literal | required |
/// | `key` | template: text with `<param>` / `<param.field.path>` parts, each `Display`-formatted (`"<tenant>:<order.id>"`, `"<self.id>"`, `"<pair.0>"`) | the function's name |
/// | `keys` | several keys of the group, each a template: `keys = ["<from>", "<to>"]`; instead of `key` | |
/// | `permits` | a whole number `N` ≥ 1: take a permit of the semaphore that admits `N` at once, not the lock (`mode` stays write) | |
/// | `mode` | `"write"` or `"read"` | `"write"` |
/// | `wait` | how long to wait, e.g. `"5s"`, `"250ms"`; `"0s"` tries once | the group's configured wait |
/// | `lease` | lease renewed every lease/3 by the watchdog, at least `"30ms"` | the group's configured lease |
/// | `engine` | a configured engine's name, overriding the group's route | the group's engine |
/// | `on_lost` | `"cancel"`: drop the body when the lock is known lost and return `Error::Lost`; `"ignore"`: let it finish | `"cancel"` for write, `"ignore"` for read |
/// | `on_revoke` | `"cancel"`: drop the body when an operator asks the holder to let go (`dlock revoke`, `Lock::revoke`), release, and return `Error::Revoked`; `"notify"`: let it finish, `dlock::current()` tells (`is_revoked`, `revoked()`) | `"notify"` |
/// | `if_held` | `"skip"`: a run-once job that tries once and skips its run if another holds the lock; the function returns `Result<dlock::Ran<T>, E>` (`Ran::Done(T)` or `Ran::Skipped`) while its body returns `Result<T, E>`; `"wait"`: wait as `wait` says | `"wait"` |
/// | `hold_at_least` | keep others out until this long after the run started, even if it ended sooner and its process exited, counted on the server's clock (`"50s"`); an engine that cannot is `Error::Unsupported` | |
/// | `hold_at_most` | stop renewing this long after the start, cancel the body and return `Error::Lost` (`LostReason::TimeLimit`), so a hung run cannot hold forever (`"10m"`) | |
///
/// The function must be `async` (an `#[async_trait]` method is fine) and
/// return `Result<T, E>` with `E: From<dlock::Error>`: acquisition errors
/// (timeout, engine unreachable, lost) are returned through it. Methods
/// (`&self`, `&mut self`, `self`), generic functions and `impl Trait`
/// arguments work. Nested annotated calls in one task reenter a held lock
/// with no engine call. Inside the body, `dlock::fence()` is the current
/// fencing token and `dlock::current()` the held lock. Misuse is a compile
/// error at the offending token, saying what to write instead.
///
/// Several locks (`keys`, or several attributes on one function, each with
/// its own group, mode and options) are taken as one `dlock::LockSet`: in
/// one order, by group then name, whatever order they were written in, so
/// `transfer(a, b)` and `transfer(b, a)` never deadlock each other; all or
/// nothing within the shortest of their waits. Each keeps its own fence:
/// `dlock::held_lock(group, name)` gives it, and `dlock::fence()` is `None`.
///
/// A scheduled job that runs once across the fleet, whichever instance
/// fires first, and whose clocks may differ by seconds:
///
/// ```
/// use dlock::{Ran, distributed_lock};
///
/// #[distributed_lock(group = "jobs", key = "invoices", if_held = "skip", hold_at_least = "50s", hold_at_most = "10m")]
/// async fn send_invoices() -> Result<Ran<usize>, dlock::Error> {
///     Ok(12) // invoices sent
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// if let Ran::Done(sent) = send_invoices().await? {
///     assert_eq!(sent, 12);
/// }
/// assert_eq!(send_invoices().await?, Ran::Skipped); // held for 50 s from the first run's start
/// # Ok(())
/// # }
/// ```
///
/// With `permits = N` the function holds a permit of a semaphore instead:
/// at most `N` calls hold the key at once, across processes
/// (`dlock::Semaphore`). A lock and a semaphore can share one function as
/// two attributes.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let function = match syn::parse::<syn::ItemFn>(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new(Span::call_site(), "#[distributed_lock] goes on an `async fn`");
            return with_error(error, item);
        }
    };
    match attr::Args::parse(args.into(), Span::call_site()).and_then(|args| expand::expand(args, function)) {
        Ok(tokens) => tokens.into(),
        Err(error) => with_error(error, item),
    }
}

/// The error, plus the item as written so its callers do not error too.
fn with_error(error: syn::Error, item: TokenStream) -> TokenStream {
    let mut tokens = error.to_compile_error();
    tokens.extend(proc_macro2::TokenStream::from(item));
    tokens.into()
}
