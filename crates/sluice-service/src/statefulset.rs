//! The Kubernetes actuator: the autoscaler's unit count becomes the worker StatefulSet's
//! replica count, read and changed through its `scale` subresource (the only thing
//! `deploy/rbac.yaml` lets the dispatcher do). Kubernetes then starts or stops worker pods;
//! a pod being stopped gets SIGTERM, and the worker drains the tasks it holds before it exits.

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, Patch, PatchParams};

use crate::error::ServiceError;

/// The worker StatefulSet's replica count, through the API server.
pub struct StatefulSetScaler {
    api: Api<StatefulSet>,
    name: String,
}

impl StatefulSetScaler {
    /// The StatefulSet `name` in the namespace of the client's configuration, found as
    /// kubectl finds it: `$KUBECONFIG` or `~/.kube/config`, else the pod's service account
    /// (in the cluster).
    pub async fn from_env(name: &str) -> Result<Self, ServiceError> {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| kube_error(name, "configuring the Kubernetes client", e))?;
        Ok(Self { api: Api::default_namespaced(client), name: name.to_string() })
    }

    /// The replica count asked for now (`spec.replicas` of the scale subresource).
    pub async fn replicas(&self) -> Result<u32, ServiceError> {
        let scale = self.api.get_scale(&self.name).await.map_err(|e| kube_error(&self.name, "reading the scale", e))?;
        let replicas = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
        Ok(u32::try_from(replicas).unwrap_or(0))
    }

    /// Asks for `replicas` pods (a merge patch of the scale subresource).
    pub async fn set_replicas(&self, replicas: u32) -> Result<(), ServiceError> {
        let patch = serde_json::json!({ "spec": { "replicas": replicas } });
        self.api
            .patch_scale(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| kube_error(&self.name, "changing the scale", e))?;
        Ok(())
    }
}

fn kube_error(name: &str, what: &str, e: kube::Error) -> ServiceError {
    ServiceError::Kubernetes { statefulset: name.to_string(), what: what.to_string(), message: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::http::header::CONTENT_TYPE;
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

    async fn serve(api: Arc<ApiServer>) -> std::net::SocketAddr {
        async fn get_scale(
            State(api): State<Arc<ApiServer>>,
            Path((ns, name)): Path<(String, String)>,
        ) -> Reply {
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
            .route(
                "/apis/apps/v1/namespaces/:ns/statefulsets/:name/scale",
                get(get_scale).patch(patch_scale),
            )
            .with_state(api);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    /// A kubeconfig naming the loopback API server, as `$KUBECONFIG` would.
    fn scaler(addr: std::net::SocketAddr, name: &str) -> StatefulSetScaler {
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.default_namespace = "training".into();
        let client = kube::Client::try_from(config).unwrap();
        StatefulSetScaler { api: Api::default_namespaced(client), name: name.into() }
    }

    #[tokio::test]
    async fn the_scaler_reads_and_merge_patches_the_statefulsets_scale_subresource() {
        let api = Arc::new(ApiServer::default());
        *api.replicas.lock() = 2;
        let addr = serve(api.clone()).await;
        let s = scaler(addr, "sluice-worker");
        assert_eq!(s.replicas().await.unwrap(), 2);
        s.set_replicas(5).await.unwrap();
        assert_eq!(*api.replicas.lock(), 5);
        assert_eq!(s.replicas().await.unwrap(), 5);
        let requests = api.requests.lock().clone();
        assert_eq!(requests[0], "GET training/sluice-worker");
        assert_eq!(
            requests[1],
            r#"PATCH training/sluice-worker application/merge-patch+json {"spec":{"replicas":5}}"#
        );
    }

    #[tokio::test]
    async fn a_missing_statefulset_is_an_error_naming_it_and_what_was_tried() {
        let addr = serve(Arc::new(ApiServer::default())).await;
        let err = scaler(addr, "no-such-set").replicas().await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains("no-such-set") && text.contains("reading the scale"), "{text}");
        assert_eq!(err.kind(), crate::ServiceErrorKind::Unavailable);
    }
}
