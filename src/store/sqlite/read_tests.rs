//! Tests of `read.rs`: texts read as stored, the registry read in two
//! halves as one state, and when it is not split.

use super::*;

/// Texts a column repeats are stored once per batch; every value still
/// reads as SQLite holds it, across batch boundaries, beside texts of
/// equal length that differ, NULLs and integers in the same column, and
/// columns with more distinct texts than are remembered.
#[test]
fn repeated_texts_read_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.sqlite");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE worker_registrations (worker_identity TEXT PRIMARY KEY, role TEXT,
         remote TEXT, status, boot_id TEXT, namespace TEXT)",
    )
    .unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    for i in 0..5000u32 {
        let status: rusqlite::types::Value = match i % 7 {
            0 => rusqlite::types::Value::Null,
            1 => rusqlite::types::Value::Integer(i64::from(i % 3)),
            2 => "aaab".to_string().into(),
            _ => "aaaa".to_string().into(),
        };
        tx.execute(
            "INSERT INTO worker_registrations VALUES (?1, ?2, 'prgs', ?3, ?4, ?5)",
            rusqlite::params![
                format!("w-{i}"),
                ["author", "reviewer", "merger", "controller", "reconciler"][(i % 5) as usize],
                status,
                format!("boot-{:02}", (i * 7) % 13),
                if i % 11 == 0 {
                    String::new()
                } else {
                    format!("ns-{}", i % 2)
                },
            ],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    let rows = read_rows(&conn, &path).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT worker_identity, role, remote, status, boot_id, namespace \
             FROM worker_registrations ORDER BY rowid",
        )
        .unwrap();
    let cols = [
        Col::WorkerIdentity,
        Col::Role,
        Col::Remote,
        Col::Status,
        Col::BootId,
        Col::Namespace,
    ];
    let mut cursor = stmt.query([]).unwrap();
    let mut n = 0;
    while let Some(r) = cursor.next().unwrap() {
        for (i, col) in cols.iter().enumerate() {
            let expected = value_from_sql(r.get_ref(i).unwrap()).unwrap();
            assert_eq!(rows[n].get(*col), expected, "row {n} column {col:?}");
        }
        n += 1;
    }
    assert_eq!(n, rows.len());
    assert_eq!(n, 5000);
}

/// A registry of `n` rows with every storage class, non-ASCII text and
/// a gap in its rowids; `tag` makes two registries' texts differ.
fn registry_of(path: &Path, n: i64, tag: &str) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "CREATE TABLE worker_registrations (worker_identity TEXT PRIMARY KEY, role TEXT,
         pid, heartbeat_ttl_seconds, boot_id, namespace TEXT)",
    )
    .unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO worker_registrations (rowid, worker_identity, role, pid,
                 heartbeat_ttl_seconds, boot_id, namespace) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .unwrap();
        for i in 0..n {
            let rowid = if i < n / 3 { i + 1 } else { i + 1000 };
            let boot: rusqlite::types::Value = match i % 4 {
                0 => rusqlite::types::Value::Null,
                1 => rusqlite::types::Value::Blob(vec![i as u8, 0, 0xff]),
                2 => rusqlite::types::Value::Real(i as f64 / 8.0),
                _ => format!("boot-{}", i % 13).into(),
            };
            insert
                .execute(rusqlite::params![
                    rowid,
                    format!("w-{tag}-{i}"),
                    ["author", "réviewer", "merger"][(i % 3) as usize],
                    i * 7,
                    30.5,
                    boot,
                    if i % 5 == 0 {
                        "ns-😀".to_string()
                    } else {
                        format!("ns-{i}")
                    },
                ])
                .unwrap();
        }
    }
    tx.commit().unwrap();
}

fn whole(path: &Path) -> Vec<Row> {
    read_rows(&open_read_only(path).unwrap(), path).unwrap()
}

/// A registry large enough to be read in two halves at once reads as
/// the same rows, in the same order, as reading it whole.
#[test]
fn halves_read_as_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.sqlite");
    registry_of(&path, 3 * SPLIT_ROWS / 2, "a");
    let conn = open_read_only(&path).unwrap();
    assert!(split_point(&conn).is_some(), "large enough to split");
    let rows = load(&path).unwrap();
    assert_eq!(rows.len() as i64, 3 * SPLIT_ROWS / 2);
    assert!(rows == whole(&path), "the halves read as the whole");
    assert_eq!(rows[4].get(Col::Role), crate::value::Val::Text("réviewer"));
}

/// Text that is not UTF-8 in the second half is named by its row in
/// the whole registry.
#[test]
fn bad_text_in_the_second_half_names_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.sqlite");
    let n = 3 * SPLIT_ROWS / 2;
    registry_of(&path, n, "a");
    let conn = Connection::open(&path).unwrap();
    let last: i64 = conn
        .query_row("SELECT max(rowid) FROM worker_registrations", [], |r| {
            r.get(0)
        })
        .unwrap();
    conn.execute(
        "UPDATE worker_registrations SET namespace = CAST(x'6e73ff' AS TEXT) WHERE rowid = ?1",
        [last - 1],
    )
    .unwrap();
    drop(conn);
    let e = load(&path).unwrap_err().to_string();
    assert!(
        e.contains(&format!("row {}: column `namespace`", n - 1)),
        "{e}"
    );
}

/// A writer waiting to commit keeps a second reader out; the read does
/// not wait for it (which would stall both) but reads everything on the
/// first connection, in the state from before the writer's commit,
/// which lands once the read is over.
#[test]
fn a_writer_waiting_to_commit_leaves_the_read_on_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.sqlite");
    registry_of(&path, 3 * SPLIT_ROWS / 2, "a");
    let before = whole(&path);
    let conn = open_read_only(&path).unwrap();
    conn.execute_batch("BEGIN").unwrap();
    let writer_done = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        let second = || {
            // The read holds its shared lock now; a writer commits.
            let p = path.clone();
            let done = &writer_done;
            scope.spawn(move || {
                let w = Connection::open(&p).unwrap();
                w.busy_timeout(std::time::Duration::from_secs(30)).unwrap();
                w.execute_batch("BEGIN IMMEDIATE").unwrap();
                w.execute("UPDATE worker_registrations SET role = 'changed'", [])
                    .unwrap();
                let committed = w.execute_batch("COMMIT");
                *done.lock().unwrap() = Some(committed.is_ok());
            });
            // Until the writer holds its pending lock, a new reader
            // still gets in; wait for the moment it cannot.
            let started = std::time::Instant::now();
            loop {
                let probe = Connection::open(&path).unwrap();
                let shut_out = probe
                    .query_row("SELECT count(*) FROM sqlite_master", [], |r| {
                        r.get::<_, i64>(0)
                    })
                    .is_err();
                if shut_out {
                    break;
                }
                assert!(started.elapsed().as_secs() < 20, "the writer never waited");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let refused = second_reader(&path, file_identity(&path), None);
            assert!(refused.is_err(), "a second reader does not get in");
            refused
        };
        let rows = read_in_parts(&conn, &path, &second).unwrap();
        assert!(rows == before, "read whole, before the writer's commit");
        conn.execute_batch("COMMIT").unwrap();
    });
    assert_eq!(
        *writer_done.lock().unwrap(),
        Some(true),
        "the writer committed after"
    );
    assert_eq!(
        whole(&path)[0].get(Col::Role),
        crate::value::Val::Text("changed")
    );
}

/// A registry file replaced (renamed over) after the first connection
/// opened it is not read as the second half: the first connection reads
/// all of the file it opened.
#[test]
fn a_replaced_file_is_not_read_as_the_second_half() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.sqlite");
    let other = dir.path().join("other.sqlite");
    registry_of(&path, 3 * SPLIT_ROWS / 2, "a");
    registry_of(&other, 3 * SPLIT_ROWS / 2, "b");
    let before = whole(&path);
    let file = file_identity(&path);
    let conn = open_read_only(&path).unwrap();
    conn.execute_batch("BEGIN").unwrap();
    let second = || {
        std::fs::rename(&other, &path).unwrap();
        let refused = second_reader(&path, file, None);
        assert!(
            refused.as_ref().is_err_and(|e| e.contains("another file")),
            "refused: {:?}",
            refused.as_ref().err()
        );
        refused
    };
    let rows = read_in_parts(&conn, &path, &second).unwrap();
    assert!(rows == before, "only the file first opened");
}

/// In WAL mode each connection reads its own snapshot, so a registry
/// there is read whole, on one connection.
#[test]
fn a_wal_registry_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.sqlite");
    registry_of(&path, 3 * SPLIT_ROWS / 2, "a");
    let conn = Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(conn);
    let read = open_read_only(&path).unwrap();
    read.execute_batch("BEGIN").unwrap();
    Select::of(&read, &path).unwrap();
    assert_eq!(split_point(&read), None);
    read.execute_batch("COMMIT").unwrap();
    assert_eq!(load(&path).unwrap().len() as i64, 3 * SPLIT_ROWS / 2);
}
