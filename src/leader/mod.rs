//! Leader only: Lease, certificate authority, rotation, webhook-configuration upkeep (issue 4).
