//! The dispatcher's HTTP side, beside gRPC on its own port (`--metrics-listen`): `/metrics`,
//! the dashboard (`/`, `/api/state`) and the autoscaler's decisions (`/api/autoscale`).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use sluice_dashboard::{metrics, page};

use super::view::dispatcher_view;
use super::DispatcherService;
use crate::error::ServiceError;

impl DispatcherService {
    /// What the dashboard draws, as JSON.
    fn dashboard_state(&self) -> String {
        let acked = self.inner.counters.batches_acked.load(Ordering::Relaxed);
        let view = dispatcher_view(&self.inner.state.lock(), acked, Instant::now());
        // Plain structs of numbers and strings: serializing cannot fail.
        serde_json::to_string(&view).unwrap_or_default()
    }
}

/// Binds `addr` and serves the dispatcher's pages there until the runtime stops. Returns
/// the bound address.
pub(super) async fn serve(service: &DispatcherService, addr: &str) -> Result<SocketAddr, ServiceError> {
    let (s, d, a) = (service.clone(), service.clone(), service.clone());
    let routes = page::routes(Arc::new(move || d.dashboard_state())).merge(page::autoscale_route(
        Arc::new(move || a.autoscale_json()),
        "autoscaling off (start the dispatcher with --autoscale POLICY)\n",
    ));
    Ok(metrics::serve_with(addr, Arc::new(move || s.render_metrics()), routes).await?)
}
