//! The Kubernetes actuator: the autoscaler's unit count becomes the worker StatefulSet's
//! replica count, read and changed through its `scale` subresource (the only thing
//! `deploy/rbac.yaml` lets the dispatcher do). Kubernetes then starts or stops worker pods;
//! a pod being stopped gets SIGTERM, and the worker drains the tasks it holds before it exits.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, Patch, PatchParams};

use sluice_client::runtime::{runtime, Threads};
use sluice_client::ScaleClient;

use crate::error::ServiceError;

/// The worker StatefulSet's replica count, through the API server. Blocking calls (a
/// supervisor polls), each bounded by a short deadline.
pub struct StatefulSetScaler {
    rt: tokio::runtime::Runtime,
    api: Api<StatefulSet>,
    name: String,
}

/// Longest one call to the API server may take.
const CALL_DEADLINE: Duration = Duration::from_secs(5);

impl StatefulSetScaler {
    /// The StatefulSet `name` in the namespace of the client's configuration, found as
    /// kubectl finds it: `$KUBECONFIG` or `~/.kube/config`, else the pod's service account
    /// (in the cluster).
    pub fn from_env(name: &str) -> Result<Self, ServiceError> {
        let rt = runtime("Kubernetes client", Threads::Caller)?;
        let client = rt
            .block_on(kube::Client::try_default())
            .map_err(|e| kube_error(name, "configuring the Kubernetes client", e.to_string()))?;
        Ok(Self::new(rt, client, name))
    }

    fn new(rt: tokio::runtime::Runtime, client: kube::Client, name: &str) -> Self {
        // The client's connections live on the runtime it was made in.
        let api = {
            let _in_rt = rt.enter();
            Api::default_namespaced(client)
        };
        Self { rt, api, name: name.to_string() }
    }

    /// The replica count asked for now (`spec.replicas` of the scale subresource).
    pub fn replicas(&self) -> Result<u32, ServiceError> {
        let scale = self.call("reading the scale", self.api.get_scale(&self.name))?;
        let replicas = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
        Ok(u32::try_from(replicas).unwrap_or(0))
    }

    /// Asks for `replicas` pods (a merge patch of the scale subresource).
    pub fn set_replicas(&self, replicas: u32) -> Result<(), ServiceError> {
        let patch = serde_json::json!({ "spec": { "replicas": replicas } });
        let params = PatchParams::default();
        self.call("changing the scale", self.api.patch_scale(&self.name, &params, &Patch::Merge(&patch)))?;
        Ok(())
    }

    /// What `sluice service kube-scaler` does: follows `dispatcher`'s target worker count
    /// (as `sluice service up` does for processes), comparing it with the replica count
    /// every `every`, until `stop` is set. A call that fails is tried again.
    pub fn follow(&self, dispatcher: &mut ScaleClient, every: Duration, stop: &AtomicBool) {
        let mut said_off = false;
        while !stop.load(Ordering::SeqCst) {
            match dispatcher.scale() {
                Ok(r) if r.enabled => {
                    said_off = false;
                    if let Err(e) = self.follow_once(r.target) {
                        tracing::warn!(error = %e, "the StatefulSet's scale was not changed; trying again");
                    }
                }
                Ok(_) if !said_off => {
                    said_off = true;
                    tracing::warn!("the dispatcher runs without --autoscale; nothing to follow");
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "no target from the dispatcher yet"),
            }
            std::thread::sleep(every.max(Duration::from_millis(10)));
        }
    }

    /// One step: the replica count becomes `target`, if it is not already.
    fn follow_once(&self, target: u64) -> Result<(), ServiceError> {
        let target = u32::try_from(target).unwrap_or(u32::MAX);
        let now = self.replicas()?;
        if now != target {
            self.set_replicas(target)?;
            tracing::info!(from = now, to = target, "scaled the worker StatefulSet");
        }
        Ok(())
    }

    fn call<T>(&self, what: &str, f: impl Future<Output = Result<T, kube::Error>>) -> Result<T, ServiceError> {
        match self.rt.block_on(async { tokio::time::timeout(CALL_DEADLINE, f).await }) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(kube_error(&self.name, what, e.to_string())),
            Err(_) => Err(kube_error(&self.name, what, format!("no answer within {} s", CALL_DEADLINE.as_secs()))),
        }
    }
}

fn kube_error(name: &str, what: &str, message: String) -> ServiceError {
    ServiceError::Kubernetes { statefulset: name.to_string(), what: what.to_string(), message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use axum::extract::{Path, State};
    use axum::http::header::CONTENT_TYPE;
    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::Router;
    use parking_lot::Mutex;
    use serde_json::{json, Value};

    /// The two endpoints of a StatefulSet's scale subresource as the API server serves them
    /// (`autoscaling/v1` Scale objects, merge patches), over one StatefulSet, with the
    /// requests it got. No API server can be installed on this machine (none is packaged
    /// in Debian, PyPI, npm or crates.io), so the client is tested against the protocol.
    #[derive(Default)]
    struct ApiServer {
        replicas: Mutex<i64>,
        requests: Mutex<Vec<String>>,
    }

    /// An `autoscaling/v1` Scale object, as the API server answers both requests.
    type Reply = Result<([(axum::http::HeaderName, &'static str); 1], String), StatusCode>;

    fn scale(name: &str, replicas: i64) -> Reply {
        let body = json!({
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": name, "namespace": "training"},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas}
        });
        Ok(([(CONTENT_TYPE, "application/json")], body.to_string()))
    }

    /// Serves on a runtime of its own (the scaler under test blocks), for the test's life.
    fn serve(api: Arc<ApiServer>) -> std::net::SocketAddr {
        async fn get_scale(State(api): State<Arc<ApiServer>>, Path((ns, name)): Path<(String, String)>) -> Reply {
            api.requests.lock().push(format!("GET {ns}/{name}"));
            if name != "sluice-worker" {
                return Err(StatusCode::NOT_FOUND);
            }
            scale(&name, *api.replicas.lock())
        }
        async fn patch_scale(
            State(api): State<Arc<ApiServer>>,
            Path((ns, name)): Path<(String, String)>,
            headers: axum::http::HeaderMap,
            body: String,
        ) -> Reply {
            let kind = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            api.requests.lock().push(format!("PATCH {ns}/{name} {kind} {body}"));
            let patch: Value = serde_json::from_str(&body).map_err(|_| StatusCode::BAD_REQUEST)?;
            let n = patch["spec"]["replicas"].as_i64().ok_or(StatusCode::UNPROCESSABLE_ENTITY)?;
            *api.replicas.lock() = n;
            scale(&name, n)
        }
        let app = Router::new()
            .route("/apis/apps/v1/namespaces/:ns/statefulsets/:name/scale", get(get_scale).patch(patch_scale))
            .with_state(api);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let rt = runtime("test", Threads::Caller).unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app).await
            })
        });
        addr
    }

    /// A kubeconfig naming the loopback API server, as `$KUBECONFIG` would.
    fn scaler(addr: std::net::SocketAddr, name: &str) -> StatefulSetScaler {
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.default_namespace = "training".into();
        let rt = runtime("test", Threads::Caller).unwrap();
        let client = {
            let _in_rt = rt.enter();
            kube::Client::try_from(config).unwrap()
        };
        StatefulSetScaler::new(rt, client, name)
    }

    #[test]
    fn the_scaler_reads_and_merge_patches_the_statefulsets_scale_subresource() {
        let api = Arc::new(ApiServer::default());
        *api.replicas.lock() = 2;
        let addr = serve(api.clone());
        let s = scaler(addr, "sluice-worker");
        assert_eq!(s.replicas().unwrap(), 2);
        s.set_replicas(5).unwrap();
        assert_eq!(*api.replicas.lock(), 5);
        assert_eq!(s.replicas().unwrap(), 5);
        let requests = api.requests.lock().clone();
        assert_eq!(requests[0], "GET training/sluice-worker");
        assert_eq!(requests[1], r#"PATCH training/sluice-worker application/merge-patch+json {"spec":{"replicas":5}}"#);
    }

    #[test]
    fn a_missing_statefulset_is_an_error_naming_it_and_what_was_tried() {
        let addr = serve(Arc::new(ApiServer::default()));
        let err = scaler(addr, "no-such-set").replicas().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("no-such-set") && text.contains("reading the scale"), "{text}");
        assert_eq!(err.kind(), crate::ServiceErrorKind::Unavailable);
    }
}
