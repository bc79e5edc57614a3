//! The fence of an apply a controller makes (docs/controller.md): inside
//! the transaction, the controller's lease must still be its own with the
//! same term and unexpired (else `leadership_lost`), and its targets must
//! fit the host's budget (else `budget_exhausted`); the apply's term and
//! tick are recorded beside its audit rows. A hand apply has no stamp and
//! none of this runs.

use super::{Abort, Outcome, Txn};
use crate::store::seam::Refused;

/// Right after the registry's shape is checked, before anything is
/// judged: a deposed controller stops here.
pub(super) fn still_leading(t: &mut Txn) -> std::result::Result<(), Abort> {
    let Some(stamp) = &t.req.controller else {
        return Ok(());
    };
    match t.tx.controller_holds(stamp)? {
        None => Ok(()),
        Some(why) => Err(Abort::Refuse(
            Outcome::LeadershipLost,
            format!("{why}; nothing was retired: this controller no longer leads"),
        )),
    }
}

/// Once the targets are known, before the first write: the lease once
/// more, then the budget spent and the term and tick recorded.
pub(super) fn spend(t: &mut Txn, apply_id: &str, targets: usize) -> std::result::Result<(), Abort> {
    let Some(stamp) = t.req.controller.clone() else {
        return Ok(());
    };
    still_leading(t)?;
    match t.tx.controller_record(&stamp, apply_id, targets)? {
        None => Ok(()),
        Some(Refused::Lease(why)) => Err(Abort::Refuse(
            Outcome::LeadershipLost,
            format!("{why}; nothing was retired: this controller no longer leads"),
        )),
        Some(Refused::Budget(why)) => Err(Abort::Refuse(
            Outcome::BudgetExhausted,
            format!("{why}; nothing was retired"),
        )),
    }
}
