//! The controller's own tables in the registry's database
//! (`fleet-retire controller`, docs/controller.md): its lease per
//! (registry, host), with the term that fences apply; the host's
//! retirement budget; and the side table that gives each of its applies its
//! term and tick.
//!
//! They live beside the registry, not in the lease store, so that apply
//! reads the lease in its own transaction: on SQLite under the same write
//! lock as its writes, so no one can take the lease over between the check
//! and COMMIT. The audit table is left as it is: an apply's term and tick
//! are one row of [`APPLIES`] keyed by the `apply_id` every audit row of
//! that apply carries (a hand apply has none, so a join gives NULL), which
//! keeps the audit table's columns, and every binary that checks them,
//! unchanged.

/// One lease row per scope (a host): who holds it, its term, its expiry.
/// Renewed every retry period.
pub const LEASES: &str = "fleet_retire_controller_leases";

/// One row per scope: the host's token bucket, with the term of the lease
/// that last spent or inherited it. Written only when a term begins and by
/// a controller's apply, never by a renewal, so on PostgreSQL an apply's
/// update of it conflicts with a takeover and not with its own renewals.
pub const BUDGETS: &str = "fleet_retire_controller_budgets";

/// One row per apply a controller made: its id, term and tick.
pub const APPLIES: &str = "fleet_retire_controller_applies";

/// The columns of [`LEASES`], with their SQL types (the same text on both
/// engines; times are milliseconds since the Unix epoch on the clock of the
/// database where it has one, else the host's).
pub const LEASE_COLUMNS: &[(&str, &str)] = &[
    ("scope", "TEXT PRIMARY KEY"),
    ("holder", "TEXT NOT NULL"),
    ("term", "BIGINT NOT NULL"),
    ("acquired_at_ms", "BIGINT NOT NULL"),
    ("renewed_at_ms", "BIGINT NOT NULL"),
    ("expires_at_ms", "BIGINT NOT NULL"),
];

/// The columns of [`BUDGETS`].
pub const BUDGET_COLUMNS: &[(&str, &str)] = &[
    ("scope", "TEXT PRIMARY KEY"),
    ("term", "BIGINT NOT NULL"),
    ("budget_tokens", "DOUBLE PRECISION NOT NULL"),
    ("budget_at_ms", "BIGINT NOT NULL"),
];

/// The columns of [`APPLIES`].
pub const APPLY_COLUMNS: &[(&str, &str)] = &[
    ("apply_id", "TEXT PRIMARY KEY"),
    ("scope", "TEXT NOT NULL"),
    ("holder", "TEXT NOT NULL"),
    ("controller_term", "BIGINT NOT NULL"),
    ("controller_tick", "BIGINT NOT NULL"),
    ("targets", "BIGINT NOT NULL"),
    ("recorded_at_ms", "BIGINT NOT NULL"),
];

/// A table's name and columns.
pub type Table = (&'static str, &'static [(&'static str, &'static str)]);

/// Every table of the controller's.
pub const TABLES: [Table; 3] = [
    (LEASES, LEASE_COLUMNS),
    (BUDGETS, BUDGET_COLUMNS),
    (APPLIES, APPLY_COLUMNS),
];

/// `CREATE TABLE` for one of [`TABLES`].
pub fn create_sql(table: &str, columns: &[(&str, &str)]) -> String {
    let cols: Vec<String> = columns.iter().map(|(n, t)| format!("{n} {t}")).collect();
    format!("CREATE TABLE {table} ({})", cols.join(", "))
}

/// Why a table found under one of our names is not ours (its columns
/// differ), if it is not.
pub fn foreign_columns(table: &str, columns: &[(&str, &str)], found: &[String]) -> Option<String> {
    let ours: Vec<&str> = columns.iter().map(|(n, _)| *n).collect();
    (found.len() != ours.len() || !ours.iter().all(|c| found.iter().any(|f| f == c))).then(|| {
        format!(
            "table {table:?} has columns ({}) where fleet-retire's controller keeps ({}); \
             rename or drop it, then start the controller again",
            found.join(", "),
            ours.join(", ")
        )
    })
}

/// A token bucket: `capacity` retirements, refilled evenly over `per_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    /// At most this many tokens.
    pub capacity: f64,
    /// Milliseconds to refill from empty to full.
    pub per_ms: i64,
}

impl Bucket {
    /// The tokens `tokens` (last written at `at_ms`) have become at
    /// `now_ms`: refilled for the time between, never above the capacity,
    /// and never refilled for a clock that went back.
    pub fn refill(&self, tokens: f64, at_ms: i64, now_ms: i64) -> f64 {
        let elapsed = (now_ms - at_ms).max(0) as f64;
        let rate = self.capacity / (self.per_ms.max(1) as f64);
        (tokens + elapsed * rate).min(self.capacity).max(0.0)
    }
}

/// What a controller's apply presents to be fenced: the lease it believes
/// it holds, and the tick and budget it acts under.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamp {
    /// The lease's scope (this host).
    pub scope: String,
    /// This process's holder identity.
    pub holder: String,
    /// The term it holds the lease under.
    pub term: i64,
    /// The controller's tick.
    pub tick: i64,
    /// The host's budget.
    pub bucket: Bucket,
    /// The lease's ttl: a server ends a controller's apply transaction
    /// left idle this long (a frozen process must not block a takeover).
    pub lease_ttl_ms: i64,
}

/// How an acquire or renew ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// This holder holds the lease under `term` until `expires_at_ms`.
    Leading {
        /// The term.
        term: i64,
        /// Until when (the database's clock).
        expires_at_ms: i64,
    },
    /// Another holder does.
    Following {
        /// Who.
        holder: String,
        /// Under which term.
        term: i64,
    },
}

/// A registry row the change record names as changed since a mark
/// (`ControllerRows::changes`).
#[derive(Debug, Clone)]
pub enum Changed {
    /// The row as it is now.
    Row(crate::row::Row),
    /// No longer there, with its identity when the record names it.
    Gone(Option<String>),
}

/// What changed in the registry since a mark.
#[derive(Debug, Clone)]
pub enum ChangesSince {
    /// These rows (none: nothing changed).
    Rows(Vec<Changed>),
    /// The store cannot say which rows (no earlier mark, its schema
    /// changed, another server, more rows than asked for): any may have.
    Unknown(String),
}

/// The now of a store without a clock of its own: the host's, in
/// milliseconds since the Unix epoch.
pub fn host_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Why the lease row (`holder`, `term`, `expires_at_ms`, or none) does not
/// let `stamp` act at `now_ms`, if it does not.
pub fn not_held(stamp: &Stamp, row: Option<(String, i64, i64)>, now_ms: i64) -> Option<String> {
    let Some((holder, term, expires)) = row else {
        return Some(format!(
            "the registry holds no controller lease for scope {:?}",
            stamp.scope
        ));
    };
    if holder != stamp.holder || term != stamp.term {
        return Some(format!(
            "the lease of scope {:?} is held by {holder:?} under term {term}; this controller \
             ({:?}) acted under term {}",
            stamp.scope, stamp.holder, stamp.term
        ));
    }
    (expires <= now_ms).then(|| {
        format!(
            "this controller's lease (term {term}) expired {} ms ago without a renewal",
            now_ms - expires
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_evenly_up_to_its_capacity_and_never_backwards() {
        let b = Bucket {
            capacity: 100.0,
            per_ms: 600_000,
        };
        assert!((b.refill(0.0, 0, 60_000) - 10.0).abs() < 1e-9);
        assert!((b.refill(95.0, 0, 600_000) - 100.0).abs() < 1e-9);
        assert!((b.refill(5.0, 10_000, 0) - 5.0).abs() < 1e-9);
    }

    #[test]
    fn a_lease_fences_by_holder_term_and_expiry() {
        let s = Stamp {
            scope: "h".into(),
            holder: "me".into(),
            term: 3,
            tick: 1,
            bucket: Bucket {
                capacity: 1.0,
                per_ms: 1,
            },
            lease_ttl_ms: 1,
        };
        assert!(not_held(&s, Some(("me".into(), 3, 10)), 5).is_none());
        assert!(not_held(&s, Some(("me".into(), 4, 10)), 5).is_some());
        assert!(not_held(&s, Some(("you".into(), 3, 10)), 5).is_some());
        assert!(not_held(&s, Some(("me".into(), 3, 10)), 10).is_some());
        assert!(not_held(&s, None, 5).is_some());
    }
}
