//! The model gateway's control plane (issue 13): prompts, guardrails, saved configs, stored
//! providers, MCP servers (issue 46) and API keys in SQLite or PostgreSQL, behind the gateway's
//! `/v1` paths, and the internal endpoints the filter reads them from; and the request logs the
//! filter ships, with their feedback (issue 15); the Responses API answers the gateway keeps
//! (issue 25); limits, prices, usage and the limits' ledger (issue 26). What it
//! stores is checked by the code the filter reads it with (the shared crate, `gateway_schema`).

pub mod api;
pub mod auth;
pub mod batches;
pub mod console;
pub mod crypto;
pub mod db;
pub mod errors;
pub mod files;
// The fuzz entry point (`./build.sh fuzz`), compiled with the unit tests too, which run it on fixed inputs.
#[cfg(any(test, fuzzing))]
pub mod fuzz;
pub mod gateway;
pub mod items;
pub mod ledger;
pub mod limits;
pub mod lists;
pub mod logs;
pub mod mcp_servers;
pub mod responses;
pub mod retention;
pub mod validate;

use crypto::{key_hash, MasterKey};
use db::Db;
use std::path::PathBuf;
use std::sync::Arc;

/// What the process is started with (see `Settings::from_env`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub addr: String,
    pub state_dir: PathBuf,
    pub database_url: Option<String>,
    pub master_key: Option<String>,
    pub admin_keys: Vec<String>,
    pub internal_token: String,
}

impl Settings {
    /// `GATEWAY_CONTROL_PLANE_ADDR`, `GATEWAY_STATE_DIR`, `GATEWAY_DATABASE_URL`,
    /// `GATEWAY_MASTER_KEY`, `GATEWAY_API_KEYS`, `GATEWAY_CONTROL_PLANE_TOKEN` (required).
    pub fn from_env() -> Result<Settings, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let internal_token =
            var("GATEWAY_CONTROL_PLANE_TOKEN").ok_or("GATEWAY_CONTROL_PLANE_TOKEN is required (the filter's token)")?;
        Ok(Settings {
            addr: var("GATEWAY_CONTROL_PLANE_ADDR").unwrap_or_else(|| "127.0.0.1:8790".to_string()),
            state_dir: PathBuf::from(var("GATEWAY_STATE_DIR").unwrap_or_else(|| ".run".to_string())),
            database_url: var("GATEWAY_DATABASE_URL"),
            master_key: var("GATEWAY_MASTER_KEY"),
            admin_keys: var("GATEWAY_API_KEYS")
                .map(|keys| keys.split(',').map(str::trim).filter(|k| !k.is_empty()).map(str::to_string).collect())
                .unwrap_or_default(),
            internal_token,
        })
    }

    /// `GATEWAY_DATABASE_URL` when it is PostgreSQL (or set at all), else `<state>/gateway.db`.
    pub fn database_url(&self) -> String {
        match &self.database_url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}?mode=rwc", self.state_dir.join("gateway.db").display()),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    pub db: Db,
    pub key: MasterKey,
    /// SHA-256 (hex) of each static admin key.
    pub admin_key_hashes: Vec<String>,
    pub internal_token: String,
    /// Gateway-managed batches: settings, HTTP client, the batches running here.
    pub batches: batches::Runner,
    /// Woken by each response kept here: the reads waiting for one look again.
    pub response_kept: tokio::sync::Notify,
    /// The secret by which the console's calls to the gateway API name their session's caller
    /// (`auth::CONSOLE_CALLER`): made at start, never leaving the process.
    pub console_secret: String,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// Creates the state directory, loads (or makes) the master key, opens the database and
    /// runs the migrations.
    pub async fn open(settings: &Settings) -> Result<AppState, String> {
        AppState::open_with(settings, batches::BatchSettings::from_env()).await
    }

    /// `open`, with the managed batches' settings given (tests).
    pub async fn open_with(settings: &Settings, batch: batches::BatchSettings) -> Result<AppState, String> {
        std::fs::create_dir_all(&settings.state_dir)
            .map_err(|e| format!("cannot create {}: {e}", settings.state_dir.display()))?;
        let key = MasterKey::load(settings.master_key.as_deref(), &settings.state_dir)?;
        let db = Db::open(&settings.database_url()).await.map_err(|e| format!("database: {e}"))?;
        Ok(AppState(Arc::new(Inner {
            db,
            key,
            admin_key_hashes: settings.admin_keys.iter().map(|k| key_hash(k)).collect(),
            internal_token: settings.internal_token.clone(),
            batches: batches::Runner::new(batch, batches::runner_id(&settings.state_dir)?)?,
            response_kept: tokio::sync::Notify::new(),
            console_secret: crypto::new_token()?,
        })))
    }
}
