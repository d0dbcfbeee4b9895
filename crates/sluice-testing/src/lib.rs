//! Test support shared by the crates' integration tests (a dev-dependency, never linked
//! into the product). A failed setup here is a failed test, so it unwraps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod hostile;
pub mod threads;
