//! The registry row model (docs/semantics.md §5): the columns the program knows, in
//! one place, and a row as the values read for them.

use crate::value::Value;

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

/// One registration as read: a value for every known column (NULL for a
/// column the registry does not have). Unknown columns are not kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    values: Vec<Value>,
}

impl Default for Row {
    fn default() -> Self {
        Row {
            values: vec![Value::Null; COLUMNS.len()],
        }
    }
}

impl Row {
    /// The value of a column.
    pub fn get(&self, col: Col) -> &Value {
        &self.values[col as usize]
    }

    /// Set the value of a column.
    pub fn set(&mut self, col: Col, value: Value) {
        self.values[col as usize] = value;
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
