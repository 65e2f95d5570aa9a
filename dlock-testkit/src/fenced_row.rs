//! The random fault run's second store: one row of a real PostgreSQL
//! table, read and written through `dlock::fenced`'s adapter. A worker
//! reads the row's value, and later writes it back plus one, both fenced
//! by its token, counting the write in the same statement: while fences
//! keep stale holders out, the value equals the count of writes; a stale
//! holder's write let through would lose an update, and the two would
//! part.

use dlock::fenced::Token;
use dlock::fenced::postgres::FencedTable;
use tokio_postgres::{Client, NoTls};

/// The row, as a worker or the run sees it.
pub struct FencedRow {
    client: Client,
    table: FencedTable,
    name: String,
}

impl FencedRow {
    /// Connects to the PostgreSQL at `url`, to the table `name`.
    pub async fn open(url: &str, name: &str) -> Self {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .expect("the table's server");
        tokio::spawn(connection);
        let table = FencedTable::new(name, "id");
        FencedRow {
            client,
            table,
            name: name.to_owned(),
        }
    }

    /// Makes the table `name` at `url`, fenced, with its one row at 0.
    pub async fn create(url: &str, name: &str) -> Self {
        let row = Self::open(url, name).await;
        let create = format!(
            "DROP TABLE IF EXISTS \"{name}\"; CREATE TABLE \"{name}\" (id int PRIMARY KEY, value bigint NOT NULL, writes bigint NOT NULL); \
             {}; INSERT INTO \"{name}\" VALUES (1, 0, 0)",
            row.table.migration()
        );
        row.client.batch_execute(&create).await.expect("the table");
        row
    }

    /// The row's value, read after raising its fence to `fence`; `None`
    /// if a later holder has raised it past. Fenced, because a holder
    /// that took over and read before a stale holder's write landed would
    /// otherwise write after it, and both writes would count.
    pub async fn read(&self, fence: u64) -> Option<i64> {
        let token = Token { fence, slot: None };
        if !applied(self.table.update(&self.client, "", &[], &1_i32, token).await) {
            return None;
        }
        let sql = format!("SELECT value FROM \"{}\" WHERE id = 1", self.name);
        Some(self.client.query_one(&sql, &[]).await.expect("read").get(0))
    }

    /// Writes `value` and counts the write, if `fence` is not below the
    /// greatest the row has seen; `false` if it is.
    pub async fn write(&self, value: i64, fence: u64) -> bool {
        let token = Token { fence, slot: None };
        let set = "value = $1, writes = writes + 1";
        applied(
            self.table
                .update(&self.client, set, &[&value], &1_i32, token)
                .await,
        )
    }

    /// The row's value and its count of writes.
    pub async fn totals(&self) -> (i64, i64) {
        let sql = format!("SELECT value, writes FROM \"{}\" WHERE id = 1", self.name);
        let row = self.client.query_one(&sql, &[]).await.expect("read");
        (row.get(0), row.get(1))
    }
}

/// Whether a fenced statement applied: `false` if its token was stale.
fn applied(outcome: Result<(), dlock::fenced::FenceError<tokio_postgres::Error>>) -> bool {
    match outcome {
        Ok(()) => true,
        Err(dlock::fenced::FenceError::Stale { .. }) => false,
        Err(other) => panic!("the fenced row: {other}"),
    }
}
