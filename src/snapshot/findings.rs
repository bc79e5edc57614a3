//! What a snapshot can find: every finding class, its severity and whether
//! it blocks, stated once. A class blocks exactly when its severity is
//! `blocker`: one truth, so a report can never call a finding a warning and
//! still count it against the fleet (docs/semantics.md, "Snapshot
//! findings", says where this differs from the seed).

use super::live::{ids, reported_identity, reported_instance, truthy_text, LiveWorker};
use super::measure::Measured;
use crate::row::{Col, Row};
use serde::ser::SerializeStruct;
use serde_json::Value as Json;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The live fleet is not safe while it stands.
    Blocker,
    /// Worth a look; does not make the fleet unsafe.
    Warning,
    /// For the record.
    Info,
}

impl Severity {
    /// As written in snapshots.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Blocker => "blocker",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

macro_rules! classes {
    ($($variant:ident => $code:literal, $severity:ident, $what:literal;)*) => {
        /// A finding class.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum FindingClass {
            $(#[doc = $what] $variant,)*
        }

        impl FindingClass {
            /// Every class, in the order `docs/snapshot-findings.md` lists them.
            pub const ALL: &'static [FindingClass] = &[$(FindingClass::$variant),*];

            /// The stable code.
            pub fn code(self) -> &'static str {
                match self { $(FindingClass::$variant => $code),* }
            }

            /// Its severity.
            pub fn severity(self) -> Severity {
                match self { $(FindingClass::$variant => Severity::$severity),* }
            }

            /// One line saying what it means.
            pub fn description(self) -> &'static str {
                match self { $(FindingClass::$variant => $what),* }
            }

            /// The class with this code.
            pub fn from_code(code: &str) -> Option<FindingClass> {
                match code { $($code => Some(FindingClass::$variant),)* _ => None }
            }
        }
    };
}

classes! {
    WorkerIdentityCollision => "worker_identity_collision", Blocker,
        "one worker identity is claimed by more than one live row";
    SessionIdentityCollision => "session_identity_collision", Blocker,
        "a session is shared by live workers of several instances, or twice in one namespace";
    GenerationIdentityCollision => "generation_identity_collision", Blocker,
        "a generation is contested across namespaces or instances";
    ProcessIdentityCollision => "process_identity_collision", Blocker,
        "one process identity is shared by distinct live workers";
    PidCollision => "pid_collision", Blocker,
        "one pid is shared by distinct live workers";
    OwnershipFencingCollision => "ownership_fencing_collision", Blocker,
        "one fencing token (generation and epoch) spans several instances";
    DuplicateNamespaceWorker => "duplicate_namespace_worker", Blocker,
        "an instance has more than one live worker for a namespace";
    InstanceIdCollision => "instance_id_collision", Blocker,
        "one instance id is live under several client types";
    LegacyIncompleteIdentity => "legacy_incomplete_identity", Blocker,
        "a live worker has no launcher-minted instance identity";
    UnknownClient => "unknown_client", Blocker,
        "a live worker's client type is not recognised";
    ForeignRepository => "foreign_repository", Blocker,
        "a live worker is bound to another repository than the canonical one";
    OldRevision => "old_revision", Blocker,
        "a live worker runs another revision than the expected one";
    OrphanedUnowned => "orphaned_unowned", Blocker,
        "a live worker has no session that owns it";
    StaleOrphanedWorker => "stale_orphaned_worker", Blocker,
        "a row is active in the registry but its worker is not live";
    HistoricalDead => "historical_dead", Info,
        "a row that is no longer active (kept as history)";
    MissingExpected => "missing_expected", Blocker,
        "an instance on the approved manifest is not live";
    Unmanifested => "unmanifested", Blocker,
        "a live instance is not on the approved manifest";
}

impl FindingClass {
    /// Whether it makes the live fleet unsafe: exactly when it is a blocker.
    pub fn blocks(self) -> bool {
        self.severity() == Severity::Blocker
    }
}

impl std::fmt::Display for FindingClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

impl serde::Serialize for FindingClass {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

/// One finding of the snapshot.
#[derive(Debug, Clone)]
pub struct Finding {
    /// Its class; severity and blocking follow from it.
    pub classification: FindingClass,
    /// In words.
    pub detail: String,
    /// The instances it names.
    pub client_instance_ids: Vec<String>,
    /// The workers it names (as stored: NULL stays null).
    pub worker_identities: Vec<Json>,
}

impl serde::Serialize for Finding {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Finding", 6)?;
        st.serialize_field("classification", &self.classification)?;
        st.serialize_field("severity", self.classification.severity().as_str())?;
        st.serialize_field("active_blocker", &self.classification.blocks())?;
        st.serialize_field("detail", &self.detail)?;
        st.serialize_field("client_instance_ids", &self.client_instance_ids)?;
        st.serialize_field("worker_identities", &self.worker_identities)?;
        st.end()
    }
}

/// The findings a detector adds to.
pub(super) struct Findings(pub(super) Vec<Finding>);

impl Findings {
    /// Add a finding naming `workers` and, unless given, their instances.
    pub(super) fn add(
        &mut self,
        class: FindingClass,
        workers: &[&LiveWorker],
        instances: Option<Vec<String>>,
        detail: String,
    ) {
        let instance_ids = instances.unwrap_or_else(|| {
            ids(workers, |w| &w.client_instance_id)
                .into_iter()
                .collect()
        });
        self.0.push(Finding {
            classification: class,
            detail,
            client_instance_ids: instance_ids,
            worker_identities: workers
                .iter()
                .map(|w| w.worker_identity.to_json())
                .collect(),
        });
    }
}

/// The finding about one row that is not live, if any: stale rows are
/// `stale_orphaned_worker`, historical ones `historical_dead`. They are
/// derived from what was measured whenever they are read, never stored: a
/// large registry is mostly such rows.
pub(super) fn row_finding(row: &Row, m: &Measured) -> Option<Finding> {
    let wid = row.get(Col::WorkerIdentity);
    let (class, detail) = if m.stale() {
        (
            FindingClass::StaleOrphanedWorker,
            format!(
                "worker {} is active in the registry but not live (stale heartbeat or dead \
                 pid); `fleet-retire plan` says whether it may be retired",
                wid.to_json()
            ),
        )
    } else if m.historical {
        (
            FindingClass::HistoricalDead,
            format!(
                "historical registration {} (status {}) is not an active blocker",
                wid.to_json(),
                row.get(Col::Status).to_json()
            ),
        )
    } else {
        return None;
    };
    Some(Finding {
        classification: class,
        detail,
        client_instance_ids: truthy_text(&reported_instance(row, m))
            .into_iter()
            .collect(),
        worker_identities: vec![reported_identity(row).to_json()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_round_trip() {
        let mut seen = std::collections::BTreeSet::new();
        for c in FindingClass::ALL {
            assert!(seen.insert(c.code()), "{} twice", c.code());
            assert_eq!(FindingClass::from_code(c.code()), Some(*c));
        }
        assert_eq!(seen.len(), 17);
    }

    #[test]
    fn a_stale_row_blocks_and_says_so() {
        let c = FindingClass::StaleOrphanedWorker;
        assert!(c.blocks());
        assert_eq!(c.severity(), Severity::Blocker);
        assert!(!FindingClass::HistoricalDead.blocks());
    }

    #[test]
    fn every_class_is_documented() {
        let doc = include_str!("../../docs/snapshot-findings.md");
        for c in FindingClass::ALL {
            let line = format!("| `{}` | {} |", c.code(), c.severity().as_str());
            assert!(
                doc.contains(&line),
                "docs/snapshot-findings.md lacks {line:?}"
            );
        }
    }
}
