//! All database access: workspaces, API keys, items (prompts, guardrails, configs, providers,
//! MCP servers) and their versions; request logs and feedback in `logs`; kept responses in `responses`;
//! limits, prices and the limits' ledger in `limits`.
//! sqlx's Any driver over SQLite or PostgreSQL; `$n` placeholders and portable SQL only, so both
//! run the same statements.

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::Mutex;

pub mod batches;
pub mod console;
pub mod limits;
pub mod logs;
pub mod responses;

pub type DbResult<T> = Result<T, sqlx::Error>;

#[derive(Clone)]
pub struct Db {
    pool: AnyPool,
    /// Where request records are stored: for SQLite its own connection (see `open`), for
    /// PostgreSQL the pool.
    records: AnyPool,
    /// Versions are written one at a time by this process: concurrent writers of one item
    /// would otherwise race for its next version number. (Several processes on one
    /// PostgreSQL database still can; their unique violations are retried by the caller.)
    writes: Arc<Mutex<()>>,
    /// Whether the database is SQLite (its parameters are bound differently, see `logs`).
    sqlite: bool,
}

/// What is stored: the kinds of versioned items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Prompt,
    Guardrail,
    Config,
    Provider,
    McpServer,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Prompt => "prompt",
            Kind::Guardrail => "guardrail",
            Kind::Config => "config",
            Kind::Provider => "provider",
            Kind::McpServer => "mcp-server",
        }
    }

    /// From the internal endpoint's plural (`configs`, `providers`, ...).
    pub fn from_plural(text: &str) -> Option<Kind> {
        match text {
            "prompts" => Some(Kind::Prompt),
            "guardrails" => Some(Kind::Guardrail),
            "configs" => Some(Kind::Config),
            "providers" => Some(Kind::Provider),
            "mcp-servers" => Some(Kind::McpServer),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub id: String,
    pub slug: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub id: String,
    pub value: String,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    pub id: String,
    pub workspace: String,
    pub admin: bool,
    pub last_four: String,
    pub created_at: i64,
    pub mcp_tools: Option<Vec<String>>,
    pub name: Option<String>,
}

/// A key to store: `hash` is its SHA-256, `mcp_tools` the tool patterns it is narrowed to
/// (`None`: every tool).
pub struct NewKey<'a> {
    pub id: &'a str,
    pub workspace: &'a str,
    pub hash: &'a str,
    pub admin: bool,
    pub last_four: &'a str,
    pub mcp_tools: Option<&'a [String]>,
    pub name: Option<&'a str>,
}

pub fn now_s() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A stored API key as its hash finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    pub id: String,
    pub workspace: String,
    pub admin: bool,
    pub mcp_tools: Option<Vec<String>>,
}

/// SQLite's own default page cache (2 MB), and the record connection's (8 MB); negative
/// sizes are KiB. A 32 MB record cache bought no ingest speed (the trace-id index outgrows
/// either), and in a ten-million-request soak it was still filling after hours.
const SQLITE_DEFAULT_CACHE: i64 = -2000;
const RECORDS_CACHE: i64 = -8192;

fn pool_options(sqlite: bool, connections: u32, cache_kib: i64) -> AnyPoolOptions {
    let options = AnyPoolOptions::new().max_connections(connections);
    if !sqlite {
        return options;
    }
    // A SQLite connection holds no server resource worth recycling, and a recycled one drops
    // its page cache: kept, the memory stays where the caches' bound puts it.
    options.max_lifetime(None).idle_timeout(None).after_connect(move |connection, _| {
        Box::pin(async move {
            sqlx::query(&format!("PRAGMA cache_size = {cache_kib}")).execute(&mut *connection).await?;
            // Each batch of records dirties hundreds of pages of the trace-id index (its keys
            // are random); a checkpoint copies every page the log holds back to the database.
            // At SQLite's default (every 1,000 pages) that was every other batch, copying the
            // same index pages again and again: every 16,384 pages (a log of up to 64 MB)
            // copies each of them once per many batches.
            sqlx::query("PRAGMA wal_autocheckpoint = 16384").execute(&mut *connection).await?;
            Ok(())
        })
    })
}

impl Db {
    /// Connects (creating a SQLite file when missing) and runs the migrations.
    pub async fn open(url: &str) -> DbResult<Db> {
        sqlx::any::install_default_drivers();
        let sqlite = url.starts_with("sqlite:");
        let pool = pool_options(sqlite, 8, SQLITE_DEFAULT_CACHE).connect(url).await?;
        if sqlite {
            // Write-ahead logging: a commit appends to one file (one sync) where the default
            // rollback journal creates, syncs and deletes a journal per transaction.
            sqlx::query("PRAGMA journal_mode = WAL").execute(&pool).await?;
        }
        sqlx::migrate!("./migrations").run(&pool).await?;
        // Request records arrive in a batch every few milliseconds under load, each row landing
        // at random places of three indexes (ids, record keys, trace ids): one connection with
        // a page cache of its own keeps the hottest of those pages instead of reading them again.
        // SQLite has one writer at a time anyway; a large cache on every connection of the
        // pool made the memory grow for as long as the database did (8 × 32 MB).
        let records = if sqlite { pool_options(true, 1, RECORDS_CACHE).connect(url).await? } else { pool.clone() };
        Ok(Db { pool, records, writes: Arc::new(Mutex::new(())), sqlite })
    }

    pub async fn close(&self) {
        self.records.close().await;
        self.pool.close().await;
    }

    pub async fn ensure_workspace(&self, name: &str) -> DbResult<()> {
        sqlx::query("INSERT INTO workspaces (name, created_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
            .bind(name)
            .bind(now_s())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn insert_key(&self, key: &NewKey<'_>) -> DbResult<i64> {
        self.ensure_workspace(key.workspace).await?;
        let created_at = now_s();
        let mcp_tools = key.mcp_tools.map(|tools| serde_json::Value::from(tools).to_string());
        sqlx::query(
            "INSERT INTO api_keys (id, workspace, key_hash, admin, last_four, created_at, mcp_tools, name) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(key.id)
        .bind(key.workspace)
        .bind(key.hash)
        .bind(i64::from(key.admin))
        .bind(key.last_four)
        .bind(created_at)
        .bind(mcp_tools)
        .bind(key.name)
        .execute(&self.pool)
        .await?;
        Ok(created_at)
    }

    /// A stored key by its hash.
    pub async fn key_by_hash(&self, hash: &str) -> DbResult<Option<StoredKey>> {
        let row = sqlx::query("SELECT id, workspace, admin, mcp_tools FROM api_keys WHERE key_hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(StoredKey {
                id: r.try_get("id")?,
                workspace: r.try_get("workspace")?,
                admin: r.try_get::<i64, _>("admin")? != 0,
                mcp_tools: mcp_tools(&r)?,
            })
        })
        .transpose()
    }

    /// The workspace of the stored key `id`.
    pub async fn key_workspace(&self, id: &str) -> DbResult<Option<String>> {
        let row =
            sqlx::query("SELECT workspace FROM api_keys WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
        row.map(|r| r.try_get("workspace")).transpose()
    }

    pub async fn list_keys(&self) -> DbResult<Vec<KeyRow>> {
        let rows = sqlx::query(
            "SELECT id, workspace, admin, last_four, created_at, mcp_tools, name FROM api_keys \
             ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(key_row).collect()
    }

    /// Whether a key was deleted.
    pub async fn delete_key(&self, id: &str) -> DbResult<bool> {
        let done = sqlx::query("DELETE FROM api_keys WHERE id = $1").bind(id).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }

    /// An item of the workspace by id (a UUID) or slug.
    pub async fn find_item(&self, workspace: &str, kind: Kind, id_or_slug: &str) -> DbResult<Option<Item>> {
        let row = sqlx::query(
            "SELECT id, slug FROM items WHERE workspace = $1 AND kind = $2 AND (id = $3 OR slug = $3) \
             ORDER BY CASE WHEN id = $3 THEN 0 ELSE 1 END LIMIT 1",
        )
        .bind(workspace)
        .bind(kind.as_str())
        .bind(id_or_slug)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| Ok(Item { id: r.try_get("id")?, slug: r.try_get("slug")? })).transpose()
    }

    /// Adds a version to `existing`, or creates the item `slug` with its first version.
    pub async fn add_version(
        &self,
        workspace: &str,
        kind: Kind,
        existing: Option<Item>,
        slug: &str,
        value: &str,
    ) -> DbResult<(Item, String)> {
        let _one_writer = self.writes.lock().await;
        let mut tx = self.pool.begin().await?;
        let now = now_s();
        let item = match existing {
            Some(item) => item,
            None => {
                let item = Item { id: uuid::Uuid::new_v4().to_string(), slug: slug.to_string() };
                sqlx::query("INSERT INTO items (id, workspace, kind, slug, created_at) VALUES ($1, $2, $3, $4, $5)")
                    .bind(&item.id)
                    .bind(workspace)
                    .bind(kind.as_str())
                    .bind(&item.slug)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                item
            }
        };
        // One statement numbers and writes the version: a transaction that reads before it
        // writes could not upgrade its SQLite lock while another writer waits (SQLITE_BUSY at
        // once), while one that starts by writing waits its turn (busy timeout). A race for
        // the same number is a unique violation, retried by the caller.
        let version_id = uuid::Uuid::new_v4().to_string();
        sqlx::query(
            "INSERT INTO versions (id, item_id, seq, value, created_at) \
             SELECT $1, $2, COALESCE(MAX(seq), 0) + 1, $3, $4 FROM versions WHERE item_id = $2",
        )
        .bind(&version_id)
        .bind(&item.id)
        .bind(value)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((item, version_id))
    }

    /// Deletes the item `slug` of the workspace with its versions; whether there was one.
    pub async fn delete_item(&self, workspace: &str, kind: Kind, slug: &str) -> DbResult<bool> {
        let _one_writer = self.writes.lock().await;
        let mut tx = self.pool.begin().await?;
        // The versions first: they refer to the item.
        sqlx::query(
            "DELETE FROM versions WHERE item_id IN \
             (SELECT id FROM items WHERE workspace = $1 AND kind = $2 AND slug = $3)",
        )
        .bind(workspace)
        .bind(kind.as_str())
        .bind(slug)
        .execute(&mut *tx)
        .await?;
        let done = sqlx::query("DELETE FROM items WHERE workspace = $1 AND kind = $2 AND slug = $3")
            .bind(workspace)
            .bind(kind.as_str())
            .bind(slug)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    /// Every item of `kind` in the workspace with its latest version, by slug.
    pub async fn latest_items(&self, workspace: &str, kind: Kind) -> DbResult<Vec<(Item, Version)>> {
        let rows = sqlx::query(
            "SELECT i.id AS item_id, i.slug AS slug, v.id AS id, v.value AS value, v.created_at AS created_at \
             FROM items i JOIN versions v ON v.item_id = i.id \
             WHERE i.workspace = $1 AND i.kind = $2 AND v.seq = (SELECT MAX(seq) FROM versions WHERE item_id = i.id) \
             ORDER BY i.slug",
        )
        .bind(workspace)
        .bind(kind.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((Item { id: r.try_get("item_id")?, slug: r.try_get("slug")? }, version_row(r)?)))
            .collect()
    }

    pub async fn latest(&self, item_id: &str) -> DbResult<Option<Version>> {
        let row =
            sqlx::query("SELECT id, value, created_at FROM versions WHERE item_id = $1 ORDER BY seq DESC LIMIT 1")
                .bind(item_id)
                .fetch_optional(&self.pool)
                .await?;
        row.as_ref().map(version_row).transpose()
    }

    pub async fn version(&self, item_id: &str, version_id: &str) -> DbResult<Option<Version>> {
        let row = sqlx::query("SELECT id, value, created_at FROM versions WHERE item_id = $1 AND id = $2")
            .bind(item_id)
            .bind(version_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(version_row).transpose()
    }
}

fn version_row(r: &AnyRow) -> DbResult<Version> {
    Ok(Version { id: r.try_get("id")?, value: r.try_get("value")?, created_at: r.try_get("created_at")? })
}

fn key_row(r: &AnyRow) -> DbResult<KeyRow> {
    Ok(KeyRow {
        id: r.try_get("id")?,
        workspace: r.try_get("workspace")?,
        admin: r.try_get::<i64, _>("admin")? != 0,
        last_four: r.try_get("last_four")?,
        created_at: r.try_get("created_at")?,
        mcp_tools: mcp_tools(r)?,
        name: r.try_get("name")?,
    })
}

/// A key's `mcp_tools` column: the JSON list of its tool patterns, NULL for every tool.
fn mcp_tools(r: &AnyRow) -> DbResult<Option<Vec<String>>> {
    let text: Option<String> = r.try_get("mcp_tools")?;
    text.map(|text| serde_json::from_str(&text).map_err(|e| sqlx::Error::Decode(Box::new(e)))).transpose()
}
