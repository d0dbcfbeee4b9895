//! The live dashboard and the `/metrics` endpoint, shared by the service's dispatcher and
//! a local loader:
//!
//! * [`page`]: the one static page and its routes (`/`, `/dashboard`, `/api/state`,
//!   `/api/autoscale`); [`view`]: the JSON it draws.
//! * [`metrics`]: one scrape's metrics (`prometheus-client`) and the HTTP server that
//!   serves them at `/metrics`, with the page's routes beside them.
//! * [`serve_loader`]: a local loader's dashboard (`sluice run --dashboard ADDR`). The
//!   dispatcher's (its state as a [`view::DispatcherView`]) is sluice-service's.

pub mod metrics;
pub mod page;
pub mod view;

mod loader;

pub use loader::{serve_loader, LoaderDashboard};

use sluice_client::runtime::RuntimeError;

/// Why a dashboard or metrics endpoint is not served.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}
