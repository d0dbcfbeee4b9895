//! The live dashboard: one static page (HTML, JS and hand-drawn SVG, embedded in the
//! binary) that polls `/api/state` every second and draws what it gets
//! ([`crate::view`]). The page also asks `/api/autoscale` for scaling decisions and shows
//! "autoscaling off" where that answers 404.

use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;

const PAGE: &str = include_str!("page.html");

/// The JSON of `/api/state`, built fresh on every request.
pub type StateJson = Arc<dyn Fn() -> String + Send + Sync>;

/// The JSON of `/api/autoscale`, built fresh on every request; `None` when nothing scales.
pub type ScalingJson = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// `/api/autoscale`: the autoscaler's decisions, or 404 with `off` (the page shows
/// "autoscaling off").
pub fn autoscale_route(decisions: ScalingJson, off: &'static str) -> Router {
    Router::new().route(
        "/api/autoscale",
        get(move || {
            let body = decisions();
            async move {
                match body {
                    Some(json) => (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")],
                        json,
                    ),
                    None => (
                        StatusCode::NOT_FOUND,
                        [(header::CONTENT_TYPE, "text/plain"), (header::CACHE_CONTROL, "no-store")],
                        off.to_string(),
                    ),
                }
            }
        }),
    )
}

/// `/` and `/dashboard` (the page) and `/api/state` (what it draws).
pub fn routes(state: StateJson) -> Router {
    let page = || async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE) };
    Router::new().route("/", get(page)).route("/dashboard", get(page)).route(
        "/api/state",
        get(move || {
            let body = state();
            async move { ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")], body) }
        }),
    )
}
