//! The fault suite's transfer worker (tests/faults.rs starts several):
//! moves money between accounts, each transfer under the two accounts'
//! locks, each account a fenced store.
//!
//! ```text
//! transfer_worker --config dlock.toml --store <accounts> --accounts 10
//!                 --transfers 500 --seed 1 [--hold-ms 1] [--order set|written]
//! ```
//!
//! Account `i` is the store `<accounts>-<i>`, under lock `account/<i>`.
//! Transfers go between random accounts in random directions (from
//! `--seed`). `--order set` takes both locks as one set
//! (`#[distributed_lock(keys = [..])]`); `--order written` takes them by
//! hand, the payer's first, holding it `--hold-ms` before asking for the
//! payee's: the order that deadlocks. Prints `ready` once connected, and at
//! the end `done=D timed_out=T refused=R failed=F` and `net <i>=<change>...`,
//! the change it made to each account.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use dlock::distributed_lock;
use dlock_testkit::store::FencedStore;
use dlock_testkit::worker_flags::Flags;

struct Bank {
    accounts: Vec<FencedStore>,
    hold: Duration,
}

enum Outcome {
    Done,
    Refused,
}

/// Moves `amount` from account `from` to account `to`, under both locks,
/// each store shown its own lock's fence.
async fn move_money(bank: &Bank, from: usize, to: usize, amount: u64) -> Result<Outcome, dlock::Error> {
    let fence = |account: usize| {
        dlock::held_lock("account", &account.to_string())
            .expect("held")
            .fence()
    };
    let (payer, payee) = (&bank.accounts[from], &bank.accounts[to]);
    let (pay_fence, get_fence) = (fence(from), fence(to));
    payer.mark(pay_fence, "enter");
    payee.mark(get_fence, "enter");
    let outcome = async {
        let (Ok(paying), Ok(getting)) = (payer.read(pay_fence), payee.read(get_fence)) else {
            return Outcome::Refused;
        };
        tokio::time::sleep(bank.hold).await;
        match (
            payer.write(pay_fence, paying - amount),
            payee.write(get_fence, getting + amount),
        ) {
            (Ok(()), Ok(())) => Outcome::Done,
            _ => Outcome::Refused,
        }
    }
    .await;
    payer.mark(pay_fence, "exit");
    payee.mark(get_fence, "exit");
    Ok(outcome)
}

#[distributed_lock(group = "account", keys = ["<from>", "<to>"])]
async fn in_one_set(bank: &Bank, from: usize, to: usize, amount: u64) -> Result<Outcome, dlock::Error> {
    move_money(bank, from, to, amount).await
}

async fn in_written_order(bank: &Bank, from: usize, to: usize, amount: u64) -> Result<Outcome, dlock::Error> {
    let accounts = dlock::locks("account");
    let payer = accounts.get(from.to_string()).lock().await?;
    tokio::time::sleep(bank.hold).await;
    let payee = accounts.get(to.to_string()).lock().await?;
    let outcome = move_money(bank, from, to, amount).await;
    payee.release().await?;
    payer.release().await?;
    outcome
}

/// xorshift64*: the same transfers for the same seed, no dependency.
struct Draws(u64);

impl Draws {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = match Flags::parse(
        "transfer_worker",
        &["accounts", "transfers", "seed", "hold-ms", "order"],
    ) {
        Ok(flags) => flags,
        Err(code) => return code,
    };
    if let Err(code) = flags.connect().await {
        return code;
    }
    let (accounts, transfers) = (flags.number("accounts", 10), flags.number("transfers", 1));
    let written = flags.text("order", "set") == "written";
    let prefix = flags.store().display().to_string();
    let bank = Bank {
        accounts: (0..accounts)
            .map(|i| FencedStore::open(&PathBuf::from(format!("{prefix}-{i}"))))
            .collect(),
        hold: Duration::from_millis(flags.number("hold-ms", 1)),
    };
    let seed = flags.number("seed", 1);
    let mut draws = Draws(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut net = vec![0i64; accounts as usize];
    let (mut done, mut timed_out, mut refused, mut failed) = (0, 0, 0, 0);
    for _ in 0..transfers {
        let from = draws.below(accounts) as usize;
        let to = (from + 1 + draws.below(accounts - 1) as usize) % accounts as usize;
        let amount = 1 + draws.below(10);
        let outcome = if written {
            in_written_order(&bank, from, to, amount).await
        } else {
            in_one_set(&bank, from, to, amount).await
        };
        match outcome {
            Ok(Outcome::Done) => {
                done += 1;
                net[from] -= amount as i64;
                net[to] += amount as i64;
            }
            Ok(Outcome::Refused) => refused += 1,
            Err(dlock::Error::Timeout { .. }) => timed_out += 1,
            Err(e) => {
                eprintln!("transfer_worker: {e}");
                failed += 1;
            }
        }
        println!("transferred");
        let _ = std::io::stdout().flush();
    }
    let changes: Vec<String> = net.iter().enumerate().map(|(i, n)| format!("{i}={n}")).collect();
    println!("net {}", changes.join(" "));
    println!("done={done} timed_out={timed_out} refused={refused} failed={failed}");
    ExitCode::SUCCESS
}
