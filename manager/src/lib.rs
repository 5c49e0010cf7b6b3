//! The qosd manager: control loop, policies, daemon, API and the CLI's
//! subcommands. The `qosd` binary (`main.rs`) only dispatches to `cmd`.

pub mod cmd;
pub mod config;
pub mod daemon;
pub mod exit;
pub mod kube;
pub mod node;
pub mod paths;
/// The policies live in their own crate (no I/O, no manager types);
/// `qosd_manager::policy` stays their path here.
pub use qosd_policy as policy;
pub mod secs;
pub mod signals;
/// The YAML file reader (moved to qosd-core, shared with the scenarios).
pub use qosd_core::yamlfile;
