//! The `sluice` command's tests, in one binary (one link, one executable on disk): each file is a
//! module, named as its tests are (`cargo test -p sluice-cli <module>::`).

mod autoscale_service;
mod cli;
mod common;
mod config;
mod dashboard;
mod dashboard_local;
mod kube_scaler;
mod profile;
mod prometheus;
mod stream_push;
mod trace;
mod up;
