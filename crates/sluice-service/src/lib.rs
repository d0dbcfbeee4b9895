//! sluice as a service.
