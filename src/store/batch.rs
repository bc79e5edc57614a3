//! The row-batch builder every engine's registry reader uses: rows are
//! built as the engine hands over their cells, a batch's texts copied into
//! one buffer (a text its column repeats, once), checked as UTF-8 in one
//! pass, and shared by the batch's rows (`crate::value::TextBuf`), so no
//! value costs an allocation of its own.

use crate::row::{Col, PendingRow, Row};
use crate::value::{TextBuf, Value};

/// One column of the current row as the engine hands it over, borrowed
/// until its next row.
#[derive(Debug, Clone, Copy)]
pub enum Cell<'s> {
    /// NULL.
    Null,
    /// An integer.
    Int(i64),
    /// A real.
    Real(f64),
    /// Text, as bytes (checked as UTF-8 when its batch is finished).
    Text(&'s [u8]),
    /// A blob.
    Blob(&'s [u8]),
}

/// Why a batch could not take a row; `row` counts from the reader's first.
#[derive(Debug)]
pub enum BatchError {
    /// A text that is not UTF-8.
    NotUtf8 {
        /// Its row.
        row: usize,
        /// Its column.
        col: Col,
    },
    /// A text past 4 GiB into its batch (offsets are 32-bit).
    TooLong {
        /// Its row.
        row: usize,
        /// Its column.
        col: Col,
    },
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchError::NotUtf8 { row, col } => write!(
                f,
                "row {}: column `{}`: text is not valid UTF-8",
                row + 1,
                col.name()
            ),
            BatchError::TooLong { row, col } => write!(
                f,
                "row {}: column `{}`: a text past 4 GiB into its batch of rows",
                row + 1,
                col.name()
            ),
        }
    }
}

/// A batch's text buffer stops growing past this (the texts' offsets are
/// 32-bit); the batch is finished early instead.
const BATCH_TEXT_LIMIT: usize = 1 << 30;

const BATCH_ROWS: usize = 1024;

/// Rows read whose texts wait for their buffer.
pub struct RowBatch {
    rows: Vec<PendingRow>,
    text: Vec<u8>,
    /// Per column, its last texts in this batch.
    recent: Vec<Recent>,
}

impl RowBatch {
    /// An empty batch for rows of `columns` columns.
    pub fn new(columns: usize) -> RowBatch {
        RowBatch {
            rows: Vec::new(),
            text: Vec::new(),
            recent: (0..columns).map(|_| Recent::default()).collect(),
        }
    }

    /// Add one row: the cell of each column of `present`, by position.
    /// `first` is how many rows the reader has finished before this batch
    /// (for the row number an error names).
    #[inline]
    pub fn push_row<'s>(
        &mut self,
        present: &[Col],
        first: usize,
        cell: impl Fn(usize) -> Cell<'s>,
    ) -> Result<(), BatchError> {
        let mut row = PendingRow::default();
        for (i, col) in present.iter().enumerate() {
            match cell(i) {
                Cell::Null => {}
                Cell::Int(x) => row.set_int(*col, x),
                Cell::Real(x) => row.set_real(*col, x),
                Cell::Text(t) => {
                    let (start, len) = self.text(t, i);
                    let (Ok(start), Ok(len)) = (u32::try_from(start), u32::try_from(len)) else {
                        return Err(BatchError::TooLong {
                            row: first + self.rows.len(),
                            col: *col,
                        });
                    };
                    row.set_range(*col, start, len);
                }
                Cell::Blob(b) => row.set(*col, Value::Blob(b.into())),
            }
        }
        self.rows.push(row);
        Ok(())
    }

    /// Whether the batch should be finished before the next row.
    pub fn full(&self) -> bool {
        self.rows.len() == BATCH_ROWS || self.text.len() > BATCH_TEXT_LIMIT
    }

    /// Where text `t` of column `i` is in the buffer: stored now, or
    /// found stored.
    fn text(&mut self, t: &[u8], i: usize) -> (usize, usize) {
        let recent = &mut self.recent[i];
        if let Some(range) = recent.find(&self.text, t) {
            return (range.start, range.len());
        }
        let at = self.text.len();
        self.text.extend_from_slice(t);
        recent.remember(&(at..self.text.len()));
        (at, t.len())
    }

    /// The batch's rows, each slicing the one checked buffer, appended to
    /// `rows`; the batch is empty again.
    pub fn finish_into(&mut self, rows: &mut Vec<Row>) -> Result<(), BatchError> {
        let pending = std::mem::take(&mut self.rows);
        let text = std::mem::take(&mut self.text);
        let first = rows.len();
        let buf = match String::from_utf8(text) {
            Ok(t) => TextBuf::new(t),
            Err(e) => {
                // Name the first value that is not UTF-8.
                let bytes = e.into_bytes();
                let (row, col) = pending
                    .iter()
                    .enumerate()
                    .find_map(|(n, p)| {
                        p.text_ranges()
                            .find(|(_, r)| std::str::from_utf8(&bytes[r.clone()]).is_err())
                            .map(|(col, _)| (n, col))
                    })
                    .unwrap_or((0, Col::WorkerIdentity));
                return Err(BatchError::NotUtf8 {
                    row: first + row,
                    col,
                });
            }
        };
        self.recent.iter_mut().for_each(Recent::forget);
        rows.reserve(pending.len());
        for (n, p) in pending.into_iter().enumerate() {
            // Each text was valid on its own, so its bounds are character
            // boundaries of the whole; a row whose are not is refused.
            let row = p.finish(buf.clone()).map_err(|col| BatchError::NotUtf8 {
                row: first + n,
                col,
            })?;
            rows.push(row);
        }
        Ok(())
    }
}

/// A column's last few distinct texts in the current batch, so a repeated
/// text (a role, a status, a revision: half of a real registry's text) is
/// stored once per batch and its values share the bytes. A column whose
/// texts rarely repeat stops looking after a sample.
#[derive(Default)]
struct Recent {
    ranges: [(u32, u32); RECENT],
    known: usize,
    tries: u32,
    hits: u32,
}

const RECENT: usize = 8;

impl Recent {
    /// The range of an equal text already in `buf`, if one is known.
    fn find(&mut self, buf: &[u8], t: &[u8]) -> Option<std::ops::Range<usize>> {
        if self.tries >= 1024 && self.hits < self.tries / 4 {
            return None;
        }
        self.tries = self.tries.saturating_add(1);
        let found = self.ranges[..self.known]
            .iter()
            .map(|&(at, len)| at as usize..(at + len) as usize)
            .find(|r| crate::text::same_bytes(&buf[r.clone()], t))?;
        self.hits = self.hits.saturating_add(1);
        Some(found)
    }

    /// Remember a text just stored at `range`.
    fn remember(&mut self, range: &std::ops::Range<usize>) {
        let (Ok(at), Ok(len)) = (u32::try_from(range.start), u32::try_from(range.len())) else {
            return;
        };
        self.ranges.copy_within(0..RECENT - 1, 1);
        self.ranges[0] = (at, len);
        self.known = (self.known + 1).min(RECENT);
    }

    /// A new batch (a new buffer): nothing in it is known yet.
    fn forget(&mut self) {
        self.known = 0;
    }
}
