//! Config files, good and bad: a bad one fails at startup naming the field.

use std::time::Duration;

use dlock::config::Polling;
use dlock::{Config, Error, Registry, Wait};

fn parse(text: &str) -> Result<Config, Error> {
    Config::parse(text, std::iter::empty())
}

async fn build(text: &str) -> Result<Registry, Error> {
    Registry::build(&parse(text)?, &dlock::engines::kinds()).await
}

/// The field an error names, and its message.
fn field_of(result: Result<impl Sized, Error>) -> (String, String) {
    match result {
        Err(Error::Config { field, message }) => (field, message),
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("bad config accepted"),
    }
}

const GOOD: &str = r#"
[defaults]
engine = "main"
lease = "20s"
wait = "3s"
poll = { strategy = "constant", interval = "50ms" }

[engines.main]
kind = "memory"

[engines.side]
kind = "memory"

[groups.payment]
engine = "side"
lease = "5s"

[groups.report]
wait = "250ms"

[groups.batch]
wait = "forever"
"#;

#[tokio::test]
async fn a_good_file_routes_groups_and_applies_overrides() {
    let registry = build(GOOD).await.expect("good config");
    let payment = registry.locks("payment");
    assert_eq!(payment.engine(), "side");
    assert_eq!(payment.settings().lease, Duration::from_secs(5));
    assert_eq!(payment.settings().wait, Wait::For(Duration::from_secs(3)));
    let report = registry.locks("report");
    assert_eq!(report.engine(), "main");
    assert_eq!(report.settings().lease, Duration::from_secs(20));
    assert_eq!(report.settings().wait, Wait::For(Duration::from_millis(250)));
    assert_eq!(
        report.settings().poll,
        Polling::Constant {
            interval: Duration::from_millis(50)
        }
    );
    // A group may wait until granted even when the default wait is bounded.
    assert_eq!(registry.locks("batch").settings().wait, Wait::Forever);
    let unrouted = registry.locks("anything");
    assert_eq!(unrouted.engine(), "main");
    // The routes lead to working engines.
    let guard = payment.get("1").lock().await.expect("lock");
    guard.release().await.expect("release");
}

/// A label set in `[defaults]` is every engine's unless the engine's own
/// table names another; either is what the holder records carry.
#[tokio::test]
async fn client_name_labels_the_holder_records() {
    let registry = build(
        "[defaults]\nengine = \"a\"\nclient_name = \"billing-7\"\n\
         [engines.a]\nkind = \"memory\"\n\
         [engines.b]\nkind = \"memory\"\nclient_name = \"reports\"\n\
         [groups.other]\nengine = \"b\"",
    )
    .await
    .expect("build");
    for (group, label) in [("order", "billing-7"), ("other", "reports")] {
        let lock = registry.locks(group).get("1");
        let guard = lock.lock().await.expect("lock");
        let view = lock.inspect().await.expect("inspect");
        assert_eq!(view.holders[0].label.as_deref(), Some(label), "{view:?}");
        guard.release().await.expect("release");
    }
}

#[tokio::test]
async fn an_empty_config_serves_from_the_memory_engine() {
    let registry = build("").await.expect("empty config");
    let locks = registry.locks("g");
    assert_eq!(locks.engine(), "memory");
    assert_eq!(locks.settings().lease, Duration::from_secs(30));
    assert_eq!(locks.settings().wait, Wait::Forever);
    locks
        .get("n")
        .lock()
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
}

#[test]
fn environment_overrides_the_file() {
    let env = [
        ("DLOCK_DEFAULTS__LEASE", "7s"),
        ("DLOCK_GROUPS__REPORT__ENGINE", "side"),
        ("DLOCK_DEFAULTS__POLL__INTERVAL", "20ms"),
        ("HOME", "/ignored"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let config = Config::parse(GOOD, env).expect("config");
    assert_eq!(config.defaults.lease, Duration::from_secs(7));
    assert_eq!(config.groups["report"].engine.as_deref(), Some("side"));
    assert_eq!(
        config.defaults.poll,
        Polling::Constant {
            interval: Duration::from_millis(20)
        }
    );
}

#[test]
fn a_bad_environment_value_names_the_field() {
    let env = [("DLOCK_DEFAULTS__LEASE".to_owned(), "soon".to_owned())];
    let (field, message) = field_of(Config::parse(GOOD, env));
    assert_eq!(field, "defaults.lease");
    assert!(
        message.contains("soon") || message.contains("invalid"),
        "{message}"
    );
    assert!(
        message.contains("DLOCK_DEFAULTS__LEASE"),
        "names the variable: {message}"
    );
    assert!(message.contains("\"250ms\""), "gives an example: {message}");
    // Checks made after parsing name it too.
    let env = [("DLOCK_GROUPS__REPORT__LEASE".to_owned(), "2ms".to_owned())];
    let (field, message) = field_of(Config::parse(GOOD, env));
    assert_eq!(field, "groups.report.lease");
    assert!(message.contains("DLOCK_GROUPS__REPORT__LEASE"), "{message}");
}

/// Each (config, field, message part): building it fails naming that field.
async fn fails_naming_the_field(cases: &[(&str, &str, &str)]) {
    for (text, want_field, want_message) in cases {
        let (field, message) = field_of(build(text).await);
        assert_eq!(&field, want_field, "for config:\n{text}\nmessage: {message}");
        assert!(
            message.contains(want_message),
            "for config:\n{text}\nmessage {message:?} lacks {want_message:?}"
        );
    }
}

#[tokio::test]
async fn bad_files_fail_naming_the_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "[engines.main]\nkind = \"redys\"",
            "engines.main.kind",
            "unknown engine kind `redys`",
        ),
        ("[engines.main]\nurl = \"x\"", "engines.main", "kind"),
        (
            "[engines.main]\nkind = \"memory\"\nurll = \"x\"",
            "engines.main.urll",
            "unknown field",
        ),
        (
            "[engines.main]\nkind = \"memory\"\n[groups.pay]\nengine = \"zk\"",
            "groups.pay.engine",
            "`zk` is not defined",
        ),
        (
            "[defaults]\nengine = \"zk\"",
            "defaults.engine",
            "`zk` is not defined",
        ),
        ("[defaults]\nlease = \"thirty seconds\"", "defaults.lease", ""),
        ("[defaults]\nlease = \"1ms\"", "defaults.lease", "too short"),
        ("[defaults]\nleese = \"1s\"", "defaults.leese", "unknown field"),
        ("[defaults]\nwait = 5", "defaults.wait", ""),
        ("[groups.g]\nwait = \"soon\"", "groups.g.wait", "\"forever\""),
        (
            "[defaults]\npoll = { strategy = \"random\" }",
            "defaults.poll.strategy",
            "random",
        ),
        (
            "[defaults]\npoll = { strategy = \"exponential\", initial = \"1s\", max = \"10ms\" }",
            "defaults.poll.max",
            "less than initial",
        ),
        (
            "[engines.a]\nkind = \"memory\"\n[engines.b]\nkind = \"memory\"",
            "defaults.engine",
            "several engines",
        ),
        ("[groups.g]\nlease = \"2ms\"", "groups.g.lease", "too short"),
        ("[groups.g]\nengin = \"main\"", "groups.g.engin", "unknown field"),
        ("[surprise]\nx = 1", "surprise", "unknown field"),
        ("[defaults\nlease = 1", "config", "line 1"),
    ];
    fails_naming_the_field(cases).await;
}

/// The settings every server engine shares are flattened into its table;
/// a bad one is still named.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn bad_shared_settings_fail_naming_the_field() {
    let pg = "[engines.pg]\nkind = \"postgres\"\nurl = \"postgres://127.0.0.1:1/x\"";
    let cases = [
        (
            format!("{pg}\nconnect_timeout = \"soon\""),
            "engines.pg.connect_timeout",
            "duration",
        ),
        (
            format!("{pg}\nclient_name = 5"),
            "engines.pg.client_name",
            "string",
        ),
        (
            format!("{pg}\nconect_timeout = \"1s\""),
            "engines.pg.conect_timeout",
            "unknown field",
        ),
        (
            format!("{pg}\nmax_connections = \"many\""),
            "engines.pg.max_connections",
            "",
        ),
        (
            "[engines.m]\nkind = \"memory\"\nconnect_timeout = \"1s\"".to_owned(),
            "engines.m.connect_timeout",
            "unknown field",
        ),
    ];
    let cases: Vec<(&str, &str, &str)> = cases.iter().map(|(t, f, m)| (t.as_str(), *f, *m)).collect();
    fails_naming_the_field(&cases).await;
}

#[cfg(all(feature = "redis", feature = "zookeeper"))]
#[tokio::test]
async fn bad_engine_settings_fail_naming_the_field() {
    use dlock_testkit::fixtures::redis::redis_args;
    use dlock_testkit::server::TestServer;
    // Checked against the engine's capabilities once it is connected.
    let redis = TestServer::start("redis-server", |port| redis_args(port, &[]));
    let short_waiter_ttl = format!(
        "[engines.r]\nkind = \"redis\"\nurl = \"redis://{}\"\nwaiter_ttl = \"100ms\"",
        redis.address()
    );
    fails_naming_the_field(&[(&short_waiter_ttl, "engines.r.waiter_ttl", "3 poll intervals")]).await;
    let cases: &[(&str, &str, &str)] = &[
        ("[engines.zk]\nkind = \"zookeeper\"", "engines.zk", "connect"),
        (
            "[engines.r]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nwaiter_ttl = \"soon\"",
            "engines.r.waiter_ttl",
            "",
        ),
        (
            "[engines.r]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nclient_name = \"bill\\ting\"",
            "engines.r.client_name",
            "control character",
        ),
        (
            "[defaults]\nclient_name = \"\"\n[engines.r]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"",
            "defaults.client_name",
            "is empty",
        ),
        (
            "[engines.zk]\nkind = \"zookeeper\"\nconect = \"127.0.0.1:2181\"",
            "engines.zk.conect",
            "unknown field",
        ),
        (
            "[engines.zk]\nkind = \"zookeeper\"\nconnect = \"127.0.0.1:2181\"\nroot = \"locks\"",
            "engines.zk.root",
            "not an absolute",
        ),
        (
            "[engines.zk]\nkind = \"zookeeper\"\nconnect = \"127.0.0.1:2181\"\nsession_timeout = \"ten\"",
            "engines.zk.session_timeout",
            "",
        ),
        (
            "[engines.zk]\nkind = \"zookeeper\"\nconnect = \"127.0.0.1:2181\"\ndigest = \"nopassword\"",
            "engines.zk.digest",
            "user:password",
        ),
        (
            "[engines.rc]\nkind = \"redis-cluster\"\nnodes = []",
            "engines.rc.nodes",
            "at least one",
        ),
        (
            "[engines.s]\nkind = \"redis-sentinel\"\nsentinels = []\nmaster_name = \"m\"",
            "engines.s.sentinels",
            "at least one",
        ),
        (
            "[engines.s]\nkind = \"redis-sentinel\"\nsentinels = [\"redis://127.0.0.1:1\"]",
            "engines.s",
            "master_name",
        ),
    ];
    fails_naming_the_field(cases).await;
}

#[test]
fn a_missing_file_names_the_path() {
    let (field, message) = field_of(Config::from_file("/nonexistent/dlock.toml"));
    assert_eq!(field, "config file");
    assert!(message.contains("/nonexistent/dlock.toml"), "{message}");
}

#[tokio::test]
async fn an_unknown_engine_override_is_an_error() {
    let registry = build(GOOD).await.expect("config");
    let (field, message) = field_of(registry.locks_on("payment", "zk"));
    assert_eq!(field, "engine");
    assert!(message.contains("`zk`"), "{message}");
}

#[tokio::test]
async fn the_global_registry_is_initialised_once() {
    let path = dlock_testkit::server::scratch("config.toml");
    std::fs::write(&path, GOOD).expect("write config");
    dlock::init_from_file(&path).await.expect("init");
    assert_eq!(dlock::locks("payment").engine(), "side");
    let (field, _) = field_of(dlock::init(Config::default()).await);
    assert_eq!(field, "init");
}

/// An error is one line, and a key one slip away from a known one (a
/// letter added, dropped, changed, or two swapped) is given the one meant:
/// in the defaults, a group, and an engine's own and shared settings.
#[tokio::test]
async fn a_misspelt_key_is_one_line_naming_the_key_meant() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "[defaults]\nleese = \"1s\"",
            "defaults.leese",
            "did you mean `lease`?",
        ),
        (
            "[groups.g]\nwiat = \"1s\"",
            "groups.g.wiat",
            "did you mean `wait`?",
        ),
        (
            "[engines.main]\nkind = \"redis\"\nulr = \"redis://127.0.0.1:1\"",
            "engines.main.ulr",
            "did you mean `url`?",
        ),
        (
            "[engines.main]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nconect_timeout = \"1s\"",
            "engines.main.conect_timeout",
            "did you mean `connect_timeout`?",
        ),
        (
            "[groups.g]\nlease = \"abc\"",
            "groups.g.lease",
            "write a duration like",
        ),
    ];
    #[cfg(feature = "redis")]
    fails_naming_the_field(cases).await;
    #[cfg(not(feature = "redis"))]
    fails_naming_the_field(&cases[..2]).await;
    for (text, ..) in cases {
        if let Err(error) = parse(text) {
            assert!(!error.to_string().contains('\n'), "{error:?}");
        }
    }
}
