//! The engine's one database object, the fence sequence: made on first use,
//! or a startup error that says which privilege is missing.

use dlock_core::Error;
use dlock_core::kit::EngineError;

use super::pool::failed;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Config, NoTls};

/// Makes `<schema>.dlock_fence` if missing and checks that this role may
/// use it; returns it as a quoted SQL literal for the statements.
pub(super) async fn fence_sequence(
    config: &Config,
    schema: &str,
    field: &str,
    unavailable: impl Fn(EngineError) -> Error,
) -> Result<String, Error> {
    let (client, connection) = config.connect(NoTls).await.map_err(|e| unavailable(failed(e)))?;
    tokio::spawn(connection);
    let sequence = format!("{}.dlock_fence", quote_ident(schema));
    let refused = |what: String, e: &tokio_postgres::Error| {
        let why = e
            .as_db_error()
            .map_or_else(|| e.to_string(), |db| db.message().to_owned());
        Error::config(field, format!("{what}: {why}"))
    };
    let failed = |e: tokio_postgres::Error| unavailable(failed(e));
    let exists: bool = client
        .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&sequence])
        .await
        .map_err(failed)?
        .get(0);
    if !exists {
        // CREATE needs the privilege even when the sequence exists, so only
        // a missing one is created.
        match client
            .batch_execute(&format!("CREATE SEQUENCE IF NOT EXISTS {sequence}"))
            .await
        {
            Ok(()) => {}
            // Another process made it at the same moment.
            Err(e) if matches!(e.code(), Some(c) if *c == SqlState::UNIQUE_VIOLATION || *c == SqlState::DUPLICATE_TABLE) =>
                {}
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                return Err(refused(
                    format!(
                        "cannot create the fence sequence {sequence}; grant CREATE on schema {schema} to this role, \
                         or have its owner run `CREATE SEQUENCE {sequence}; GRANT USAGE ON SEQUENCE {sequence} TO <role>`"
                    ),
                    &e,
                ));
            }
            Err(e) if e.code() == Some(&SqlState::INVALID_SCHEMA_NAME) => {
                return Err(refused(format!("schema {schema} does not exist"), &e));
            }
            Err(e) => return Err(failed(e)),
        }
    }
    match client
        .query_one("SELECT nextval($1::text::regclass)", &[&sequence])
        .await
    {
        Ok(_) => Ok(quote_literal(&sequence)),
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Err(refused(
            format!(
                "this role may not take values from {sequence}; grant USAGE ON SEQUENCE {sequence} to it"
            ),
            &e,
        )),
        Err(e) => Err(failed(e)),
    }
}

/// `"name"`, with inner quotes doubled.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'`, with inner quotes doubled.
fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_so_no_schema_can_change_a_statement() {
        assert_eq!(quote_ident("public"), "\"public\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("\"it's\".x"), "'\"it''s\".x'");
    }
}
