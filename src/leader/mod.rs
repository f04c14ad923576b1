//! Leader only: Lease, certificate authority, rotation, webhook-configuration upkeep (issue 4).
pub mod certs;
pub mod duration;
pub mod rotation;
pub mod webhook_config;
