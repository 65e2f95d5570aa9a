//! A small TCP service whose handlers are guarded by `#[distributed_lock]`.
//!
//! Protocol, one line each: `PAY <account> <cents>` answers `OK <balance>` or
//! `ERR <reason>`; `BALANCE <account>` answers `OK <balance>`. Payments on one
//! account are serialised by a write lock per account; balance reads share a
//! read lock. The ledger rejects any write whose fencing token is older than
//! the last one it accepted, so even a holder that lost its lock mid-write
//! cannot corrupt it.
//!
//! Run alone, it serves on 127.0.0.1, drives itself with 50 clients making
//! 20 payments of 1 each against a balance of 500, and checks that exactly
//! 500 succeed:
//!
//! ```text
//! cargo run --release -p dlock-examples --example order_service [-- --config dlock.toml]
//! ```

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use dlock::distributed_lock;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug)]
enum ServiceError {
    Lock(dlock::Error),
    Insufficient { balance: i64 },
    StaleFence,
}

impl From<dlock::Error> for ServiceError {
    fn from(e: dlock::Error) -> Self {
        ServiceError::Lock(e)
    }
}

/// Storage that takes a write only with a fence newer than the last one.
#[derive(Default)]
struct Ledger {
    accounts: Mutex<HashMap<u64, (i64, u64)>>,
}

impl Ledger {
    fn read(&self, account: u64) -> i64 {
        self.accounts
            .lock()
            .unwrap()
            .get(&account)
            .map_or(500, |(balance, _)| *balance)
    }

    fn write(&self, account: u64, balance: i64, fence: u64) -> Result<(), ServiceError> {
        let mut accounts = self.accounts.lock().unwrap();
        let entry = accounts.entry(account).or_insert((500, 0));
        if fence <= entry.1 {
            return Err(ServiceError::StaleFence);
        }
        *entry = (balance, fence);
        Ok(())
    }
}

#[distributed_lock(group = "account", key = "<account>", wait = "10s")]
async fn pay(ledger: &Ledger, account: u64, cents: i64) -> Result<i64, ServiceError> {
    let balance = ledger.read(account);
    tokio::task::yield_now().await; // a real service would await its database here
    if balance < cents {
        return Err(ServiceError::Insufficient { balance });
    }
    ledger.write(
        account,
        balance - cents,
        dlock::fence().expect("inside a locked fn"),
    )?;
    Ok(balance - cents)
}

#[distributed_lock(group = "account", key = "<account>", mode = "read")]
async fn balance(ledger: &Ledger, account: u64) -> Result<i64, ServiceError> {
    Ok(ledger.read(account))
}

async fn answer(ledger: &Ledger, line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let result = match words.as_slice() {
        ["PAY", account, cents] => match (account.parse(), cents.parse()) {
            (Ok(account), Ok(cents)) => pay(ledger, account, cents).await,
            _ => return "ERR bad number\n".into(),
        },
        ["BALANCE", account] => match account.parse() {
            Ok(account) => balance(ledger, account).await,
            Err(_) => return "ERR bad number\n".into(),
        },
        _ => return "ERR unknown command\n".into(),
    };
    match result {
        Ok(balance) => format!("OK {balance}\n"),
        Err(ServiceError::Insufficient { balance }) => format!("ERR insufficient funds ({balance})\n"),
        Err(ServiceError::StaleFence) => "ERR stale fencing token\n".into(),
        Err(ServiceError::Lock(e)) => format!("ERR {e}\n"),
    }
}

async fn serve(listener: TcpListener, ledger: Arc<Ledger>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let ledger = ledger.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if write
                    .write_all(answer(&ledger, &line).await.as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
    }
}

/// One client: `payments` payments of 1 cent on account 7; returns how many succeeded.
async fn client(address: std::net::SocketAddr, payments: u32) -> std::io::Result<u32> {
    let stream = TcpStream::connect(address).await?;
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut ok = 0;
    for _ in 0..payments {
        write.write_all(b"PAY 7 1\n").await?;
        let reply = lines.next_line().await?.unwrap_or_default();
        ok += u32::from(reply.starts_with("OK"));
    }
    Ok(ok)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, path] = args.as_slice()
        && flag == "--config"
        && let Err(e) = dlock::init_from_file(path).await
    {
        eprintln!("order_service: {e}");
        return ExitCode::from(2);
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let address = listener.local_addr().expect("address");
    let ledger = Arc::new(Ledger::default());
    tokio::spawn(serve(listener, ledger.clone()));

    let clients: Vec<_> = (0..50).map(|_| tokio::spawn(client(address, 20))).collect();
    let mut paid = 0;
    for c in clients {
        paid += c.await.expect("client panicked").expect("client i/o");
    }
    let left = ledger.read(7);
    println!(
        "payments_ok={paid} payments_refused={} balance={left}",
        1000 - paid
    );
    if paid == 500 && left == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
