//! The floor and the `dynamodb-lease` crate, as the other side of
//! benches/dynamodb.rs. Reads commands on stdin, answers one line each:
//!
//! - `floor N`: N cycles of the least lock DynamoDB allows: a `PutItem` if
//!   the item is absent, a `DeleteItem` if it still holds this owner;
//!   answers `ns <total>`;
//! - `floor-units N`: the same, asking each request for the capacity it
//!   consumed; answers `units <total>`;
//! - `lease N`: N uncontended `dynamodb-lease` acquire + release cycles;
//!   answers `ns <total>`;
//! - `lease-handoff CLIENTS ROUNDS`: CLIENTS tasks, each its own client,
//!   take one lease ROUNDS times each; answers `handoffs_ns <each time
//!   from a release to the next acquisition>`.
//!
//! - `contend poll|queue CLIENTS RUN_MS`: CLIENTS tasks, each its own
//!   client, take one lock again and again for RUN_MS, by one of two
//!   protocols on the lock's item, each waiter trying after pauses that
//!   double from 10 to 200 ms (dlock's default): `poll`, a conditional
//!   write that whoever tries first after a release wins (no queue, what
//!   the engine does); `queue`, a waiter list in the item that a waiter
//!   joins with one conditional append and takes the lock from when it is
//!   first and the lock is free, read first (a consistent read), then
//!   taken and popped in one conditional write; a waiter pauses 10 ms
//!   for each place it has in line. Answers `contend <handoff
//!   p50 ns> <fewest acquisitions of one task> <most> <all> <capacity
//!   units per acquisition × 100>`.
//!
//! Usage: `dynamodb-peer <endpoint>`; tables `bench-floor` and `bench-lease`
//! are made if missing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ReturnConsumedCapacity,
    ScalarAttributeType, TimeToLiveSpecification,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const FLOOR: &str = "bench-floor";
const LEASES: &str = "bench-lease";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let endpoint = std::env::args().nth(1).expect("usage: dynamodb-peer <endpoint>");
    let client = client(&endpoint);
    for (table, key) in [(FLOOR, "pk"), (LEASES, "key")] {
        make_table(&client, table, key).await;
    }
    // dynamodb-lease checks that its expiry is the table's time to live.
    let ttl = TimeToLiveSpecification::builder()
        .attribute_name("lease_expiry")
        .enabled(true)
        .build()
        .expect("ttl");
    let set = client
        .update_time_to_live()
        .table_name(LEASES)
        .time_to_live_specification(ttl)
        .send()
        .await;
    if let Err(e) = set {
        let e = e.into_service_error();
        assert!(e.to_string().contains("already enabled"), "time to live: {e}");
    }
    let lease = lease_client(client.clone()).await;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await.expect("stdin") {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| words[i].parse::<usize>().expect("a number");
        let answer = match words[0] {
            "floor" => format!("ns {}", floor(&client, number(1), false).await.0),
            "floor-units" => format!("units {}", floor(&client, number(1), true).await.1.round() as u64),
            "lease" => {
                let started = Instant::now();
                for _ in 0..number(1) {
                    let held = lease.acquire("uncontended").await.expect("acquire");
                    held.release().await.expect("release");
                }
                format!("ns {}", started.elapsed().as_nanos())
            }
            "contend" => {
                let queued = words[1] == "queue";
                let run = Duration::from_millis(number(3) as u64);
                let (handoff, counts, units) = contend(&endpoint, queued, number(2), run).await;
                let (fewest, most) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                let all: usize = counts.iter().sum();
                format!(
                    "contend {handoff} {fewest} {most} {all} {}",
                    (units * 100.0 / all as f64) as u64
                )
            }
            "lease-handoff" => {
                let times = lease_handoffs(&endpoint, number(1), number(2)).await;
                let times: Vec<String> = times.iter().map(u128::to_string).collect();
                format!("handoffs_ns {}", times.join(" "))
            }
            other => panic!("unknown command {other:?}"),
        };
        out.write_all(format!("{answer}\n").as_bytes())
            .await
            .expect("stdout");
        out.flush().await.expect("stdout");
    }
}

fn client(endpoint: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("dlock", "dlock-test", None, None, "bench"))
        .build();
    Client::from_conf(config)
}

async fn make_table(client: &Client, table: &str, key: &str) {
    let made = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .expect("key"),
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("attribute"),
        )
        .send()
        .await;
    if let Err(e) = made {
        let e = e.into_service_error();
        assert!(e.is_resource_in_use_exception(), "create {table}: {e}");
    }
}

async fn lease_client(client: Client) -> dynamodb_lease::Client {
    dynamodb_lease::Client::builder()
        .table_name(LEASES)
        .lease_ttl_seconds(10)
        // Its default waits a second between tries.
        .acquire_cooldown(Duration::from_millis(10))
        .build_and_check_db(client)
        .await
        .expect("dynamodb-lease")
}

/// `n` cycles of the floor: their time in ns and, if `counted`, the
/// capacity they consumed.
async fn floor(client: &Client, n: usize, counted: bool) -> (u128, f64) {
    let spent = counted.then_some(ReturnConsumedCapacity::Total);
    let (mut units, started) = (0.0, Instant::now());
    for _ in 0..n {
        let put = client
            .put_item()
            .table_name(FLOOR)
            .item("pk", AttributeValue::S("floor".into()))
            .item("o", AttributeValue::S("0123456789abcdef0123456789abcdef".into()))
            .condition_expression("attribute_not_exists(pk)")
            .set_return_consumed_capacity(spent.clone())
            .send()
            .await
            .expect("the floor's lock is free");
        let delete = client
            .delete_item()
            .table_name(FLOOR)
            .key("pk", AttributeValue::S("floor".into()))
            .condition_expression("o = :o")
            .expression_attribute_values(":o", AttributeValue::S("0123456789abcdef0123456789abcdef".into()))
            .set_return_consumed_capacity(spent.clone())
            .send()
            .await
            .expect("the floor's lock is its own");
        units += self::units(put.consumed_capacity()) + self::units(delete.consumed_capacity());
    }
    (started.elapsed().as_nanos(), units)
}

/// `clients` clients, each its own SDK client, take one lease `rounds`
/// times each: every time from a release to the next acquisition.
async fn lease_handoffs(endpoint: &str, clients: usize, rounds: usize) -> Vec<u128> {
    let released: Arc<Mutex<(Option<Instant>, Vec<u128>)>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (lease, released) = (lease_client(client(endpoint)).await, released.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let held = lease.acquire("handoff").await.expect("acquire");
                {
                    let mut state = released.lock().unwrap();
                    if let Some(at) = state.0.take() {
                        let took = at.elapsed().as_nanos();
                        state.1.push(took);
                    }
                    state.0 = Some(Instant::now());
                }
                held.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("client");
    }
    let times = std::mem::take(&mut released.lock().unwrap().1);
    times
}

/// Handoffs and acquisitions of `clients` tasks contending for `run`, by
/// the poll or the queue protocol (see the module docs): the median
/// handoff in ns, each task's count, and the capacity units consumed (a
/// refused write counted as one, as DynamoDB bills it).
async fn contend(endpoint: &str, queued: bool, clients: usize, run: Duration) -> (u128, Vec<usize>, f64) {
    let key = if queued { "queue" } else { "poll" };
    let shared: Arc<Mutex<(Option<Instant>, Vec<u128>, f64)>> = Arc::default();
    let stop = Instant::now() + run;
    let mut tasks = Vec::new();
    for task in 0..clients {
        let (client, shared) = (client(endpoint), shared.clone());
        tasks.push(tokio::spawn(async move {
            let me = AttributeValue::S(format!("{task}"));
            let mut got = 0;
            let spend = |units: f64| shared.lock().unwrap().2 += units;
            while Instant::now() < stop {
                if queued {
                    let joined = client
                        .update_item()
                        .table_name(FLOOR)
                        .key("pk", AttributeValue::S(key.into()))
                        .update_expression("SET q = list_append(if_not_exists(q, :empty), :me)")
                        .expression_attribute_values(":empty", AttributeValue::L(vec![]))
                        .expression_attribute_values(":me", AttributeValue::L(vec![me.clone()]))
                        .return_consumed_capacity(ReturnConsumedCapacity::Total)
                        .send()
                        .await
                        .expect("join");
                    spend(units(joined.consumed_capacity()));
                }
                let mut pause = Duration::from_millis(10);
                loop {
                    if queued {
                        let read = client
                            .get_item()
                            .table_name(FLOOR)
                            .key("pk", AttributeValue::S(key.into()))
                            .consistent_read(true)
                            .return_consumed_capacity(ReturnConsumedCapacity::Total)
                            .send()
                            .await
                            .expect("read");
                        spend(units(read.consumed_capacity()));
                        let item = read.item.unwrap_or_default();
                        let line = item
                            .get("q")
                            .and_then(|q| q.as_l().ok())
                            .cloned()
                            .unwrap_or_default();
                        let first = line.first().cloned();
                        // 10 ms a place ahead in line: the next tries every 10 ms.
                        if let Some(place) = line.iter().position(|waiter| *waiter == me) {
                            pause = Duration::from_millis(10 * (place as u64 + 1))
                                .min(Duration::from_millis(200))
                                / 2;
                        }
                        if first.as_ref() == Some(&me) && !item.contains_key("w") {
                            match write(
                                &client,
                                key,
                                &me,
                                "SET w = :me REMOVE q[0]",
                                "q[0] = :me AND attribute_not_exists(w)",
                            )
                            .await
                            {
                                Some(spent) => {
                                    spend(spent);
                                    break;
                                }
                                None => spend(1.0),
                            }
                        }
                    } else {
                        match write(&client, key, &me, "SET w = :me", "attribute_not_exists(w)").await {
                            Some(spent) => {
                                spend(spent);
                                break;
                            }
                            None => spend(1.0),
                        }
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                {
                    let mut state = shared.lock().unwrap();
                    if let Some(at) = state.0.take() {
                        let took = at.elapsed().as_nanos();
                        state.1.push(took);
                    }
                    state.0 = Some(Instant::now());
                }
                got += 1;
                let released = write(&client, key, &me, "REMOVE w", "w = :me").await;
                spend(released.expect("release"));
            }
            got
        }));
    }
    let mut counts = Vec::new();
    for task in tasks {
        counts.push(task.await.expect("client"));
    }
    let mut state = shared.lock().unwrap();
    state.1.sort();
    let handoff = state.1.get(state.1.len() / 2).copied().unwrap_or(0);
    (handoff, counts, state.2)
}

/// One conditional update of the lock's item `key` with `:me` bound to
/// `me`: the capacity it consumed, or `None` if its condition refused it.
async fn write(
    client: &Client,
    key: &str,
    me: &AttributeValue,
    update: &str,
    condition: &str,
) -> Option<f64> {
    let done = client
        .update_item()
        .table_name(FLOOR)
        .key("pk", AttributeValue::S(key.into()))
        .update_expression(update)
        .condition_expression(condition)
        .expression_attribute_values(":me", me.clone())
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    match done {
        Ok(done) => Some(units(done.consumed_capacity())),
        Err(e) => {
            let e = e.into_service_error();
            assert!(e.is_conditional_check_failed_exception(), "{key}: {e}");
            None
        }
    }
}

fn units(spent: Option<&aws_sdk_dynamodb::types::ConsumedCapacity>) -> f64 {
    spent.and_then(|c| c.capacity_units()).unwrap_or(0.0)
}
