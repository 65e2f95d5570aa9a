//! The DynamoDB engine's settings, and connecting: the client, and the
//! table, checked (or made) at startup.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
use dlock_core::Error;
use dlock_core::kit::{ClientSettings, Connecting, Kinds};
use serde::Deserialize;

use super::DynamoDbEngine;
use super::item::Seen;

/// Settings of the DynamoDB engine, `kind = "dynamodb"`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamoDbConfig {
    /// The AWS region, e.g. `eu-west-1`.
    pub region: String,
    /// The table of the locks: string keys `pk` (partition) and `sk` (sort).
    pub table: String,
    /// Make the table at startup if it is missing (needs
    /// `dynamodb:CreateTable`), on demand billing. Default: no, and a
    /// missing table is an error naming it.
    #[serde(default)]
    pub create_table: bool,
    /// Another endpoint than AWS's for the region: DynamoDB Local, a VPC
    /// endpoint.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// An access key, with `secret_access_key` or `secret_access_key_file`;
    /// without one, the usual AWS chain (environment, profile, SSO, web
    /// identity, container and instance roles).
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// The access key's secret; never shown.
    #[serde(default)]
    pub secret_access_key: Option<String>,
    /// A file holding the secret (its first line), read at startup.
    #[serde(default)]
    pub secret_access_key_file: Option<PathBuf>,
    /// `connect_timeout` bounds opening a connection, and the check of the
    /// table at startup; `client_name` is the label each hold records.
    #[serde(flatten)]
    pub client: ClientSettings,
}

impl fmt::Debug for DynamoDbConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbConfig")
            .field("region", &self.region)
            .field("table", &self.table)
            .field("create_table", &self.create_table)
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "***"),
            )
            .field("secret_access_key_file", &self.secret_access_key_file)
            .field("client", &self.client)
            .finish()
    }
}

impl DynamoDbConfig {
    /// Defaults for everything but the region and the table.
    pub fn new(region: impl Into<String>, table: impl Into<String>) -> Self {
        DynamoDbConfig {
            region: region.into(),
            table: table.into(),
            create_table: false,
            endpoint: None,
            access_key_id: None,
            secret_access_key: None,
            secret_access_key_file: None,
            client: ClientSettings::default(),
        }
    }

    /// The static key the settings give, if any; its secret never shows in
    /// an error.
    fn credentials(&self, at: &Connecting<'_>) -> Result<Option<Credentials>, Error> {
        let secret = match (&self.secret_access_key, &self.secret_access_key_file) {
            (Some(_), Some(_)) => {
                return Err(at.bad(
                    "secret_access_key_file",
                    "set secret_access_key or secret_access_key_file, not both",
                ));
            }
            (Some(secret), None) => Some(secret.clone()),
            (None, Some(path)) => Some(at.secret_file("secret_access_key_file", path)?),
            (None, None) => None,
        };
        match (&self.access_key_id, secret) {
            (None, None) => Ok(None),
            (Some(id), Some(secret)) => Ok(Some(Credentials::new(id, secret, None, None, "dlock settings"))),
            (Some(_), None) => Err(at.bad(
                "secret_access_key",
                "set secret_access_key or secret_access_key_file with access_key_id",
            )),
            (None, Some(_)) => Err(at.bad("access_key_id", "set access_key_id with its secret")),
        }
    }
}

/// Registers `kind = "dynamodb"`.
pub fn register(kinds: &mut Kinds) {
    kinds.register("dynamodb", |name, config: DynamoDbConfig| async move {
        DynamoDbEngine::connect(&name, &config).await
    });
}

/// Attempts of one request the SDK makes when throttled or cut off; the
/// core's bound on the call ends them sooner.
const ATTEMPTS: u32 = 10;

impl DynamoDbEngine {
    /// Connects engine `name` (for error messages), and checks the table,
    /// making it if missing and `create_table` allows.
    pub async fn connect(name: &str, config: &DynamoDbConfig) -> Result<Self, Error> {
        let at = Connecting {
            name,
            kind: "dynamodb",
        };
        let label = config.client.label(&at)?;
        if config.region.trim().is_empty() {
            return Err(at.bad("region", "name the AWS region, e.g. eu-west-1"));
        }
        if config.table.len() < 3 || config.table.len() > 255 {
            return Err(at.bad("table", "a table's name is 3 to 255 characters"));
        }
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()))
            .http_client(http)
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(config.client.connect_timeout)
                    .build(),
            )
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(ATTEMPTS)
                    .with_initial_backoff(Duration::from_millis(10))
                    .with_max_backoff(Duration::from_millis(200)),
            );
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some(credentials) = config.credentials(&at)? {
            loader = loader.credentials_provider(credentials);
        }
        let address = config
            .endpoint
            .clone()
            .unwrap_or_else(|| format!("dynamodb:{}", config.region));
        let shared = at
            .in_time(&address, config.client.connect_timeout, async {
                Ok(loader.load().await)
            })
            .await?;
        let engine = DynamoDbEngine {
            client: Client::new(&shared),
            table: config.table.clone(),
            address: address.clone(),
            label,
            seen: Seen::default(),
            spent: super::update::Spent::new(name, &config.table),
        };
        let checked = engine.check_table(&at, config.create_table);
        at.in_time(&address, config.client.connect_timeout, checked)
            .await?;
        Ok(engine)
    }

    /// The table exists with the keys this engine writes; made if missing
    /// and allowed. Waits for a new table to be active.
    async fn check_table(&self, at: &Connecting<'_>, create: bool) -> Result<(), Error> {
        let described = self
            .client
            .describe_table()
            .table_name(&self.table)
            .send()
            .await
            .map_err(|e| e.into_service_error());
        let missing = match described {
            Ok(found) => {
                let keys: Vec<(String, KeyType)> = found
                    .table
                    .and_then(|t| t.key_schema)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|k| (k.attribute_name, k.key_type))
                    .collect();
                let wanted = vec![
                    ("pk".to_owned(), KeyType::Hash),
                    ("sk".to_owned(), KeyType::Range),
                ];
                if keys != wanted {
                    return Err(at.bad(
                        "table",
                        format!(
                            "table `{}` must have the string keys pk (partition) and sk (sort)",
                            self.table
                        ),
                    ));
                }
                return Ok(());
            }
            Err(e) if e.is_resource_not_found_exception() => true,
            Err(e) => return Err(at.unreachable(self.address.clone(), unanswered(&e))),
        };
        if missing && !create {
            return Err(at.bad(
                "table",
                format!(
                    "table `{}` does not exist: create it (string keys pk and sk), or set create_table = true with the dynamodb:CreateTable permission",
                    self.table
                ),
            ));
        }
        let key = |name: &str, kind| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
        };
        let attribute = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
        };
        let made = self
            .client
            .create_table()
            .table_name(&self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .key_schema(key("pk", KeyType::Hash).map_err(|e| at.unreachable(self.address.clone(), e))?)
            .key_schema(key("sk", KeyType::Range).map_err(|e| at.unreachable(self.address.clone(), e))?)
            .attribute_definitions(attribute("pk").map_err(|e| at.unreachable(self.address.clone(), e))?)
            .attribute_definitions(attribute("sk").map_err(|e| at.unreachable(self.address.clone(), e))?)
            .send()
            .await
            .map_err(|e| e.into_service_error());
        match made {
            Ok(_) => {}
            // Another process made it first.
            Err(e) if e.code() == Some("ResourceInUseException") => {}
            Err(e) => {
                return Err(at.bad(
                    "create_table",
                    format!("could not create table `{}`: {}", self.table, unanswered(&e)),
                ));
            }
        }
        loop {
            let status = self
                .client
                .describe_table()
                .table_name(&self.table)
                .send()
                .await
                .map_err(|e| at.unreachable(self.address.clone(), unanswered(&e.into_service_error())))?
                .table
                .and_then(|t| t.table_status);
            if status == Some(TableStatus::Active) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// An SDK error as one line: its code and message, never a credential.
fn unanswered(e: &(impl ProvideErrorMetadata + fmt::Display)) -> String {
    match (e.code(), e.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        _ => e.to_string(),
    }
}
