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
//! the end `done=D timed_out=T deadlocks=K refused=R failed=F` and `net
//! <i>=<change>...`, the change it made to each account; `deadlocks`
//! counts transfers given up as a cycle's youngest wait.
//!
//! `--ring <i>/<n>` makes one move instead, from account `i` to account
//! `(i + 1) % n`, in nested attribute calls, asking for the payee's lock
//! only once every account of the ring is held: the workers of a ring of
//! `n` deadlock. Prints `ring done <ms>` or `ring gave-up <ms> <cycle>`,
//! `<ms>` the wait for the payee's lock.

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

/// The payer's lock, then inside it, `--hold-ms` later (or once the
/// whole ring is held), the payee's.
#[distributed_lock(group = "account", key = "<from>")]
async fn in_written_order(
    bank: &Bank,
    from: usize,
    to: usize,
    amount: u64,
    ring: Option<usize>,
) -> Result<Outcome, dlock::Error> {
    match ring {
        Some(n) => {
            every_account_held(n).await?;
            let _ = ASKED.set(std::time::Instant::now());
        }
        None => tokio::time::sleep(bank.hold).await,
    }
    to_the_payee(bank, from, to, amount).await
}

#[distributed_lock(group = "account", key = "<to>")]
async fn to_the_payee(bank: &Bank, from: usize, to: usize, amount: u64) -> Result<Outcome, dlock::Error> {
    move_money(bank, from, to, amount).await
}

/// When a ring's worker asked for the payee's lock.
static ASKED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Until each of accounts `0..n` has a holder, by the records.
async fn every_account_held(n: usize) -> Result<(), dlock::Error> {
    let accounts = dlock::locks("account");
    loop {
        let mut held = 0;
        for i in 0..n {
            held += usize::from(!accounts.get(i.to_string()).inspect().await?.holders.is_empty());
        }
        if held == n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
        &["accounts", "transfers", "seed", "hold-ms", "order", "ring"],
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
    if let Some((i, n)) = flags.text("ring", "").split_once('/') {
        let (i, n): (usize, usize) = (i.parse().expect("--ring i/n"), n.parse().expect("--ring i/n"));
        let answer = in_written_order(&bank, i, (i + 1) % n, 1, Some(n)).await;
        let waited = ASKED.get().map_or(0, |asked| asked.elapsed().as_millis());
        match answer {
            Ok(_) => println!("ring done {waited}"),
            Err(dlock::Error::Deadlock { cycle, .. }) => println!("ring gave-up {waited} {cycle}"),
            Err(e) => {
                eprintln!("transfer_worker: {e}");
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    let seed = flags.number("seed", 1);
    let mut draws = Draws(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut net = vec![0i64; accounts as usize];
    let (mut done, mut timed_out, mut deadlocks, mut refused, mut failed) = (0, 0, 0, 0, 0);
    for _ in 0..transfers {
        let from = draws.below(accounts) as usize;
        let to = (from + 1 + draws.below(accounts - 1) as usize) % accounts as usize;
        let amount = 1 + draws.below(10);
        let outcome = if written {
            in_written_order(&bank, from, to, amount, None).await
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
            Err(dlock::Error::Deadlock { .. }) => deadlocks += 1,
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
    println!("done={done} timed_out={timed_out} deadlocks={deadlocks} refused={refused} failed={failed}");
    ExitCode::SUCCESS
}
