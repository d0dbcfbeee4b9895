//! The service's integration tests, in one binary (one link, one executable on disk): each file is a
//! module, named as its tests are (`cargo test -p sluice-service <module>::`).

mod hostile;
mod hostile_jobs;
mod service;
mod service_cache;
mod service_failures;
mod service_importance;
mod service_map;
mod service_mix;
mod service_records;
mod service_trace;
mod support;
mod user_code_limits;

// The entry a dispatcher or worker process re-runs this binary as (support::spawn_*).
support::serve_entry!();
