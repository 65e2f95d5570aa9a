//! What dlock tells `tracing`, read back through a real `tracing-subscriber`
//! registry with a layer that keeps every span and event. Each test runs on
//! a current-thread runtime with a thread-local subscriber, so the tasks it
//! spawns (the watchdog, an admin page's handlers) report there too.

#[cfg(feature = "admin")]
mod service;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::engines::conformance::{Faults, SETTINGS};
use dlock::engines::memory::MemoryEngine;
use dlock::kit::Engine;
use dlock::{Registry, distributed_lock};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Instrument, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Clone, Debug, Default)]
struct SpanSeen {
    name: &'static str,
    target: String,
    level: Option<Level>,
    fields: HashMap<String, String>,
    parent: Option<&'static str>,
    follows: Vec<&'static str>,
}

#[derive(Clone, Debug)]
struct EventSeen {
    level: Level,
    target: String,
    fields: HashMap<String, String>,
    /// Names of the spans it happened in, innermost first.
    scope: Vec<&'static str>,
    /// The fields of its innermost span.
    span_fields: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Seen {
    spans: Arc<Mutex<Vec<SpanSeen>>>,
    /// Span id → index in `spans`, while the span is open.
    open: Arc<Mutex<HashMap<u64, usize>>>,
    events: Arc<Mutex<Vec<EventSeen>>>,
}

impl Seen {
    fn spans(&self, name: &str) -> Vec<SpanSeen> {
        let spans = self.spans.lock().unwrap();
        spans.iter().filter(|s| s.name == name).cloned().collect()
    }

    fn events(&self, message: &str) -> Vec<EventSeen> {
        let events = self.events.lock().unwrap();
        let said = |e: &&EventSeen| e.fields.get("message").is_some_and(|m| m == message);
        events.iter().filter(said).cloned().collect()
    }

    fn index(&self, id: &Id) -> Option<usize> {
        self.open.lock().unwrap().get(&id.into_u64()).copied()
    }
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Seen {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut seen = SpanSeen {
            name: attrs.metadata().name(),
            target: attrs.metadata().target().to_owned(),
            level: Some(*attrs.metadata().level()),
            parent: ctx.span(id).and_then(|s| s.parent()).map(|p| p.name()),
            ..SpanSeen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        let mut spans = self.spans.lock().unwrap();
        self.open.lock().unwrap().insert(id.into_u64(), spans.len());
        spans.push(seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(i) = self.index(id) {
            values.record(&mut Fields(&mut self.spans.lock().unwrap()[i].fields));
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, S>) {
        if let (Some(i), Some(earlier)) = (self.index(id), ctx.span(follows)) {
            self.spans.lock().unwrap()[i].follows.push(earlier.name());
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let scope: Vec<_> = ctx
            .event_scope(event)
            .map(|scope| scope.map(|s| s.name()).collect())
            .unwrap_or_default();
        let span_fields = ctx
            .event_span(event)
            .and_then(|s| self.index(&s.id()))
            .map(|i| self.spans.lock().unwrap()[i].fields.clone())
            .unwrap_or_default();
        self.events.lock().unwrap().push(EventSeen {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            fields,
            scope,
            span_fields,
        });
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        self.open.lock().unwrap().remove(&id.into_u64());
    }
}

/// Installs a capturing subscriber on this thread.
fn capture() -> (Seen, tracing::subscriber::DefaultGuard) {
    let seen = Seen::default();
    let subscriber = tracing_subscriber::registry().with(seen.clone());
    (seen, tracing::subscriber::set_default(subscriber))
}

fn registry() -> (Registry, Arc<Faults>) {
    let faults = Arc::new(Faults::new(Arc::new(MemoryEngine::new()) as Arc<dyn Engine>));
    (
        Registry::with_engine("mem", faults.clone(), SETTINGS).expect("registry"),
        faults,
    )
}

fn field<'a>(fields: &'a HashMap<String, String>, name: &str) -> &'a str {
    fields
        .get(name)
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
}

#[distributed_lock(group = "traced", key = "account-<id>")]
async fn pay(id: u64) -> Result<u64, dlock::Error> {
    tracing::info!(id, "paying");
    Ok(dlock::fence().expect("held"))
}

#[tokio::test(flavor = "current_thread")]
async fn an_annotated_call_has_an_acquire_span_and_runs_in_its_hold_span() {
    let (seen, _subscriber) = capture();
    let fence = pay(7)
        .instrument(tracing::info_span!("request"))
        .await
        .expect("pay");

    let [acquire] = &seen.spans("acquire")[..] else {
        panic!("not one acquire span: {:?}", seen.spans("acquire"));
    };
    assert_eq!(acquire.target, "dlock");
    assert_eq!(acquire.level, Some(Level::DEBUG));
    assert_eq!(acquire.parent, Some("request"));
    let f = &acquire.fields;
    assert_eq!(field(f, "group"), "traced");
    assert_eq!(field(f, "key"), "account-7");
    assert_eq!(field(f, "mode"), "write");
    assert_eq!(field(f, "engine"), "memory");
    assert_eq!(field(f, "outcome"), "acquired");
    let waited: f64 = field(f, "wait_ms").parse().expect("wait_ms is a number");
    assert!((0.0..1_000.0).contains(&waited), "wait_ms {waited}");

    let [hold] = &seen.spans("hold")[..] else {
        panic!("not one hold span: {:?}", seen.spans("hold"));
    };
    assert_eq!(
        hold.parent,
        Some("request"),
        "a hold is the caller's, beside its acquisition"
    );
    assert_eq!(hold.follows, ["acquire"]);
    assert_eq!(field(&hold.fields, "fence"), fence.to_string());
    assert_eq!(field(&hold.fields, "key"), "account-7");

    let [paying] = &seen.events("paying")[..] else {
        panic!("the body's event is missing");
    };
    assert_eq!(
        paying.scope,
        ["hold", "request"],
        "the body runs in the hold span"
    );
    assert_eq!(field(&paying.span_fields, "fence"), fence.to_string());
}

#[distributed_lock(group = "traced", key = "nightly", if_held = "skip")]
async fn nightly() -> Result<dlock::Ran<()>, dlock::Error> {
    Ok(())
}

/// A run-once job that finds its lock held says so at debug, naming the
/// lock; a run says nothing of the kind.
#[tokio::test(flavor = "current_thread")]
async fn a_skipped_run_is_logged_at_debug_naming_its_lock() {
    let (seen, _subscriber) = capture();
    let holder = tokio::spawn(async { dlock::lock("traced", "nightly").lock().await });
    let guard = holder.await.expect("task").expect("lock");
    assert_eq!(nightly().await.expect("job"), dlock::Ran::Skipped);
    guard.release().await.expect("release");
    assert_eq!(nightly().await.expect("job"), dlock::Ran::Done(()));

    let [skipped] = &seen.events("run skipped: the lock is held elsewhere")[..] else {
        panic!("not one event for the one skip");
    };
    assert_eq!(skipped.level, Level::DEBUG);
    assert_eq!(field(&skipped.fields, "lock"), "traced/nightly");
}

#[distributed_lock(group = "traced", key = "partner", permits = 3)]
async fn call_partner() -> Result<u64, dlock::Error> {
    Ok(dlock::fence().expect("held"))
}

#[tokio::test(flavor = "current_thread")]
async fn a_permit_has_its_spans_with_mode_permit_and_the_count() {
    let (seen, _subscriber) = capture();
    let fence = call_partner().await.expect("call");
    let [acquire] = &seen.spans("acquire")[..] else {
        panic!("not one acquire span: {:?}", seen.spans("acquire"));
    };
    let [hold] = &seen.spans("hold")[..] else {
        panic!("not one hold span: {:?}", seen.spans("hold"));
    };
    for span in [acquire, hold] {
        assert_eq!(field(&span.fields, "mode"), "permit");
        assert_eq!(field(&span.fields, "permits"), "3");
        assert_eq!(field(&span.fields, "key"), "partner");
    }
    assert_eq!(field(&hold.fields, "fence"), fence.to_string());
}

#[tokio::test(flavor = "current_thread")]
async fn reentry_makes_no_span_and_a_busy_lock_says_why_in_the_acquire_span() {
    let (seen, _subscriber) = capture();
    let (registry, _) = registry();
    let lock = registry.locks("orders").get("1");
    let outer = lock.lock().await.expect("lock");
    let inner = lock.read().await.expect("reenter");
    assert_eq!(
        seen.spans("acquire").len(),
        1,
        "a reentry reached the engine's span"
    );

    let other = registry.locks("orders").get("1");
    let busy = tokio::spawn(async move { other.try_lock().await.expect("try").is_none() });
    assert!(busy.await.expect("task"), "a held lock was granted");
    let acquires = seen.spans("acquire");
    assert_eq!(acquires.len(), 2);
    assert_eq!(field(&acquires[1].fields, "outcome"), "busy");
    assert_eq!(field(&acquires[1].fields, "engine"), "mem");
    let [ended] = &seen.events("lock wait ended without the lock")[..] else {
        panic!("no event for the refused try");
    };
    assert_eq!(ended.level, Level::DEBUG);
    assert_eq!(ended.target, "dlock");
    assert_eq!(ended.scope, ["acquire"]);
    assert!(field(&ended.fields, "error").contains("busy"), "{ended:?}");
    drop(inner);
    outer.release().await.expect("release");
    assert!(seen.events("lock lost").is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn a_wait_names_whom_it_waited_behind_and_links_a_holder_of_this_process() {
    let (seen, _subscriber) = capture();
    let (registry, _) = registry();
    let holder = registry.locks("orders").get("2").lock().await.expect("lock");
    let waiter = tokio::spawn({
        let lock = registry.locks("orders").get("2");
        async move { lock.lock().await.expect("waiter").release().await }
    });
    // The holders' labels are read beside the wait: give it a moment, bounded.
    let named = || {
        let acquires = seen.spans("acquire");
        acquires.get(1).and_then(|a| a.fields.get("waited_for").cloned())
    };
    for _ in 0..250 {
        if named().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(named().as_deref(), Some(dlock::kit::process_label().as_str()));
    holder.release().await.expect("release");
    waiter.await.expect("task").expect("release");
    let acquires = seen.spans("acquire");
    assert_eq!(acquires[1].follows, ["hold"], "linked to the holder's span");
    assert!(
        !acquires[0].fields.contains_key("waited_for"),
        "the first waited for nobody"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn failed_renewals_and_the_loss_are_warnings_in_the_hold_span() {
    let (seen, _subscriber) = capture();
    let (registry, faults) = registry();
    let lease = Duration::from_millis(90);
    let guard = registry
        .locks("orders")
        .get("2")
        .with_lease(lease)
        .lock()
        .await
        .expect("lock");
    let fence = guard.fence();
    faults.set_cut(true);
    let reason = tokio::time::timeout(lease * 10, guard.lost())
        .await
        .expect("not lost while cut off");

    let failures = seen.events("lock renewal failed; retrying");
    assert!(!failures.is_empty(), "no renewal-failure event");
    for failure in &failures {
        assert_eq!(failure.level, Level::WARN);
        assert_eq!(failure.scope, ["hold"]);
        assert_eq!(field(&failure.span_fields, "fence"), fence.to_string());
        assert!(!field(&failure.fields, "error").is_empty());
    }
    let [lost] = &seen.events("lock lost")[..] else {
        panic!("not one loss event: {:?}", seen.events("lock lost"));
    };
    assert_eq!(lost.level, Level::WARN);
    assert_eq!(lost.scope, ["hold"]);
    assert_eq!(field(&lost.fields, "reason"), reason.to_string());
    faults.set_cut(false);
    assert!(guard.release().await.is_err(), "a lost hold released cleanly");
}

/// Every act on holders is an audit event at warn, target `dlock::audit`:
/// the lock, what was done, the holds it was for as the records showed
/// them (label, fence, owner digest, never the owner id), how many it
/// reached, and who acted.
#[tokio::test(flavor = "current_thread")]
async fn an_act_on_holders_is_an_audit_event_naming_the_hold_and_who_acted() {
    let (seen, _subscriber) = capture();
    let (registry, _) = registry();
    let lock = registry.locks("traced").get("stuck");
    let guard = lock.lock().await.expect("lock");
    let operator = lock.clone().by("ann on call");
    assert_eq!(operator.revoke().await.expect("revoke"), 1);
    let only = dlock::Only::fence(guard.fence());
    assert_eq!(operator.force_release_only(&only).await.expect("force"), 1);

    let acts = seen.events("an operator acted on holders");
    let [asked, forced] = &acts[..] else {
        panic!("not two audit events: {acts:?}");
    };
    for (event, act) in [(asked, "revocation"), (forced, "force release")] {
        assert_eq!(
            (event.level, event.target.as_str()),
            (Level::WARN, "dlock::audit")
        );
        let f = &event.fields;
        assert_eq!(
            (field(f, "group"), field(f, "lock"), field(f, "act")),
            ("traced", "stuck", act)
        );
        assert_eq!(field(f, "by"), "ann on call");
        assert_eq!(field(f, "reached"), "1");
        let holders = field(f, "holders");
        assert!(holders.contains(&format!("fence {}", guard.fence())), "{holders}");
        assert!(holders.contains(&guard.owner_digest()), "{holders}");
        let long_hex = f.values().any(|v| {
            v.split(|c: char| !c.is_ascii_hexdigit())
                .any(|run| run.len() >= 32)
        });
        assert!(!long_hex, "an owner id in {f:?}");
    }
    assert_eq!(field(&forced.fields, "only"), format!("fence {}", guard.fence()));
    assert_eq!(field(&asked.fields, "only"), "every hold");
}

/// The admin page's acts name the operator whose token was shown: each
/// operator with a token of their own, the audit trail tells them apart.
#[cfg(feature = "admin")]
#[tokio::test(flavor = "current_thread")]
async fn the_admin_pages_act_names_the_operator_whose_token_it_showed() {
    let (seen, _subscriber) = capture();
    let (registry, _) = registry();
    let lock = registry.locks("traced").get("stuck");
    let _guard = lock.lock().await.expect("lock");
    let app = dlock::admin::Admin::new(&registry)
        .groups(["traced"])
        .operator("ann", "ann's-token")
        .operator("bo", "bo's-token")
        .router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let site = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let http = service::Http::default();
    let revoke = format!("{site}/api/locks/traced/revoke?name=stuck");
    let send = |token: &'static str| {
        let (http, revoke) = (http.clone(), revoke.clone());
        async move {
            let bearer = format!("Bearer {token}");
            http.send(
                http::Method::POST,
                &revoke,
                &[("authorization", &bearer)],
                String::new(),
            )
            .await
            .0
        }
    };

    assert_eq!(send("bo's-token").await, 200);
    assert_eq!(send("ann's-token").await, 200);
    assert_eq!(send("eve's-guess").await, 401);
    let acts = seen.events("an operator acted on holders");
    let by: Vec<&str> = acts.iter().map(|act| field(&act.fields, "by")).collect();
    assert_eq!(by, ["the admin page (bo)", "the admin page (ann)"]);
    for act in &acts {
        let secrets = act.fields.values().any(|v| v.contains("token"));
        assert!(!secrets, "a token in {:?}", act.fields);
    }
}
