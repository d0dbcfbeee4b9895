//! The streaming tests, in one binary (one link, one executable on disk): each file is a
//! module, named as its tests are (`cargo test -p sluice-stream <module>::`).

mod common;
mod distributed;
mod engine;
mod exactly_once;
mod hostile_peers;
mod liveness;
mod policies;
mod restore;
