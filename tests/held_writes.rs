//! Held writes against real servers, on every engine that offers them: a
//! holder paused past its lease, then resumed, has its write refused by the
//! server, and the write of the holder that took over lands
//! (`dlock_testkit::held_writes`). Each engine's own shape of write is
//! checked beside it: compares of the user's own, a refusal that applies
//! nothing, and `Unsupported` on another engine.

#![cfg(any(
    feature = "etcd",
    feature = "redis",
    feature = "zookeeper",
    feature = "postgres",
    feature = "mysql",
    feature = "dynamodb",
    feature = "nats"
))]

use std::sync::Arc;

use dlock::Guard;
use dlock::kit::async_trait;
use dlock_testkit::held_writes::{HeldStore, paused_holder_is_refused};

/// An engine without held writes, and another engine's extension, answer
/// `Unsupported`, naming the engine and the extension; nothing is written.
#[tokio::test]
async fn an_engine_without_held_writes_answers_unsupported() {
    let registry = dlock::Registry::with_engine(
        "local",
        Arc::new(dlock::engines::memory::MemoryEngine::new()),
        Default::default(),
    )
    .expect("registry");
    let guard = registry.locks("held").get("nowhere").lock().await.expect("lock");
    let refused = |refused: Option<dlock::Error>| match refused {
        Some(error @ dlock::Error::Unsupported { .. }) => {
            let message = error.to_string();
            assert!(message.contains("`local` (memory)"), "{message}");
            assert!(message.contains("held writes through"), "{message}");
        }
        other => panic!("expected Unsupported, got {:?}", other.map(|e| e.to_string())),
    };
    // Each extension built in.
    #[cfg(feature = "etcd")]
    refused(dlock::engines::etcd::HeldTxn::of(&guard).err());
    #[cfg(feature = "redis")]
    refused(dlock::engines::redis::HeldWrite::of(&guard).err());
    #[cfg(feature = "zookeeper")]
    refused(dlock::engines::zookeeper::HeldMulti::of(&guard).err());
    #[cfg(feature = "postgres")]
    refused(dlock::engines::postgres::HeldTransaction::of(&guard).err());
    #[cfg(feature = "mysql")]
    refused(dlock::engines::mysql::HeldTransaction::of(&guard).err());
    #[cfg(feature = "dynamodb")]
    refused(dlock::engines::dynamodb::HeldTransaction::of(&guard).err());
    #[cfg(feature = "nats")]
    refused(dlock::engines::nats::HeldPut::of(&guard).err());
    guard.release().await.expect("release");
}

#[cfg(feature = "etcd")]
mod etcd {
    use dlock::engines::etcd::HeldTxn;
    use dlock::engines::etcd::etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
    use dlock_testkit::Fixture;
    use dlock_testkit::fixtures::etcd::Etcd;

    use super::*;

    struct Store {
        endpoint: String,
        key: String,
    }

    #[async_trait]
    impl HeldStore for Store {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), dlock::Error> {
            let txn = Txn::new().and_then([TxnOp::put(self.key.as_str(), value, None)]);
            let answer = HeldTxn::of(guard)?.commit(txn).await?;
            assert!(answer.succeeded(), "no compare of the user's own failed");
            Ok(())
        }

        async fn read(&self) -> Option<String> {
            let mut client = Client::connect([self.endpoint.as_str()], None)
                .await
                .expect("etcd");
            let got = client.get(self.key.as_str(), None).await.expect("read");
            got.kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
        }
    }

    #[test]
    fn paused_holder_is_refused_by_etcd() {
        let etcd = Etcd::start();
        let store = Store {
            endpoint: etcd.server.address(),
            key: "/app/held".to_owned(),
        };
        paused_holder_is_refused(&etcd, Arc::new(store));
    }

    /// The user's own compares decide between its operations, under the
    /// hold's check: a failed one is an answer, not a lost hold.
    #[tokio::test]
    async fn users_compares_are_answered() {
        let etcd = Etcd::start();
        let registry =
            dlock::Registry::with_engine("main", dlock_testkit::engine(&etcd).await, Default::default())
                .expect("registry");
        let guard = registry.locks("held").get("compares").lock().await.expect("lock");
        let key = "/app/compared";
        let txn = Txn::new()
            .when([Compare::version(key, CompareOp::Greater, 0)])
            .and_then([TxnOp::put(key, "then", None)])
            .or_else([TxnOp::put(key, "else", None)]);
        let answer = HeldTxn::of(&guard)
            .expect("etcd")
            .commit(txn)
            .await
            .expect("held");
        assert!(!answer.succeeded(), "the key did not exist");
        let mut client = Client::connect([etcd.server.address()], None)
            .await
            .expect("etcd");
        let got = client.get(key, None).await.expect("read");
        assert_eq!(got.kvs()[0].value(), b"else");
        guard.release().await.expect("release");
    }
}

#[cfg(feature = "redis")]
mod redis_engine {
    use dlock::engines::redis::HeldWrite;
    use dlock_testkit::Fixture;
    use dlock_testkit::fixtures::redis::Redis;
    use redis::AsyncCommands;

    use super::*;

    struct Store {
        url: String,
        key: String,
    }

    impl Store {
        async fn connection(&self) -> redis::aio::MultiplexedConnection {
            let client = redis::Client::open(self.url.as_str()).expect("url");
            client.get_multiplexed_async_connection().await.expect("redis")
        }
    }

    #[async_trait]
    impl HeldStore for Store {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), dlock::Error> {
            HeldWrite::of(guard)?.set(&self.key, value).commit().await
        }

        async fn read(&self) -> Option<String> {
            self.connection().await.get(&self.key).await.expect("read")
        }
    }

    #[test]
    fn paused_holder_is_refused_by_redis() {
        let redis = Redis::start();
        let store = Store {
            url: format!("redis://{}", redis.server.address()),
            key: "app:held".to_owned(),
        };
        paused_holder_is_refused(&redis, Arc::new(store));
    }

    /// Several writes land together, beside the lock; a permit writes too,
    /// and after its release nothing lands.
    #[tokio::test]
    async fn writes_land_together_and_not_after_release() {
        let redis = Redis::start();
        let url = format!("redis://{}", redis.server.address());
        let registry =
            dlock::Registry::with_engine("main", dlock_testkit::engine(&redis).await, Default::default())
                .expect("registry");
        let store = Store {
            url,
            key: String::new(),
        };
        let mut connection = store.connection().await;
        let guard = registry.locks("held").get("several").lock().await.expect("lock");
        let held = HeldWrite::of(&guard).expect("redis");
        let (cursor, stats) = (held.beside("cursor"), held.beside("stats"));
        assert!(
            cursor.starts_with("{dlock:held:several}"),
            "in the lock's slot: {cursor}"
        );
        held.set(&cursor, "4096")
            .hset(&stats, "rows", "12")
            .commit()
            .await
            .expect("held");
        let got: (String, String) = (
            connection.get(&cursor).await.expect("get"),
            connection.hget(&stats, "rows").await.expect("hget"),
        );
        assert_eq!(got, ("4096".to_owned(), "12".to_owned()));
        HeldWrite::of(&guard)
            .expect("redis")
            .del(&cursor)
            .commit()
            .await
            .expect("del");
        let gone: Option<String> = connection.get(&cursor).await.expect("get");
        assert_eq!(gone, None);

        let permit = registry
            .locks("held")
            .semaphore("pool", 2)
            .acquire()
            .await
            .expect("permit");
        let slot_key = HeldWrite::of(&permit).expect("redis").beside("slot");
        HeldWrite::of(&permit)
            .expect("redis")
            .set(&slot_key, "mine")
            .commit()
            .await
            .expect("permit writes");
        let held = permit.held().clone();
        permit.release().await.expect("release");
        let after = HeldWrite::of(&held)
            .expect("redis")
            .set(&slot_key, "late")
            .commit()
            .await;
        assert!(
            matches!(after, Err(dlock::Error::Lost { .. })),
            "after release: {after:?}"
        );
        let kept: String = connection.get(&slot_key).await.expect("get");
        assert_eq!(kept, "mine");
        guard.release().await.expect("release");
    }
}

#[cfg(feature = "dynamodb")]
mod dynamodb {
    use std::sync::OnceLock;

    use dlock::engines::dynamodb::HeldTransaction;
    use dlock::engines::dynamodb::aws_sdk_dynamodb::types::{
        AttributeValue, ConditionCheck, Put, TransactWriteItem,
    };
    use dlock_testkit::Fixture;
    use dlock_testkit::fixtures::dynamodb::{Connection, DynamoDb};

    use super::*;

    /// DynamoDB Local is a JVM, slow to start: one for the file.
    fn fixture() -> &'static DynamoDb {
        static FIXTURE: OnceLock<DynamoDb> = OnceLock::new();
        FIXTURE.get_or_init(DynamoDb::start)
    }

    /// The user's item `pk = app`, `sk = <sk>` in the engine's own table,
    /// which may hold other data.
    struct Store {
        address: String,
        sk: String,
    }

    fn put(sk: &str, value: &str) -> TransactWriteItem {
        let put = Put::builder()
            .table_name("dlock")
            .item("pk", AttributeValue::S("app".into()))
            .item("sk", AttributeValue::S(sk.into()))
            .item("v", AttributeValue::S(value.into()))
            .build()
            .expect("a table and an item");
        TransactWriteItem::builder().put(put).build()
    }

    #[async_trait]
    impl HeldStore for Store {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), dlock::Error> {
            HeldTransaction::of(guard)?
                .item(put(&self.sk, value))
                .commit()
                .await
        }

        async fn read(&self) -> Option<String> {
            let body = format!(
                r#"{{"TableName":"dlock","ConsistentRead":true,"Key":{{"pk":{{"S":"app"}},"sk":{{"S":"{}"}}}}}}"#,
                self.sk
            );
            let (status, answer) = Connection::open(&self.address)
                .expect("connect")
                .call("GetItem", &body)
                .expect("GetItem");
            assert_eq!(status, 200, "{answer}");
            let answer: serde_json::Value = serde_json::from_str(&answer).expect("json");
            answer["Item"]["v"]["S"].as_str().map(str::to_owned)
        }
    }

    #[test]
    fn paused_holder_is_refused_by_dynamodb() {
        let store = Store {
            address: fixture().server.address(),
            sk: "held".to_owned(),
        };
        paused_holder_is_refused(fixture(), Arc::new(store));
    }

    /// A condition of the user's own that fails cancels the transaction,
    /// named in the error, and writes nothing; the hold stays sound.
    #[tokio::test]
    async fn a_failed_condition_of_the_users_own_writes_nothing() {
        let engine = dlock_testkit::engine(fixture()).await;
        let registry = dlock::Registry::with_engine("main", engine, Default::default()).expect("registry");
        let guard = registry
            .locks("held")
            .get("condition")
            .lock()
            .await
            .expect("lock");
        let store = Store {
            address: fixture().server.address(),
            sk: "conditioned".to_owned(),
        };
        let absent = ConditionCheck::builder()
            .table_name("dlock")
            .key("pk", AttributeValue::S("app".into()))
            .key("sk", AttributeValue::S("never-written".into()))
            .condition_expression("attribute_exists(pk)")
            .build()
            .expect("a check");
        let refused = HeldTransaction::of(&guard)
            .expect("dynamodb")
            .item(put("conditioned", "no"))
            .item(TransactWriteItem::builder().condition_check(absent).build())
            .commit()
            .await;
        match refused {
            Err(error @ dlock::Error::Engine { .. }) => {
                assert!(
                    error.to_string().contains("item 2: ConditionalCheckFailed"),
                    "{error}"
                );
            }
            other => panic!("expected the transaction cancelled, got {other:?}"),
        }
        assert_eq!(store.read().await, None, "nothing written");
        assert!(!guard.is_lost(), "the hold is sound");
        store.write(&guard, "yes").await.expect("held");
        assert_eq!(store.read().await.as_deref(), Some("yes"));
        guard.release().await.expect("release");
    }
}

#[cfg(feature = "nats")]
mod nats {
    use std::time::Duration;

    use dlock::engines::nats::HeldPut;
    use dlock::engines::nats::async_nats;
    use dlock_testkit::Fixture;
    use dlock_testkit::fixtures::nats::Nats;
    use futures_util::StreamExt;

    use super::*;

    struct Store {
        url: String,
        key: String,
    }

    impl Store {
        async fn bucket(&self) -> async_nats::jetstream::kv::Store {
            let client = async_nats::connect(self.url.as_str()).await.expect("nats");
            async_nats::jetstream::new(client)
                .get_key_value("dlock")
                .await
                .expect("the bucket")
        }
    }

    #[async_trait]
    impl HeldStore for Store {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), dlock::Error> {
            HeldPut::of(guard)?.put(&self.key, value).await.map(drop)
        }

        async fn read(&self) -> Option<String> {
            let got = self
                .bucket()
                .await
                .get(HeldPut::key(&self.key))
                .await
                .expect("read");
            got.map(|value| String::from_utf8_lossy(&value).into_owned())
        }
    }

    #[test]
    fn paused_holder_is_refused_by_nats() {
        let nats = Nats::start();
        let store = Store {
            url: format!("nats://{}", nats.server.address()),
            key: "app.held".to_owned(),
        };
        paused_holder_is_refused(&nats, Arc::new(store));
    }

    /// The holder's own renewals and an operator's revoke rewrite its key:
    /// its writes go on landing; once released, none does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_land_across_renewals_and_a_revoke_not_after_release() {
        let nats = Nats::start();
        let engine = dlock_testkit::engine(&nats).await;
        let settings = dlock::Settings {
            lease: Duration::from_secs(1),
            ..Default::default()
        };
        let registry = dlock::Registry::with_engine("main", engine, settings).expect("registry");
        let store = Store {
            url: format!("nats://{}", nats.server.address()),
            key: "app.renewed".to_owned(),
        };
        let lock = registry.locks("held").get("renewed");
        let guard = lock.lock().await.expect("lock");
        for n in 0..8 {
            store
                .write(&guard, &n.to_string())
                .await
                .expect("a write while held");
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        assert_eq!(lock.revoke().await.expect("revoke"), 1);
        store
            .write(&guard, "revoked")
            .await
            .expect("a revoked holder still holds");
        let held = guard.held().clone();
        guard.release().await.expect("release");
        let after = HeldPut::of(&held).expect("nats").put(&store.key, "late").await;
        assert!(
            matches!(after, Err(dlock::Error::Lost { .. })),
            "after release: {after:?}"
        );
        assert_eq!(store.read().await.as_deref(), Some("revoked"));
    }

    /// The refusal is the server's: the hold's key removed behind the
    /// holder's back (its state still says held, its lease 30 s away),
    /// the write is refused, and nothing lands.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_stream_refuses_a_write_once_the_holds_key_is_gone() {
        let nats = Nats::start();
        let engine = dlock_testkit::engine(&nats).await;
        let registry = dlock::Registry::with_engine("main", engine, Default::default()).expect("registry");
        let guard = registry.locks("held").get("behind").lock().await.expect("lock");
        HeldPut::of(&guard)
            .expect("nats")
            .put("app.behind", "first")
            .await
            .expect("held");
        let client = async_nats::connect(format!("nats://{}", nats.server.address()))
            .await
            .expect("nats");
        let bucket = async_nats::jetstream::new(client)
            .get_key_value("dlock")
            .await
            .expect("bucket");
        let mut keys = bucket.keys().await.expect("keys");
        let mut lock_key = None;
        while let Some(key) = keys.next().await {
            let key = key.expect("key");
            if key.starts_with("l.") {
                lock_key = Some(key);
            }
        }
        bucket
            .purge(lock_key.expect("the hold's key"))
            .await
            .expect("purge");
        let stale = HeldPut::of(&guard)
            .expect("nats")
            .put("app.behind", "stale")
            .await;
        assert!(matches!(stale, Err(dlock::Error::Lost { .. })), "{stale:?}");
        let kept = bucket.get(HeldPut::key("app.behind")).await.expect("read");
        assert_eq!(kept.as_deref(), Some(&b"first"[..]));
    }
}

#[cfg(feature = "zookeeper")]
mod zookeeper {
    use dlock::engines::zookeeper::HeldMulti;
    use dlock_testkit::Fixture;
    use dlock_testkit::fixtures::zookeeper::ZooKeeper;
    use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult};

    use super::*;

    struct Store {
        address: String,
        path: String,
    }

    impl Store {
        /// A store whose node is made, empty.
        async fn made(zookeeper: &ZooKeeper, path: &str) -> Store {
            let store = Store {
                address: zookeeper.server.address(),
                path: path.to_owned(),
            };
            let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
            store
                .client()
                .await
                .create(path, b"", &open)
                .await
                .expect("create");
            store
        }

        async fn client(&self) -> Client {
            Client::connect(&self.address).await.expect("zookeeper")
        }
    }

    #[async_trait]
    impl HeldStore for Store {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), dlock::Error> {
            HeldMulti::of(guard)?
                .set_data(&self.path, value.as_bytes(), None)
                .commit()
                .await
                .map(drop)
        }

        async fn read(&self) -> Option<String> {
            let (data, _) = self.client().await.get_data(&self.path).await.expect("read");
            Some(String::from_utf8(data).expect("utf-8"))
        }
    }

    #[test]
    fn paused_holder_is_refused_by_zookeeper() {
        let zookeeper = ZooKeeper::start();
        let store = tokio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(Store::made(&zookeeper, "/app-held"));
        paused_holder_is_refused(&zookeeper, Arc::new(store));
    }

    /// Several operations land together; one of the user's that fails
    /// applies none of them and leaves the hold on; a permit writes too,
    /// and after its release nothing lands.
    #[tokio::test]
    async fn operations_land_together_or_not_at_all() {
        let zookeeper = ZooKeeper::start();
        let registry = dlock::Registry::with_engine(
            "main",
            dlock_testkit::engine(&zookeeper).await,
            Default::default(),
        )
        .expect("registry");
        let store = Store::made(&zookeeper, "/app-multi").await;
        let client = store.client().await;
        let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let data = |path: &'static str| {
            let client = &client;
            async move { client.get_data(path).await.map(|(data, _)| data) }
        };

        let guard = registry.locks("held").get("multi").lock().await.expect("lock");
        let answers = HeldMulti::of(&guard)
            .expect("zookeeper")
            .set_data("/app-multi", b"4096", None)
            .create("/app-multi/done", b"7", &open)
            .commit()
            .await
            .expect("held");
        assert!(
            matches!(
                answers.as_slice(),
                [MultiWriteResult::SetData { .. }, MultiWriteResult::Create { .. }]
            ),
            "{answers:?}"
        );
        assert_eq!(data("/app-multi").await.expect("get"), b"4096");
        assert_eq!(data("/app-multi/done").await.expect("get"), b"7");

        // The create fails (the node exists): the set before it is not applied.
        let refused = HeldMulti::of(&guard)
            .expect("zookeeper")
            .set_data("/app-multi", b"8192", None)
            .create("/app-multi/done", b"8", &open)
            .commit()
            .await;
        match refused {
            Err(dlock::Error::Engine { source, .. }) => assert_eq!(
                source.downcast_ref::<MultiWriteError>(),
                Some(&MultiWriteError::OperationFailed {
                    index: 1,
                    source: ZkError::NodeExists
                })
            ),
            other => panic!("expected the engine's error, got {other:?}"),
        }
        assert_eq!(data("/app-multi").await.expect("get"), b"4096");
        HeldMulti::of(&guard)
            .expect("zookeeper")
            .delete("/app-multi/done", None)
            .commit()
            .await
            .expect("the hold goes on");
        assert_eq!(data("/app-multi/done").await, Err(ZkError::NoNode));
        guard.release().await.expect("release");

        let permit = registry
            .locks("held")
            .semaphore("pool", 2)
            .acquire()
            .await
            .expect("permit");
        HeldMulti::of(&permit)
            .expect("zookeeper")
            .set_data("/app-multi", b"mine", None)
            .commit()
            .await
            .expect("permit writes");
        let held = permit.held().clone();
        permit.release().await.expect("release");
        let after = HeldMulti::of(&held)
            .expect("zookeeper")
            .set_data("/app-multi", b"late", None)
            .commit()
            .await;
        assert!(
            matches!(after, Err(dlock::Error::Lost { .. })),
            "after release: {after:?}"
        );
        assert_eq!(data("/app-multi").await.expect("get"), b"mine");
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::time::Duration;

    use dlock::engines::postgres::HeldTransaction;
    use dlock::{LostReason, Registry, Settings};
    use dlock_testkit::Fixture;
    use dlock_testkit::fixtures::postgres::Postgres;

    use super::*;

    struct Store {
        url: String,
    }

    impl Store {
        /// A store whose table is made, with its one row.
        async fn made(postgres: &Postgres) -> Store {
            let store = Store {
                url: postgres.server.url(),
            };
            store
                .client()
                .await
                .batch_execute(
                    "CREATE TABLE app_held (k text PRIMARY KEY, v text); \
                     INSERT INTO app_held VALUES ('held', NULL)",
                )
                .await
                .expect("the store's table");
            store
        }

        async fn client(&self) -> tokio_postgres::Client {
            let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
                .await
                .expect("postgres");
            tokio::spawn(connection);
            client
        }

        async fn value(&self, k: &str) -> Option<String> {
            let row = self
                .client()
                .await
                .query_opt("SELECT v FROM app_held WHERE k = $1", &[&k])
                .await
                .expect("read");
            row.and_then(|row| row.get(0))
        }
    }

    #[async_trait]
    impl HeldStore for Store {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), dlock::Error> {
            let rows = HeldTransaction::of(guard)?
                .execute("UPDATE app_held SET v = $1 WHERE k = 'held'", &[&value])
                .commit()
                .await?;
            assert_eq!(rows, [1], "the row is written");
            Ok(())
        }

        async fn read(&self) -> Option<String> {
            self.value("held").await
        }
    }

    #[test]
    fn paused_holder_is_refused_by_postgres() {
        let postgres = Postgres::start();
        let store = tokio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(Store::made(&postgres));
        paused_holder_is_refused(&postgres, Arc::new(store));
    }

    /// Statements land together; one that fails applies none of them and
    /// leaves the hold on. Two holds share the holder's session: one forced
    /// out (its session lives on, for the other) is refused at once, before
    /// its renewal lets it go, and the other's write lands. A permit writes
    /// too, and after its release nothing lands.
    #[tokio::test]
    async fn statements_land_together_or_not_at_all() {
        let postgres = Postgres::start();
        let store = Store::made(&postgres).await;
        let settings = Settings {
            lease: Duration::from_secs(5),
            ..Settings::default()
        };
        let registry = Registry::with_engine("main", dlock_testkit::engine(&postgres).await, settings)
            .expect("registry");

        let guard = registry
            .locks("held")
            .get("statements")
            .lock()
            .await
            .expect("lock");
        let rows = HeldTransaction::of(&guard)
            .expect("postgres")
            .execute("UPDATE app_held SET v = $1 WHERE k = 'held'", &[&"4096"])
            .execute("INSERT INTO app_held VALUES ($1, $2)", &[&"done", &"7"])
            .commit()
            .await
            .expect("held");
        assert_eq!(rows, [1, 1]);
        assert_eq!(store.value("held").await.as_deref(), Some("4096"));
        assert_eq!(store.value("done").await.as_deref(), Some("7"));

        // The insert fails (the key exists): the update before it is not applied.
        let refused = HeldTransaction::of(&guard)
            .expect("postgres")
            .execute("UPDATE app_held SET v = $1 WHERE k = 'held'", &[&"8192"])
            .execute("INSERT INTO app_held VALUES ($1, $2)", &[&"done", &"8"])
            .commit()
            .await;
        match refused {
            Err(error @ dlock::Error::Engine { .. }) => {
                let message = error.to_string();
                assert!(
                    message.contains("statement 1") && message.contains("23505"),
                    "{message}"
                );
            }
            other => panic!("expected the engine's error, got {other:?}"),
        }
        assert_eq!(store.value("held").await.as_deref(), Some("4096"));

        // Another hold on the same session, once the first has its row
        // (what a force release needs).
        let other = registry.locks("held").get("other").lock().await.expect("lock");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let operator =
            Registry::with_engine("op", dlock_testkit::engine(&postgres).await, settings).expect("registry");
        let forced = operator.locks("held").get("statements").force_release().await;
        assert_eq!(forced.expect("force release"), 1);
        let after = HeldTransaction::of(&guard)
            .expect("postgres")
            .execute("UPDATE app_held SET v = $1 WHERE k = 'held'", &[&"forced"])
            .commit()
            .await;
        assert!(
            matches!(
                after,
                Err(dlock::Error::Lost {
                    reason: LostReason::ForceReleased,
                    ..
                })
            ),
            "forced out: {after:?}"
        );
        HeldTransaction::of(&other)
            .expect("postgres")
            .execute("UPDATE app_held SET v = $1 WHERE k = 'done'", &[&"other"])
            .commit()
            .await
            .expect("the other hold writes on");
        assert_eq!(store.value("held").await.as_deref(), Some("4096"));
        assert_eq!(store.value("done").await.as_deref(), Some("other"));
        other.release().await.expect("release");

        let permit = registry
            .locks("held")
            .semaphore("pool", 2)
            .acquire()
            .await
            .expect("permit");
        HeldTransaction::of(&permit)
            .expect("postgres")
            .execute("UPDATE app_held SET v = $1 WHERE k = 'held'", &[&"mine"])
            .commit()
            .await
            .expect("permit writes");
        let held = permit.held().clone();
        permit.release().await.expect("release");
        let late = HeldTransaction::of(&held)
            .expect("postgres")
            .execute("UPDATE app_held SET v = $1 WHERE k = 'held'", &[&"late"])
            .commit()
            .await;
        assert!(
            matches!(late, Err(dlock::Error::Lost { .. })),
            "after release: {late:?}"
        );
        assert_eq!(store.value("held").await.as_deref(), Some("mine"));
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use std::time::Duration;

    use dlock::engines::mysql::HeldTransaction;
    use dlock::{LostReason, Registry, Settings};
    use dlock_testkit::Fixture;
    use dlock_testkit::fixtures::mysql::Mysql;
    use mysql_async::prelude::Queryable;

    use super::*;

    struct Store {
        url: String,
    }

    impl Store {
        /// A store whose table is made, with its one row.
        async fn made(mysql: &Mysql) -> Store {
            let store = Store {
                url: mysql.server.url(),
            };
            store
                .conn()
                .await
                .query_drop(
                    "CREATE TABLE app_held (k VARCHAR(32) PRIMARY KEY, v TEXT NULL) ENGINE = InnoDB; \
                     INSERT INTO app_held VALUES ('held', NULL)",
                )
                .await
                .expect("the store's table");
            store
        }

        async fn conn(&self) -> mysql_async::Conn {
            let opts = mysql_async::Opts::from_url(&self.url).expect("url");
            mysql_async::Conn::new(opts).await.expect("mysql")
        }

        async fn value(&self, k: &str) -> Option<String> {
            let row: Option<Option<String>> = self
                .conn()
                .await
                .exec_first("SELECT v FROM app_held WHERE k = ?", (k,))
                .await
                .expect("read");
            row.flatten()
        }
    }

    #[async_trait]
    impl HeldStore for Store {
        async fn write(&self, guard: &Guard, value: &str) -> Result<(), dlock::Error> {
            let rows = HeldTransaction::of(guard)?
                .exec("UPDATE app_held SET v = ? WHERE k = 'held'", (value,))
                .commit()
                .await?;
            assert_eq!(rows, [1], "the row is written");
            Ok(())
        }

        async fn read(&self) -> Option<String> {
            self.value("held").await
        }
    }

    /// The paused holder holds the gate (a write lock taken at once, its
    /// lease whole seconds); the next holder, granted after waiting, holds
    /// through the table.
    #[test]
    fn paused_holder_is_refused_by_mysql() {
        let mysql = Mysql::start();
        let store = tokio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(Store::made(&mysql));
        paused_holder_is_refused(&mysql, Arc::new(store));
    }

    /// Statements land together, for a hold of the gate, of a row (read
    /// holds, two at once) and of a permit; one that fails applies none of
    /// them and leaves the hold on; after a release, or forced out, nothing
    /// lands.
    #[tokio::test]
    async fn statements_land_together_or_not_at_all() {
        let mysql = Mysql::start();
        let store = Store::made(&mysql).await;
        let settings = Settings {
            lease: Duration::from_secs(5),
            ..Settings::default()
        };
        let registry =
            Registry::with_engine("main", dlock_testkit::engine(&mysql).await, settings).expect("registry");
        let lock = registry.locks("held").get("statements");

        let guard = lock.lock().await.expect("lock");
        let rows = HeldTransaction::of(&guard)
            .expect("mysql")
            .exec("UPDATE app_held SET v = ? WHERE k = 'held'", ("4096",))
            .exec("INSERT INTO app_held VALUES (?, ?)", ("done", "7"))
            .commit()
            .await
            .expect("held");
        assert_eq!(rows, [1, 1]);
        assert_eq!(store.value("held").await.as_deref(), Some("4096"));
        assert_eq!(store.value("done").await.as_deref(), Some("7"));

        // The insert fails (the key exists): the update before it is not applied.
        let refused = HeldTransaction::of(&guard)
            .expect("mysql")
            .exec("UPDATE app_held SET v = ? WHERE k = 'held'", ("8192",))
            .exec("INSERT INTO app_held VALUES (?, ?)", ("done", "8"))
            .commit()
            .await;
        match refused {
            Err(error @ dlock::Error::Engine { .. }) => {
                let message = error.to_string();
                assert!(
                    message.contains("statement 1") && message.contains("1062"),
                    "{message}"
                );
            }
            other => panic!("expected the engine's error, got {other:?}"),
        }
        assert_eq!(store.value("held").await.as_deref(), Some("4096"));
        let held = guard.held().clone();
        guard.release().await.expect("release");
        let late = HeldTransaction::of(&held)
            .expect("mysql")
            .exec("UPDATE app_held SET v = ? WHERE k = 'held'", ("late",))
            .commit()
            .await;
        assert!(
            matches!(late, Err(dlock::Error::Lost { .. })),
            "after release: {late:?}"
        );

        let (first, second) = (lock.read().await.expect("read"), lock.read().await.expect("read"));
        for (reader, value) in [(&first, "first"), (&second, "second")] {
            let rows = HeldTransaction::of(reader)
                .expect("mysql")
                .exec("UPDATE app_held SET v = ? WHERE k = 'done'", (value,))
                .commit()
                .await
                .expect("a reader writes");
            assert_eq!(rows, [1]);
        }
        assert_eq!(store.value("done").await.as_deref(), Some("second"));
        // Forced out: the rows are gone, and so is the gate's condition.
        let operator =
            Registry::with_engine("op", dlock_testkit::engine(&mysql).await, settings).expect("registry");
        let forced = operator.locks("held").get("statements").force_release().await;
        assert!(forced.expect("force release") >= 1);
        let after = HeldTransaction::of(&first)
            .expect("mysql")
            .exec("UPDATE app_held SET v = ? WHERE k = 'done'", ("forced",))
            .commit()
            .await;
        assert!(
            matches!(
                after,
                Err(dlock::Error::Lost {
                    reason: LostReason::ForceReleased,
                    ..
                })
            ),
            "forced out: {after:?}"
        );
        assert_eq!(store.value("done").await.as_deref(), Some("second"));
        drop((first, second));

        let permit = registry
            .locks("held")
            .semaphore("pool", 2)
            .acquire()
            .await
            .expect("permit");
        HeldTransaction::of(&permit)
            .expect("mysql")
            .exec("UPDATE app_held SET v = ? WHERE k = 'held'", ("mine",))
            .commit()
            .await
            .expect("permit writes");
        let held = permit.held().clone();
        permit.release().await.expect("release");
        let late = HeldTransaction::of(&held)
            .expect("mysql")
            .exec("UPDATE app_held SET v = ? WHERE k = 'held'", ("late",))
            .commit()
            .await;
        assert!(
            matches!(late, Err(dlock::Error::Lost { .. })),
            "after release: {late:?}"
        );
        assert_eq!(store.value("held").await.as_deref(), Some("mine"));
    }
}
