//! The benchmark harness's tests, in one binary (one link, one executable on disk): each file is a
//! module, named as its tests are (`cargo test -p sluice-bench <module>::`).

mod engine;
mod locality;
