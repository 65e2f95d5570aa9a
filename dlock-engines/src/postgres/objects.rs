//! The engine's database objects, the fence sequence, the record table and
//! the table of holds forced out: made on first use, or a startup error
//! that says which privilege is missing.

use dlock_core::Error;
use dlock_core::kit::EngineError;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::server::{Server, failed};

/// The objects' names, quoted for the statements.
pub(super) struct Objects {
    /// The fence sequence, as a SQL literal for `nextval`.
    pub fence: String,
    /// The record table, as a SQL name.
    pub holds: String,
    /// The table of holds forced out, as a SQL name.
    pub forced: String,
}

/// The record table: a row per hold or waiting request, keyed by its
/// advisory key and session. UNLOGGED, since a row counts only while its
/// session holds or waits (`pg_locks` tells), and no session outlives a
/// crash; the primary key is its only index, for every lookup. `lease` is
/// the request's, in milliseconds; `revoked`, whether its holder was asked
/// to let go (`Control::revoke`): the mark dies with the row, so the next
/// holder never inherits it.
const HOLDS: &str = "(key int8, pid int4, grp text NOT NULL, name text NOT NULL, permits int4, \
     fence int8, owner text NOT NULL, label text NOT NULL, \
     since timestamptz NOT NULL DEFAULT clock_timestamp(), lease int8 NOT NULL, \
     revoked bool NOT NULL DEFAULT false, PRIMARY KEY (key, pid))";

/// The column a record table made before revocation lacks.
const REVOKED: &str = "revoked bool NOT NULL DEFAULT false";

/// Holds ended by `Control::force_release`, by advisory key and owner
/// digest, each kept until its lease would have ended, for its holder to
/// learn why it lost the lock (`Control::forced_out`). UNLOGGED like the
/// record table: a restart ends every hold anyway.
const FORCED: &str = "(key int8, owner text, until timestamptz NOT NULL, PRIMARY KEY (key, owner))";

/// Makes `<schema>.dlock_fence`, `<schema>.dlock_holds` and
/// `<schema>.dlock_forced` if missing, and checks that this role may use them.
pub(super) async fn make(
    server: &Server,
    schema: &str,
    field: &str,
    unavailable: impl Fn(EngineError) -> Error,
) -> Result<Objects, Error> {
    let (client, connection) = server.connect().await.map_err(|e| unavailable(failed(e)))?;
    tokio::spawn(connection);
    let failed = |e: tokio_postgres::Error| unavailable(failed(e));
    let at = Schema {
        client: &client,
        schema,
        field,
        failed,
    };
    let sequence = format!("{}.dlock_fence", quote_ident(schema));
    at.create_if_missing(
        &sequence,
        &format!("the fence sequence {sequence}"),
        &format!("CREATE SEQUENCE {sequence}"),
        &format!("GRANT USAGE ON SEQUENCE {sequence} TO <role>"),
    )
    .await?;
    match client
        .query_one("SELECT nextval($1::text::regclass)", &[&sequence])
        .await
    {
        Ok(_) => {}
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            return Err(refused(
                field,
                format!(
                    "this role may not take values from {sequence}; grant USAGE ON SEQUENCE {sequence} to it"
                ),
                &e,
            ));
        }
        Err(e) => return Err(failed(e)),
    }
    let holds = at.table("dlock_holds", "the record table", HOLDS).await?;
    at.add_missing(&holds, "revoked", REVOKED).await?;
    let forced = at
        .table("dlock_forced", "the table of holds forced out", FORCED)
        .await?;
    Ok(Objects {
        fence: quote_literal(&sequence),
        holds,
        forced,
    })
}

/// What the engine does with its tables.
const RIGHTS: &str = "SELECT, INSERT, UPDATE, DELETE";

/// Where the objects go.
struct Schema<'a, F> {
    client: &'a Client,
    schema: &'a str,
    /// The setting named in errors.
    field: &'a str,
    /// The error for a failure that is the server's, not the settings'.
    failed: F,
}

impl<F: Fn(tokio_postgres::Error) -> Error> Schema<'_, F> {
    /// The UNLOGGED table `name` (`what`, in messages) with `columns`, made
    /// if missing, once this role is seen to have [`RIGHTS`] on it; its
    /// quoted name.
    async fn table(&self, name: &str, what: &str, columns: &str) -> Result<String, Error> {
        let table = format!("{}.{name}", quote_ident(self.schema));
        self.create_if_missing(
            &table,
            &format!("{what} {table}"),
            &format!("CREATE UNLOGGED TABLE {table} {columns}"),
            &format!("GRANT {RIGHTS} ON {table} TO <role>"),
        )
        .await?;
        let missing: Option<String> = self
            .client
            .query_one(
                "SELECT string_agg(p, ', ') FROM unnest(string_to_array($2, ', ')) AS p \
                 WHERE NOT has_table_privilege($1, p)",
                &[&table, &RIGHTS],
            )
            .await
            .map_err(&self.failed)?
            .get(0);
        if let Some(missing) = missing {
            return Err(Error::config(
                self.field,
                format!("this role may not {missing} on {table}; grant {RIGHTS} ON {table} to it"),
            ));
        }
        Ok(table)
    }

    /// Adds `column` (its definition `definition`) to `table` if a table
    /// made by an older dlock lacks it; refused, says who may add it.
    async fn add_missing(&self, table: &str, column: &str, definition: &str) -> Result<(), Error> {
        let present: bool = self
            .client
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = $1::text::regclass \
                 AND attname = $2 AND NOT attisdropped)",
                &[&table, &column],
            )
            .await
            .map_err(&self.failed)?
            .get(0);
        if present {
            return Ok(());
        }
        let alter = format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {definition}");
        match self.client.batch_execute(&alter).await {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Err(refused(
                self.field,
                format!(
                    "{table}, made by an older dlock, lacks the column {column}; have its owner run `{alter}`"
                ),
                &e,
            )),
            Err(e) => Err((self.failed)(e)),
        }
    }

    /// Runs `create` unless `name` (`what`, in messages) exists; refused,
    /// says to grant CREATE, or to have the owner run it and `grant`.
    async fn create_if_missing(
        &self,
        name: &str,
        what: &str,
        create: &str,
        grant: &str,
    ) -> Result<(), Error> {
        let exists: bool = self
            .client
            .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&name])
            .await
            .map_err(&self.failed)?
            .get(0);
        if exists {
            // CREATE needs the privilege even when the object exists, so
            // only a missing one is created.
            return Ok(());
        }
        match self.client.batch_execute(create).await {
            Ok(()) => Ok(()),
            // Another process made it at the same moment: a table's race
            // may end on its row type, as DUPLICATE_OBJECT.
            Err(e)
                if matches!(e.code(), Some(c) if *c == SqlState::UNIQUE_VIOLATION
                    || *c == SqlState::DUPLICATE_TABLE
                    || *c == SqlState::DUPLICATE_OBJECT) =>
            {
                Ok(())
            }
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Err(refused(
                self.field,
                format!(
                    "cannot create {what}; grant CREATE on schema {} to this role, or have its owner run `{create}; {grant}`",
                    self.schema
                ),
                &e,
            )),
            Err(e) if e.code() == Some(&SqlState::INVALID_SCHEMA_NAME) => Err(refused(
                self.field,
                format!("schema {} does not exist", self.schema),
                &e,
            )),
            Err(e) => Err((self.failed)(e)),
        }
    }
}

/// A config error on `field`: `what`, and the server's reason.
fn refused(field: &str, what: String, e: &tokio_postgres::Error) -> Error {
    let why = e
        .as_db_error()
        .map_or_else(|| e.to_string(), |db| db.message().to_owned());
    Error::config(field, format!("{what}: {why}"))
}

/// `"name"`, with inner quotes doubled.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'`, with inner quotes doubled; `E'...'` with backslashes doubled
/// too if it has any, whatever `standard_conforming_strings` says.
pub(super) fn quote_literal(text: &str) -> String {
    let quoted = text.replace('\'', "''");
    if text.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_so_no_schema_can_change_a_statement() {
        assert_eq!(quote_ident("public"), "\"public\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("\"it's\".x"), "'\"it''s\".x'");
        assert_eq!(quote_literal("a\\'b"), "E'a\\\\''b'");
    }
}
