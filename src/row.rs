//! The registry row model (docs/semantics.md §5): the columns the program knows, in
//! one place, and a row as the values read for them.

use crate::value::{TextBuf, Val, Value};
use std::sync::Arc;

macro_rules! columns {
    ($($variant:ident => $name:literal),* $(,)?) => {
        /// A column of `worker_registrations` the program knows.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(missing_docs)]
        pub enum Col { $($variant),* }

        /// Every known column, in schema order.
        pub const COLUMNS: &[Col] = &[$(Col::$variant),*];

        impl Col {
            /// The SQL column name.
            pub fn name(self) -> &'static str {
                match self { $(Col::$variant => $name),* }
            }
            /// Look a column up by its SQL name.
            pub fn from_name(name: &str) -> Option<Col> {
                match name { $($name => Some(Col::$variant),)* _ => None }
            }
        }
    };
}

columns! {
    WorkerIdentity => "worker_identity",
    ClientName => "client_name",
    ClientInstanceId => "client_instance_id",
    InstanceIdSource => "instance_id_source",
    InstanceIdProvenance => "instance_id_provenance",
    SessionId => "session_id",
    GenerationId => "generation_id",
    Role => "role",
    Profile => "profile",
    Namespace => "namespace",
    Remote => "remote",
    RepositoryBinding => "repository_binding",
    AuthenticatedAccount => "authenticated_account",
    FleetRunId => "fleet_run_id",
    Transport => "transport",
    ProcessIdentity => "process_identity",
    Pid => "pid",
    StartedAt => "started_at",
    LastHeartbeatAt => "last_heartbeat_at",
    HeartbeatTtlSeconds => "heartbeat_ttl_seconds",
    FencingEpoch => "fencing_epoch",
    Status => "status",
    HostId => "host_id",
    BootId => "boot_id",
    ProcessStartTime => "process_start_time",
    PidNamespace => "pid_namespace",
    TokenFingerprint => "token_fingerprint",
    StartupRevision => "startup_revision",
    LoadedRevision => "loaded_revision",
    ParityRevision => "parity_revision",
    LiveRevision => "live_revision",
    RetiredAt => "retired_at",
    RetiredBy => "retired_by",
    RetirementReason => "retirement_reason",
}

/// How many columns the program knows.
pub const WIDTH: usize = COLUMNS.len();

/// One registration as read: a value for every known column (NULL for a
/// column the registry does not have). Unknown columns are not kept.
///
/// A row read from SQLite keeps its texts as ranges of the buffer its batch
/// of rows was read into, shared by that batch. A field is a one-byte kind
/// and an eight-byte payload (the integer, the real's bits, the text's
/// range), so a row is one reference count and about 340 bytes where 34
/// [`Value`]s would be 816 bytes and a reference count per text.
/// [`Row::get`] lends a field out as a [`Val`].
#[derive(Clone)]
pub struct Row {
    buf: Arc<TextBuf>,
    cells: Box<Cells>,
}

#[derive(Clone)]
struct Cells {
    kinds: [Kind; WIDTH],
    payloads: [u64; WIDTH],
    /// Values set on their own (a fixture, PostgreSQL, a blob, an apply's
    /// write) keep their own storage here; an `Owned` payload indexes it.
    owned: Vec<Value>,
}

/// What a field's payload holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Int,
    Real,
    Bool,
    /// `buf[start..start + len]`, `start` in the low 32 bits: checked to lie
    /// on character boundaries within the row's buffer when it was set.
    Text,
    Owned,
}

impl Default for Row {
    fn default() -> Self {
        static EMPTY: std::sync::OnceLock<Arc<TextBuf>> = std::sync::OnceLock::new();
        Row::in_buffer(EMPTY.get_or_init(|| TextBuf::new(String::new())).clone())
    }
}

impl PartialEq for Row {
    fn eq(&self, other: &Row) -> bool {
        COLUMNS.iter().all(|c| self.get(*c) == other.get(*c))
    }
}

impl std::fmt::Debug for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(COLUMNS.iter().map(|c| (c.name(), self.get(*c))))
            .finish()
    }
}

impl Row {
    /// Whether the row's status is exactly the text `active` (a worker's
    /// registration in force). Every reader asks this one question: an
    /// integer, a NULL, `"Active"` or `" active"` is not active. (The seed
    /// asks `str(status or "") == "active"`, which is the same test.)
    pub fn is_active(&self) -> bool {
        self.get(Col::Status).as_text() == Some("active")
    }

    /// A row of NULLs whose texts will be slices of `buf`.
    pub fn in_buffer(buf: Arc<TextBuf>) -> Row {
        Row {
            buf,
            cells: Cells::empty(),
        }
    }

    /// The value of a column.
    pub fn get(&self, col: Col) -> Val<'_> {
        let i = col as usize;
        let payload = self.cells.payloads[i];
        match self.cells.kinds[i] {
            Kind::Null => Val::Null,
            Kind::Int => Val::Int(payload as i64),
            Kind::Real => Val::Real(f64::from_bits(payload)),
            Kind::Bool => Val::Bool(payload != 0),
            Kind::Text => {
                let start = payload as u32 as usize;
                let range = start..start + (payload >> 32) as usize;
                let text = self.buf.as_str();
                debug_assert!(text.get(range.clone()).is_some());
                // SAFETY: a row's text field is made only by `set_slice`
                // or `PendingRow::finish`, each of which checked that its
                // range lies within this row's buffer on character
                // boundaries; the buffer (a `Box<str>` behind an
                // `Arc`) never changes, and a row's buffer is never
                // replaced. Every field read goes through here, so the
                // check is not repeated on every read.
                Val::Text(unsafe { text.get_unchecked(range) })
            }
            Kind::Owned => self.cells.owned[payload as usize].as_val(),
        }
    }

    /// The columns in which `other` holds another value than this row: the
    /// storage class and the value exactly (a real by its bits, so `0.0`
    /// and `-0.0` differ). Every column the program reads takes part: what
    /// apply compares a changed row with the version judged (docs/apply.md,
    /// "Under the lock").
    pub fn columns_differing<'r>(&'r self, other: &'r Row) -> impl Iterator<Item = Col> + 'r {
        COLUMNS
            .iter()
            .copied()
            .filter(move |c| match (self.get(*c), other.get(*c)) {
                (Val::Real(a), Val::Real(b)) => a.to_bits() != b.to_bits(),
                (a, b) => a != b,
            })
    }

    /// The columns whose value is blank (NULL, or text of Python white space
    /// only): bit `c as usize` for column `c`.
    pub fn blank_columns(&self) -> u64 {
        const _: () = assert!(COLUMNS.len() <= 64, "a bit per column");
        COLUMNS
            .iter()
            .filter(|c| self.get(**c).is_blank())
            .fold(0, |bits, c| bits | 1 << *c as u64)
    }

    /// Ask the processor to start loading this row's fields and the start
    /// of its texts, ahead of a walk that will read them out of order.
    #[inline]
    pub fn prefetch(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let cells: *const Cells = &*self.cells;
            let base = cells.cast::<i8>();
            // SAFETY: prefetching is a hint; it never faults and reads
            // nothing into the program. Every address is within the row's
            // own allocations.
            unsafe {
                for line in (0..size_of::<Cells>()).step_by(64) {
                    _mm_prefetch(base.wrapping_add(line), _MM_HINT_T0);
                }
            }
        }
    }

    /// Ask for the row's first text (in column order) to be loaded.
    #[inline]
    pub fn prefetch_texts(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let Some(i) = self.cells.kinds.iter().position(|k| *k == Kind::Text) else {
                return;
            };
            let start = self.cells.payloads[i] as u32 as usize;
            let text = self.buf.as_str().as_bytes();
            let base = text.as_ptr().cast::<i8>();
            // SAFETY: as above; the addresses are within the row's buffer.
            unsafe {
                for line in (0..384usize).step_by(64) {
                    _mm_prefetch(
                        base.wrapping_add((start + line).min(text.len())),
                        _MM_HINT_T0,
                    );
                }
            }
        }
    }

    /// Set the value of a column.
    pub fn set(&mut self, col: Col, value: Value) {
        self.cells.set(col, value);
    }

    /// Set a column to the text `range` of this row's buffer. `false` (and
    /// nothing set) when the range is not within the buffer on character
    /// boundaries, or does not fit 32 bits.
    pub fn set_slice(&mut self, col: Col, range: std::ops::Range<usize>) -> bool {
        if self.buf.as_str().get(range.clone()).is_none() {
            return false;
        }
        let (Ok(start), Ok(len)) = (u32::try_from(range.start), u32::try_from(range.len())) else {
            return false;
        };
        self.cells.kinds[col as usize] = Kind::Text;
        self.cells.payloads[col as usize] = u64::from(start) | u64::from(len) << 32;
        true
    }

    /// Build a row from a JSON object (fixtures). Keys the program does not
    /// know are ignored, as unknown registry columns are.
    pub fn from_json(obj: &serde_json::Map<String, serde_json::Value>) -> Result<Row, String> {
        let mut row = Row::default();
        for (key, v) in obj {
            if let Some(col) = Col::from_name(key) {
                let value = Value::from_json(v).map_err(|e| format!("field `{key}`: {e}"))?;
                row.set(col, value);
            }
        }
        Ok(row)
    }
}

impl Cells {
    fn empty() -> Box<Cells> {
        Box::new(Cells {
            kinds: [Kind::Null; WIDTH],
            payloads: [0; WIDTH],
            owned: Vec::new(),
        })
    }

    fn set(&mut self, col: Col, value: Value) {
        let i = col as usize;
        let (kind, payload) = match value {
            Value::Null => (Kind::Null, 0),
            Value::Int(x) => (Kind::Int, x as u64),
            Value::Real(f) => (Kind::Real, f.to_bits()),
            Value::Bool(b) => (Kind::Bool, b as u64),
            // A field already owned keeps its slot; a slot a field leaves
            // stays unused until the row is dropped (rows are rarely set
            // after they are read: fixtures, an apply's few writes).
            other if self.kinds[i] == Kind::Owned => {
                self.owned[self.payloads[i] as usize] = other;
                return;
            }
            other => {
                self.owned.push(other);
                (Kind::Owned, (self.owned.len() - 1) as u64)
            }
        };
        self.kinds[i] = kind;
        self.payloads[i] = payload;
    }
}

/// A row being read straight from the store, before its batch's text
/// buffer is complete: its texts are ranges of that buffer, checked when
/// [`PendingRow::finish`] attaches it.
pub struct PendingRow(Box<Cells>);

impl Default for PendingRow {
    fn default() -> Self {
        PendingRow(Cells::empty())
    }
}

impl PendingRow {
    /// Set a column to an integer.
    pub fn set_int(&mut self, col: Col, x: i64) {
        self.0.kinds[col as usize] = Kind::Int;
        self.0.payloads[col as usize] = x as u64;
    }

    /// Set a column to a real.
    pub fn set_real(&mut self, col: Col, x: f64) {
        self.0.kinds[col as usize] = Kind::Real;
        self.0.payloads[col as usize] = x.to_bits();
    }

    /// Set a column to `len` bytes at `start` of the buffer to come.
    pub fn set_range(&mut self, col: Col, start: u32, len: u32) {
        self.0.kinds[col as usize] = Kind::Text;
        self.0.payloads[col as usize] = u64::from(start) | u64::from(len) << 32;
    }

    /// Set a column to a value of its own (a blob).
    pub fn set(&mut self, col: Col, value: Value) {
        self.0.set(col, value);
    }

    /// The text ranges set so far, by column.
    pub fn text_ranges(&self) -> impl Iterator<Item = (Col, std::ops::Range<usize>)> + '_ {
        COLUMNS.iter().filter_map(|c| {
            let i = *c as usize;
            (self.0.kinds[i] == Kind::Text).then(|| {
                let p = self.0.payloads[i];
                let start = p as u32 as usize;
                (*c, start..start + (p >> 32) as usize)
            })
        })
    }

    /// The row, its texts slices of `buf`; or the first column whose range
    /// is not within `buf` on character boundaries.
    pub fn finish(self, buf: Arc<TextBuf>) -> Result<Row, Col> {
        let text = buf.as_str();
        if let Some((col, _)) = self
            .text_ranges()
            .find(|(_, r)| text.get(r.clone()).is_none())
        {
            return Err(col);
        }
        Ok(Row { buf, cells: self.0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field reads back as it was set, whichever way it was stored, and a
    /// slice outside the buffer or off a character boundary is refused.
    #[test]
    fn fields_read_back_as_set() {
        let buf = TextBuf::new("héllo world".to_string());
        let mut row = Row::in_buffer(buf);
        assert!(row.set_slice(Col::Role, 0..6));
        assert!(row.set_slice(Col::Remote, 7..12));
        assert!(!row.set_slice(Col::Profile, 0..2), "splits the é");
        assert!(!row.set_slice(Col::Profile, 7..13), "past the end");
        row.set(Col::Pid, Value::Int(-4));
        row.set(Col::HeartbeatTtlSeconds, Value::Real(0.5));
        row.set(Col::Status, Value::Text("active".into()));
        row.set(Col::BootId, Value::Blob(vec![0, 1].into()));
        assert_eq!(row.get(Col::Role), Val::Text("héllo"));
        assert_eq!(row.get(Col::Remote), Val::Text("world"));
        assert_eq!(row.get(Col::Profile), Val::Null);
        assert_eq!(row.get(Col::Pid), Val::Int(-4));
        assert_eq!(row.get(Col::HeartbeatTtlSeconds), Val::Real(0.5));
        assert_eq!(row.get(Col::Status), Val::Text("active"));
        assert_eq!(row.get(Col::BootId), Val::Blob(&[0, 1]));
        let copy = row.clone();
        assert_eq!(copy, row);
        row.set(Col::Role, Value::Null);
        assert_ne!(copy, row);
        assert_eq!(copy.get(Col::Role), Val::Text("héllo"));
        row.set(Col::BootId, Value::Blob(vec![2].into()));
        row.set(Col::Status, Value::Int(7));
        row.set(Col::Profile, Value::Text("p".into()));
        assert_eq!(row.get(Col::BootId), Val::Blob(&[2]));
        assert_eq!(row.get(Col::Status), Val::Int(7));
        assert_eq!(row.get(Col::Profile), Val::Text("p"));
        assert_eq!(copy.get(Col::BootId), Val::Blob(&[0, 1]));
        assert_eq!(copy.get(Col::Status), Val::Text("active"));
    }
}
