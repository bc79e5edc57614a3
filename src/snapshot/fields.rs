//! A worker's fields as the snapshot reads them from its JSON view: the
//! texts the seed keeps (Python's `str()` of a truthy value), shared by the
//! detectors and the findings they record.

use crate::value::Value;
use serde_json::Value as Json;
use std::collections::BTreeSet;

/// Python's `str(v)` when `v` is truthy (`if v:`): how the seed keeps
/// instance ids, namespaces and fleet runs. Unlike a collision key, the text
/// `"None"` is a name like any other here.
pub(super) fn truthy_text(v: &Json) -> Option<String> {
    let value = Value::from_json(v).ok()?;
    value.truthy().then(|| value.py_str())
}

/// The distinct truthy texts of `field` among `workers`.
pub(super) fn ids(workers: &[&Json], field: &str) -> BTreeSet<String> {
    workers
        .iter()
        .filter_map(|w| truthy_text(&w[field]))
        .collect()
}
