//! fleet-retire: decide by Cedar policy which stale worker registrations may
//! be retired, and retire them in one guarded transaction, on a SQLite
//! registry or a PostgreSQL one.
//!
//! The data flows one way: the stores (`store`, one folder per engine behind
//! one seam) and `evidence` (the host: `/proc`, `kill(2)`, host identity,
//! randomness) are what touch the world → `observe` (Rust measures) →
//! `policy` (Cedar judges) → `plan` → `report`. Apply, the worker commands,
//! `serve`, `launch` and `copy` write, each through the store's seam.
#![deny(missing_docs)]

pub mod apply;
pub mod capability;
pub mod capture;
pub mod cli;
pub mod controller;
pub mod copy;
pub mod counterexample;
pub mod coverage;
pub mod diff;
pub mod difference;
pub mod error;
pub mod evidence;
pub mod explain;
pub mod export;
pub mod fingerprint;
pub mod fixture;
pub mod identity;
pub mod jsonfile;
pub mod junit;
pub mod launcher;
pub mod liveness;
pub mod mutate;
pub mod mutation_report;
pub mod observe;
pub mod outfile;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod reasons;
pub mod report;
pub mod row;
pub mod sarif;
pub mod serve;
pub mod signoff;
pub mod snapshot;
pub mod store;
pub mod text;
pub mod time;
pub mod value;
pub mod verify;
pub mod worker;
