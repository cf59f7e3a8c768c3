//! SQLite persistence: one table where the revision is the key, in the shape of kine.
//!
//! Every write appends one row to `kv` (a tombstone with `deleted = 1` for a delete).
//! `prev_revision` names the row the write superseded (0 for a create), which lets
//! compaction find superseded rows from the rows it compacts, without scanning the table.
//! `meta.compact_revision` records how far rows were compacted; `meta.refused_commits`
//! counts the commits that failed.
//!
//! Data flow: [`Db::open`] reads the whole table once (the snapshot at the compaction point
//! plus the events after it); afterwards the writer thread only appends ([`Db::append`])
//! and compacts ([`Db::compact`]). Reads never touch SQLite.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use crate::{Event, Record, Revision};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS kv (
    revision        INTEGER PRIMARY KEY,
    key             TEXT    NOT NULL,
    value           BLOB    NOT NULL,
    create_revision INTEGER NOT NULL,
    prev_revision   INTEGER NOT NULL,
    deleted         INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS kv_key ON kv (key, revision);
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT    PRIMARY KEY,
    value INTEGER NOT NULL
);
";

const COMPACT_REVISION: &str = "compact_revision";
/// How many commits failed (see [`Db::overwrite_refused_commit`]).
const REFUSED_COMMITS: &str = "refused_commits";

/// One row to append: the event and the revision of the row it supersedes.
#[derive(Debug)]
pub(crate) struct Row<'a> {
    pub(crate) event: &'a Event,
    pub(crate) prev_revision: Revision,
}

/// What [`Db::open`] found on disk.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub(crate) current: BTreeMap<String, Record>,
    /// Events after `compacted`, in revision order.
    pub(crate) history: Vec<Event>,
    pub(crate) revision: Revision,
    pub(crate) compacted: Revision,
}

/// The connection owned by the writer thread.
#[derive(Debug)]
pub(crate) struct Db {
    conn: Connection,
}

fn to_sql(revision: Revision) -> i64 {
    revision.cast_signed()
}

fn from_sql(value: i64) -> Revision {
    value.cast_unsigned()
}

impl Db {
    /// Opens or creates the database and loads it.
    ///
    /// The connection takes an exclusive lock (`locking_mode=EXCLUSIVE`): a second store
    /// on the same file, in this process or another, fails to open instead of assigning
    /// revisions behind this one's back.
    ///
    /// The file should exist with its final mode already ([`restrict_files`]).
    pub(crate) fn open(path: &Path) -> rusqlite::Result<(Db, Loaded)> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(2))?;
        conn.pragma_update_and_check(None, "locking_mode", "EXCLUSIVE", |_| Ok(()))?;
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA)?;
        let db = Db { conn };
        let loaded = db.load()?;
        Ok((db, loaded))
    }

    fn compact_revision(conn: &Connection) -> rusqlite::Result<Revision> {
        let value: Option<i64> = conn
            .query_row(
                "SELECT value FROM meta WHERE name = ?1",
                [COMPACT_REVISION],
                |row| row.get(0),
            )
            .optional()?;
        Ok(value.map_or(0, from_sql))
    }

    fn load(&self) -> rusqlite::Result<Loaded> {
        let compacted = Self::compact_revision(&self.conn)?;
        let mut loaded = Loaded {
            compacted,
            revision: compacted,
            ..Loaded::default()
        };
        let mut statement = self.conn.prepare(
            "SELECT revision, key, value, create_revision, deleted FROM kv ORDER BY revision",
        )?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let revision = from_sql(row.get(0)?);
            let key: String = row.get(1)?;
            let value = value_bytes(&key, row.get_ref(2)?);
            let create_revision = from_sql(row.get(3)?);
            let deleted: bool = row.get(4)?;
            loaded.revision = loaded.revision.max(revision);
            let event = if deleted {
                // The tombstone carries no value: the last value is the current one.
                loaded.current.remove(&key).map(|last| Event::Delete {
                    record: Record { revision, ..last },
                })
            } else {
                let record = Record {
                    key: key.clone(),
                    value: Arc::from(value),
                    revision,
                    create_revision,
                };
                let prev = loaded.current.insert(key, record.clone());
                Some(Event::Put { record, prev })
            };
            if revision > compacted {
                loaded.history.extend(event);
            }
        }
        Ok(loaded)
    }

    /// Appends `rows` in one transaction and commits (one fsync for the batch).
    pub(crate) fn append(&mut self, rows: &[Row<'_>]) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO kv (revision, key, value, create_revision, prev_revision, deleted)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for row in rows {
                let (record, value, deleted): (&Record, &[u8], bool) = match row.event {
                    Event::Put { record, .. } => (record, &record.value, false),
                    Event::Delete { record } => (record, &[], true),
                };
                insert.execute(params![
                    to_sql(record.revision),
                    record.key,
                    value,
                    to_sql(record.create_revision),
                    to_sql(row.prev_revision),
                    deleted,
                ])?;
            }
        }
        tx.commit()
    }

    /// After a failed commit: makes the frames the refused transaction may have left in the
    /// WAL unrecoverable, so that a write answered with an error cannot come back when the
    /// database is opened again.
    ///
    /// SQLite writes a transaction's frames to the WAL and then syncs the file. When the sync
    /// fails (`SQLITE_IOERR_FSYNC`) the transaction is refused and rolled back in memory,
    /// but its frames stay in the file, complete and checksummed, and a reopen after a crash
    /// would recover them. Every transaction writes its frames from the end of the last
    /// committed one, so this small one overwrites the first of them and breaks the chain
    /// of checksums after it. It counts refused commits in `meta` (`refused_commits`), which
    /// is harmless whether it commits, is recovered itself or fails too.
    pub(crate) fn overwrite_refused_commit(&mut self) -> rusqlite::Result<()> {
        self.conn.execute(
            "INSERT INTO meta (name, value) VALUES (?1, 1)
             ON CONFLICT (name) DO UPDATE SET value = value + 1",
            [REFUSED_COMMITS],
        )?;
        Ok(())
    }

    /// Deletes rows superseded at or below `revision` and tombstones at or below it;
    /// returns the number of rows deleted.
    ///
    /// Afterwards the rows at or below `revision` are exactly the live values at that
    /// revision, and every row above it is kept, so a reopen can rebuild the history
    /// after `revision`.
    pub(crate) fn compact(&mut self, revision: Revision) -> rusqlite::Result<usize> {
        let tx = self.conn.transaction()?;
        let from = Self::compact_revision(&tx)?;
        if revision <= from {
            return Ok(0);
        }
        let superseded = tx.execute(
            "DELETE FROM kv WHERE revision IN (
                 SELECT prev_revision FROM kv
                 WHERE revision > ?1 AND revision <= ?2 AND prev_revision > 0)",
            params![to_sql(from), to_sql(revision)],
        )?;
        let tombstones = tx.execute(
            "DELETE FROM kv WHERE deleted = 1 AND revision > ?1 AND revision <= ?2",
            params![to_sql(from), to_sql(revision)],
        )?;
        tx.execute(
            "INSERT INTO meta (name, value) VALUES (?1, ?2)
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            params![COMPACT_REVISION, to_sql(revision)],
        )?;
        tx.commit()?;
        Ok(superseded + tombstones)
    }
}

/// The bytes of a stored value. Values are written as blobs; one changed behind the
/// store's back (text, a number) is loaded as it is (its bytes, or none), so that one bad
/// row leaves the rest of the store readable and the API server can skip it.
fn value_bytes(key: &str, value: rusqlite::types::ValueRef<'_>) -> Vec<u8> {
    use rusqlite::types::ValueRef;
    match value {
        ValueRef::Blob(bytes) => bytes.to_vec(),
        ValueRef::Text(bytes) => bytes.to_vec(),
        other => {
            tracing::warn!(key, kind = %other.data_type(), "stored value is not a blob");
            Vec::new()
        }
    }
}

/// The database file and the journal files SQLite keeps beside it.
fn database_files(path: &Path) -> Vec<PathBuf> {
    let mut files = vec![path.to_owned()];
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        files.push(PathBuf::from(name));
    }
    files
}

/// Creates the database file readable by its owner only (it holds every Secret),
/// whatever the umask, and narrows an existing file and journal files to 0600.
///
/// SQLite creates its `-wal` and `-shm` files with the mode of the database file, so
/// creating the database 0600 covers the files it creates later.
#[cfg(unix)]
pub(crate) fn restrict_files(path: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| (path.to_owned(), e))?;
    for file in database_files(path) {
        let mode = match std::fs::metadata(&file) {
            Ok(meta) => meta.permissions().mode() & 0o777,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err((file, e)),
        };
        if mode != 0o600 {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| (file.clone(), e))?;
            tracing::info!(file = %file.display(), "narrowed the store file's mode to 0600");
        }
    }
    Ok(())
}

/// File modes are a Unix matter; elsewhere the files keep what the platform gives.
#[cfg(not(unix))]
pub(crate) fn restrict_files(_path: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    Ok(())
}

/// A copy of a SQLite error, to answer every caller of a failed batch.
pub(crate) fn copy_error(error: &rusqlite::Error) -> rusqlite::Error {
    match error {
        rusqlite::Error::SqliteFailure(code, message) => {
            rusqlite::Error::SqliteFailure(*code, message.clone())
        }
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_sets_wal_and_full_synchronous_mode() {
        let dir = tempfile::tempdir().unwrap();
        let (db, loaded) = Db::open(&dir.path().join("s.db")).unwrap();
        assert_eq!(loaded.revision, 0);
        let mode: String = db
            .conn
            .query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .unwrap();
        let synchronous: i64 = db
            .conn
            .query_row("PRAGMA synchronous", [], |row| row.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(synchronous, 2, "FULL");
    }

    #[test]
    fn copied_errors_keep_the_sqlite_code() {
        let original = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("disk full".to_owned()),
        );
        assert_eq!(copy_error(&original), original);
    }
}
