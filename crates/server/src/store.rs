//! Durable state in SQLite (`<data>/state.db`, WAL): sandboxes, images, snapshots.
//!
//! The schema is versioned: `schema_version` holds the number of applied [`MIGRATIONS`],
//! and opening a database applies the missing ones in one transaction each. Calls are
//! blocking; the async wrappers run them on the blocking pool, never on the I/O threads.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::backend::BootSpec;
use api_types::{Image, Sandbox};

/// Numbered migrations; index + 1 is the version each one brings the schema to.
const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    "CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        name TEXT,
        state TEXT NOT NULL,
        view TEXT NOT NULL,
        boot TEXT NOT NULL
     );
     CREATE INDEX sandboxes_state ON sandboxes(state);
     CREATE TABLE images (
        name TEXT PRIMARY KEY,
        layer_id TEXT NOT NULL,
        size_bytes INTEGER NOT NULL,
        builder TEXT NOT NULL,
        created_at TEXT NOT NULL
     );
     CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        source_sandbox_id TEXT,
        record TEXT NOT NULL,
        created_at TEXT NOT NULL
     );",
];

/// Errors of the state database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("State database query failed")]
    Sql(#[from] rusqlite::Error),
    #[error("State database record is unreadable")]
    Decode(#[from] serde_json::Error),
    #[error("State database is from a newer sandfork (schema {found}, this build knows {known})")]
    TooNew { found: i64, known: i64 },
    #[error("State database task failed: {0}")]
    Task(String),
}

/// Result of store calls.
pub type StoreResult<T> = Result<T, StoreError>;

/// One sandbox row: what the API shows and what re-adopting it needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRow {
    pub view: Sandbox,
    pub boot: BootSpec,
}

/// Handle to the state database (cheap to clone).
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
}

impl Store {
    /// Opens (creating if needed) and migrates the database at `path`.
    pub fn open(path: &Path) -> StoreResult<Store> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Rows rewritten without their secrets must not leave them in freed pages.
        conn.pragma_update(None, "secure_delete", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        migrate(&mut conn)?;
        Ok(Store {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` with the connection on the blocking pool.
    pub async fn call<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let guard = conn
                .lock()
                .map_err(|_| StoreError::Task("lock poisoned".into()))?;
            f(&guard)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }

    /// Inserts or replaces a sandbox row.
    pub async fn put_sandbox(&self, row: SandboxRow) -> StoreResult<()> {
        self.call(move |c| put_sandbox(c, &row)).await
    }

    /// Every sandbox row.
    pub async fn sandboxes(&self) -> StoreResult<Vec<SandboxRow>> {
        self.call(load_sandboxes).await
    }

    /// Removes terminated sandbox rows (history pruning).
    pub async fn prune_terminated(&self, keep_last: usize) -> StoreResult<usize> {
        self.call(move |c| prune_terminated(c, keep_last)).await
    }

    pub async fn put_image(&self, image: Image) -> StoreResult<()> {
        self.call(move |c| put_image(c, &image)).await
    }

    pub async fn image(&self, name: String) -> StoreResult<Option<Image>> {
        self.call(move |c| get_image(c, &name)).await
    }

    pub async fn images(&self) -> StoreResult<Vec<Image>> {
        self.call(list_images).await
    }

    /// Removes an image name; returns whether it existed.
    pub async fn delete_image(&self, name: String) -> StoreResult<bool> {
        self.call(move |c| Ok(c.execute("DELETE FROM images WHERE name = ?1", [name])? > 0))
            .await
    }
}

/// The schema version of an open database.
pub fn schema_version(conn: &Connection) -> StoreResult<i64> {
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
        [],
    )?;
    let v: Option<i64> = conn
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .optional()?;
    Ok(v.unwrap_or(0))
}

fn migrate(conn: &mut Connection) -> StoreResult<()> {
    let known = MIGRATIONS.len() as i64;
    let mut version = schema_version(conn)?;
    if version > known {
        return Err(StoreError::TooNew {
            found: version,
            known,
        });
    }
    while version < known {
        let tx = conn.transaction()?;
        tx.execute_batch(MIGRATIONS[version as usize])?;
        version += 1;
        tx.execute("DELETE FROM schema_version", [])?;
        tx.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [version],
        )?;
        tx.commit()?;
    }
    Ok(())
}

fn put_sandbox(c: &Connection, row: &SandboxRow) -> StoreResult<()> {
    c.execute(
        "INSERT OR REPLACE INTO sandboxes (id, name, state, view, boot) VALUES (?1,?2,?3,?4,?5)",
        params![
            row.view.id,
            row.view.name,
            row.view.state.as_str(),
            serde_json::to_string(&row.view)?,
            serde_json::to_string(&row.boot)?,
        ],
    )?;
    Ok(())
}

fn load_sandboxes(c: &Connection) -> StoreResult<Vec<SandboxRow>> {
    let mut stmt = c.prepare("SELECT view, boot FROM sandboxes ORDER BY rowid")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (view, boot) = row?;
        out.push(SandboxRow {
            view: serde_json::from_str(&view)?,
            boot: serde_json::from_str(&boot)?,
        });
    }
    Ok(out)
}

fn prune_terminated(c: &Connection, keep_last: usize) -> StoreResult<usize> {
    let n = c.execute(
        "DELETE FROM sandboxes WHERE state = 'terminated' AND rowid NOT IN
           (SELECT rowid FROM sandboxes WHERE state = 'terminated' ORDER BY rowid DESC LIMIT ?1)",
        [keep_last as i64],
    )?;
    Ok(n)
}

fn put_image(c: &Connection, i: &Image) -> StoreResult<()> {
    c.execute(
        "INSERT OR REPLACE INTO images (name, layer_id, size_bytes, builder, created_at)
         VALUES (?1,?2,?3,?4,?5)",
        params![
            i.name,
            i.layer_id,
            i.size_bytes as i64,
            i.builder,
            i.created_at
        ],
    )?;
    Ok(())
}

fn image_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Image> {
    Ok(Image {
        name: r.get(0)?,
        layer_id: r.get(1)?,
        size_bytes: r.get::<_, i64>(2)? as u64,
        builder: r.get(3)?,
        created_at: r.get(4)?,
    })
}

fn get_image(c: &Connection, name: &str) -> StoreResult<Option<Image>> {
    let q = "SELECT name, layer_id, size_bytes, builder, created_at FROM images WHERE name = ?1";
    Ok(c.query_row(q, [name], image_from_row).optional()?)
}

fn list_images(c: &Connection) -> StoreResult<Vec<Image>> {
    let mut stmt = c.prepare(
        "SELECT name, layer_id, size_bytes, builder, created_at FROM images ORDER BY name",
    )?;
    let rows = stmt.query_map([], image_from_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(name: &str) -> Image {
        Image {
            name: name.into(),
            layer_id: "l1".into(),
            size_bytes: 7,
            builder: "busybox".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[tokio::test]
    async fn migrations_apply_once_and_data_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open(&path).unwrap();
        store.put_image(image("a")).await.unwrap();
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.images().await.unwrap(), vec![image("a")]);
        let v = store.call(schema_version).await.unwrap();
        assert_eq!(v, MIGRATIONS.len() as i64);
        assert!(store.delete_image("a".into()).await.unwrap());
        assert!(!store.delete_image("a".into()).await.unwrap());
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(Store::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.execute("UPDATE schema_version SET version = 99", [])
            .unwrap();
        drop(conn);
        assert!(matches!(
            Store::open(&path),
            Err(StoreError::TooNew { found: 99, .. })
        ));
    }
}
