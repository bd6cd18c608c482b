//! trireme-node integration tests: one binary, a module per area. Nodes run in-process on
//! 127.0.0.1 with a temporary data directory (the crash and cluster-process tests run the real
//! binary).

mod client_crate;
mod cluster;
mod cluster_anti_entropy;
mod cluster_dedup;
mod cluster_disk;
mod cluster_edges;
mod cluster_faults;
mod cluster_large;
mod cluster_links;
mod cluster_long_poll;
mod cluster_move_tasks;
mod cluster_names;
mod cluster_overload;
mod cluster_process;
mod cluster_purge;
mod cluster_retention;
mod cluster_tls;
mod cluster_trace;
mod connection_caps;
mod console;
mod crash;
mod disk_full;
mod failed_fsync;
mod harness;
mod long_poll;
mod loopback;
mod messages;
mod metrics;
mod overload;
mod queues;
mod redrive;
mod restart;
mod sqs;
mod validation;
