//! Autoscaling: match the CPU units that produce batches (a loader's threads, a service's
//! worker processes) to the rate the trainer consumes them.
//!
//! The pieces, as DESIGN.md lays them out: [`signals`] turns raw counters (batches handed
//! out, time the trainer waited, busy unit-seconds) into one [`Window`] of production,
//! consumption and stall; a [`Policy`] reads windows and names a target unit count; the
//! [`Autoscaler`] keeps the policy within its bounds, records every decision with its
//! inputs and leaves actuation (threads, processes, replicas) to its caller. Everything
//! here is pure logic on numbers, so every policy is unit-tested without clocks or threads.

pub mod controller;
pub mod policy;
pub mod signals;

pub use controller::{AutoscaleConfig, AutoscaleStats, Autoscaler, ConfigError, Decision};
pub use policy::{Policy, PolicyKind, UnknownPolicy};
pub use signals::{
    per_second, AcceleratorBusy, AcceleratorMeter, BusySource, JobRates, Meter, RateMeter, Window, WindowBy,
};
