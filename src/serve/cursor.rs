//! Paging cursors: opaque to the caller, bound to one issued plan and one
//! list, and sealed by this server so that a cursor cannot be forged or
//! edited to reach another plan, another list or another filter.
//!
//! A cursor is `c1.<payload hex>.<seal hex>`: the payload is the plan's
//! registry token, the list, the reason-code filter, the offset and the page
//! size; the seal is HMAC-SHA256 of the payload under a key drawn at the
//! server's start, so cursors die with the server that issued them.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Which list of a plan a cursor pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum List {
    /// The plan tool's preserved rows (optionally of one reason code).
    Preserved,
    /// The whole document, candidates then preserved (the resource).
    Document,
    /// A snapshot's findings (optionally of one class).
    Findings,
    /// A snapshot's `workers`.
    Workers,
    /// A snapshot's `live_workers`.
    LiveWorkers,
    /// A snapshot's `stale_workers`.
    StaleWorkers,
    /// A snapshot's `historical_workers`.
    HistoricalWorkers,
}

/// Where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Position {
    /// The plan's key, both its tokens (`snapshot` for a snapshot's lists,
    /// which are read afresh for every page).
    pub(super) plan: String,
    /// The list paged.
    pub(super) list: List,
    /// Only rows of this primary reason code (preserved), or findings of
    /// this class (findings).
    pub(super) reason_code: Option<String>,
    /// How many rows of the list come before the next page.
    pub(super) offset: usize,
    /// Rows per page.
    pub(super) limit: usize,
}

/// The server's sealing key.
pub(super) struct Sealer {
    key: [u8; 32],
}

/// Why a cursor was refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Not a cursor this server wrote (malformed, edited, or of another
    /// server or an earlier run of this one).
    NotOurs,
}

impl Sealer {
    /// A key from the system's random source.
    pub(super) fn new() -> crate::error::Result<Sealer> {
        let hex = crate::evidence::random_hex(32)?;
        let key: [u8; 32] = Sha256::digest(hex.as_bytes()).into();
        Ok(Sealer { key })
    }

    /// A sealed cursor for `position`.
    pub(super) fn seal(&self, position: &Position) -> String {
        let payload = serde_json::to_vec(position).expect("a position serialises");
        let seal = self.mac(&payload);
        format!(
            "c1.{}.{}",
            crate::fingerprint::hex(&payload),
            crate::fingerprint::hex(&seal[..16])
        )
    }

    /// The position a cursor names, if this server sealed it.
    pub(super) fn open(&self, cursor: &str) -> Result<Position, Refused> {
        let mut parts = cursor.split('.');
        let (Some("c1"), Some(payload), Some(seal), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Refused::NotOurs);
        };
        let payload = unhex(payload).ok_or(Refused::NotOurs)?;
        let seal = unhex(seal).ok_or(Refused::NotOurs)?;
        let expected = self.mac(&payload);
        if !crate::text::same_bytes(&seal, &expected[..16]) {
            return Err(Refused::NotOurs);
        }
        serde_json::from_slice(&payload).map_err(|_| Refused::NotOurs)
    }

    /// HMAC-SHA256 (RFC 2104) of `message` under the server's key.
    fn mac(&self, message: &[u8]) -> [u8; 32] {
        let mut inner_pad = [0x36u8; 64];
        let mut outer_pad = [0x5cu8; 64];
        for (i, k) in self.key.iter().enumerate() {
            inner_pad[i] ^= k;
            outer_pad[i] ^= k;
        }
        let inner = Sha256::new()
            .chain_update(inner_pad)
            .chain_update(message)
            .finalize();
        Sha256::new()
            .chain_update(outer_pad)
            .chain_update(inner)
            .finalize()
            .into()
    }
}

/// Lowercase or uppercase hex to bytes.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 8192 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position() -> Position {
        Position {
            plan: "abc".into(),
            list: List::Preserved,
            reason_code: Some("pid_alive".into()),
            offset: 100,
            limit: 50,
        }
    }

    #[test]
    fn a_sealed_cursor_opens_to_its_position() {
        let s = Sealer::new().unwrap();
        assert_eq!(s.open(&s.seal(&position())), Ok(position()));
    }

    /// The RFC 4231 test case 2 ("Jefe"), with the key padded as HMAC pads
    /// a short key: the seal is HMAC-SHA256 and nothing homemade.
    #[test]
    fn the_seal_is_hmac_sha256() {
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let s = Sealer { key };
        assert_eq!(
            crate::fingerprint::hex(&s.mac(b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn an_edited_or_foreign_cursor_is_refused() {
        let s = Sealer::new().unwrap();
        let sealed = s.seal(&position());
        let mut other = position();
        other.offset = 0;
        let other_payload = crate::fingerprint::hex(&serde_json::to_vec(&other).unwrap());
        let parts: Vec<&str> = sealed.split('.').collect();
        let edited = format!("c1.{other_payload}.{}", parts[2]);
        assert_eq!(s.open(&edited), Err(Refused::NotOurs));
        assert_eq!(Sealer::new().unwrap().open(&sealed), Err(Refused::NotOurs));
        for junk in ["", "c1", "c1..", "c2.00.00", "c1.zz.zz", "c1.00.00.00"] {
            assert_eq!(s.open(junk), Err(Refused::NotOurs), "{junk}");
        }
    }
}
