//! Fenced updates of a PostgreSQL table, through `tokio-postgres`
//! (feature `fenced-postgres`, [`FencedTable::update`]) or `sqlx`
//! (feature `fenced-sqlx`, [`FencedTable::update_sqlx`]).
//!
//! The table gets a fence column ([`FENCE_COLUMN`] unless you name
//! another), added by [`FencedTable::migration`]:
//!
//! ```sql
//! ALTER TABLE "accounts" ADD COLUMN IF NOT EXISTS "dlock_fence" bigint NOT NULL DEFAULT 0
//! ```
//!
//! A fenced update applies your `SET` only where the row's fence is not
//! above the token, raises the fence to the token, and says which of
//! "applied", "stale" ([`FenceError::Stale`]) or "no such row"
//! ([`FenceError::NoSuchRow`]) happened, all in one statement
//! ([`FencedTable::sql`]):
//!
//! ```sql
//! WITH updated AS (
//!     UPDATE "accounts" SET balance = $1, "dlock_fence" = $3
//!     WHERE "id" = $2 AND "dlock_fence" <= $3 RETURNING 1),
//! current AS (SELECT "dlock_fence" FROM "accounts" WHERE "id" = $2 FOR SHARE)
//! SELECT (SELECT count(*) FROM updated), (SELECT "dlock_fence" FROM current)
//! ```
//!
//! One statement, because a check then an update lets a later holder's
//! write in between, and an update then a look cannot tell a stale token
//! from a missing row when another writer changes the row in between. The
//! look takes the row `FOR SHARE` so that, under `READ COMMITTED`, it reads
//! the fence a concurrent writer committed, not the statement's snapshot.
//!
//! To read a value that a later write depends on, raise the fence first:
//! an update with an empty `set` does only that (the [`fenced`](super)
//! module says why).
//!
//! For a permit, key the row by the slot ([`Token::slot`]) as well: each
//! slot's rows are fenced by that slot's tokens alone.

use super::{FenceError, Token};

/// The fence column's name unless [`FencedTable::fence_column`] names another.
pub const FENCE_COLUMN: &str = "dlock_fence";

/// A table whose rows are fenced, found by one key column. The names are
/// identifiers, quoted as such in every statement; values always go as
/// parameters.
#[derive(Clone, Debug)]
pub struct FencedTable {
    table: String,
    key: String,
    fence: String,
}

impl FencedTable {
    /// The table `table` (in the search path), its rows found by column
    /// `key`, fenced by [`FENCE_COLUMN`].
    pub fn new(table: &str, key: &str) -> Self {
        FencedTable {
            table: quote(table),
            key: quote(key),
            fence: quote(FENCE_COLUMN),
        }
    }

    /// The table `table` of schema `schema`.
    pub fn in_schema(schema: &str, table: &str, key: &str) -> Self {
        FencedTable {
            table: format!("{}.{}", quote(schema), quote(table)),
            ..Self::new(table, key)
        }
    }

    /// Fences by column `column` rather than [`FENCE_COLUMN`].
    pub fn fence_column(self, column: &str) -> Self {
        FencedTable {
            fence: quote(column),
            ..self
        }
    }

    /// The statement that adds the fence column (if missing): `bigint NOT
    /// NULL DEFAULT 0`, so existing rows take any first token.
    pub fn migration(&self) -> String {
        format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} bigint NOT NULL DEFAULT 0",
            self.table, self.fence
        )
    }

    /// The fenced update's statement, for a `set` clause (`balance = $1`)
    /// using the first `params` parameters: the key is parameter
    /// `params + 1`, the token `params + 2`. It answers one row: how many
    /// rows it updated (`bigint`) and the row's fence (`bigint`, `NULL` if
    /// no row has the key, and not looked at when one was updated). An
    /// empty `set` only raises the fence: a fenced read's first step.
    pub fn sql(&self, set: &str, params: usize) -> String {
        let (table, key, fence) = (&self.table, &self.key, &self.fence);
        let (key_param, token_param) = (params + 1, params + 2);
        let set = match set.trim() {
            "" => String::new(),
            set => format!("{set}, "),
        };
        format!(
            "WITH updated AS (UPDATE {table} SET {set}{fence} = ${token_param} \
             WHERE {key} = ${key_param} AND {fence} <= ${token_param} RETURNING 1), \
             current AS (SELECT {fence} FROM {table} WHERE {key} = ${key_param} FOR SHARE) \
             SELECT (SELECT count(*) FROM updated), (SELECT {fence} FROM current)"
        )
    }
}

/// `name` as a PostgreSQL quoted identifier: in double quotes, each
/// double quote doubled.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The token as a `bigint`.
fn bigint<E: std::fmt::Debug + std::fmt::Display>(token: Token) -> Result<i64, FenceError<E>> {
    i64::try_from(token.fence).map_err(|_| FenceError::TooLarge(token.fence))
}

/// What [`FencedTable::sql`]'s answer means.
fn outcome<E: std::fmt::Debug + std::fmt::Display>(
    token: Token,
    updated: i64,
    seen: Option<i64>,
) -> Result<(), FenceError<E>> {
    match (updated, seen) {
        (0, None) => Err(FenceError::NoSuchRow),
        (0, Some(seen)) => Err(FenceError::Stale {
            token: token.fence,
            // The column is the user's: a negative fence is below any token.
            seen: u64::try_from(seen).unwrap_or(0),
        }),
        _ => Ok(()),
    }
}

#[cfg(feature = "fenced-postgres")]
impl FencedTable {
    /// Runs `UPDATE <table> SET <set>` on the row whose key is `key`, only
    /// if its fence is not above `token`, and raises the fence to it.
    /// `set` uses `params` as `$1`, `$2`, ...
    ///
    /// ```no_run
    /// # async fn pay(client: &tokio_postgres::Client, guard: &dlock::Guard) -> Result<(), Box<dyn std::error::Error>> {
    /// use dlock::fenced::{FenceError, Token, postgres::FencedTable};
    ///
    /// let accounts = FencedTable::new("accounts", "id");
    /// client.batch_execute(&accounts.migration()).await?; // once
    /// match accounts.update(client, "balance = balance - $1", &[&100_i64], &42_i64, Token::of(guard)).await {
    ///     Ok(()) => {}
    ///     Err(FenceError::Stale { .. }) => { /* a later holder has written: stop */ }
    ///     Err(other) => return Err(other.into()),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn update(
        &self,
        client: &impl tokio_postgres::GenericClient,
        set: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        key: &(dyn tokio_postgres::types::ToSql + Sync),
        token: Token,
    ) -> Result<(), FenceError<tokio_postgres::Error>> {
        let fence = bigint(token)?;
        let mut all = params.to_vec();
        all.extend([key, &fence]);
        let row = client
            .query_one(&self.sql(set, params.len()), &all)
            .await
            .map_err(FenceError::Storage)?;
        let (updated, seen) = (
            row.try_get(0).map_err(FenceError::Storage)?,
            row.try_get(1).map_err(FenceError::Storage)?,
        );
        outcome(token, updated, seen)
    }
}

#[cfg(feature = "fenced-sqlx")]
impl FencedTable {
    /// [`update`](Self::update)'s statement through `sqlx`: `set` uses
    /// `params`, the key and the token are added after them.
    ///
    /// ```no_run
    /// # async fn pay(pool: &sqlx::PgPool, guard: &dlock::Guard) -> Result<(), dlock::BoxError> {
    /// use dlock::fenced::{Token, postgres::FencedTable};
    /// use sqlx::Arguments;
    ///
    /// let accounts = FencedTable::new("accounts", "id");
    /// let mut params = sqlx::postgres::PgArguments::default();
    /// params.add(100_i64)?;
    /// accounts.update_sqlx(pool, "balance = balance - $1", params, 42_i64, Token::of(guard)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn update_sqlx<'c, K>(
        &self,
        executor: impl sqlx::Executor<'c, Database = sqlx::Postgres>,
        set: &str,
        mut params: sqlx::postgres::PgArguments,
        key: K,
        token: Token,
    ) -> Result<(), FenceError<sqlx::Error>>
    where
        K: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + 'static,
    {
        use sqlx::{Arguments, Row};

        let fence = bigint(token)?;
        let sql = self.sql(set, params.len());
        let encoding = |e| FenceError::Storage(sqlx::Error::Encode(e));
        params.add(key).map_err(encoding)?;
        params.add(fence).map_err(encoding)?;
        let row = sqlx::query_with(&sql, params)
            .fetch_one(executor)
            .await
            .map_err(FenceError::Storage)?;
        let (updated, seen) = (
            row.try_get(0).map_err(FenceError::Storage)?,
            row.try_get(1).map_err(FenceError::Storage)?,
        );
        outcome(token, updated, seen)
    }
}
