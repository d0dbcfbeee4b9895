//! `sluice service kube-scaler`: the autoscaler's Kubernetes actuator. It follows the
//! dispatcher's target worker count (as `sluice service up` does for processes) by setting
//! the worker StatefulSet's replicas through the `scale` subresource
//! (`sluice_service::StatefulSetScaler::follow`). Kubernetes starts the new pods; the pods
//! it removes get SIGTERM, and each worker drains (finishes the tasks it holds) before it
//! exits. Runs beside the dispatcher (deploy/dispatcher.yaml).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use sluice_client::ScaleClient;
use sluice_service::StatefulSetScaler;

use super::{tls_ca, token};

#[derive(clap::Args)]
pub struct KubeScalerArgs {
    /// The dispatcher's gRPC address (started with --autoscale).
    #[arg(long, default_value = "127.0.0.1:7070")]
    dispatcher: String,
    /// The worker StatefulSet, in the namespace of the Kubernetes configuration
    /// ($KUBECONFIG, ~/.kube/config, else the pod's service account).
    #[arg(long, default_value = "sluice-worker")]
    statefulset: String,
    /// How often to compare the target with the replica count, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    every_ms: u64,
    #[arg(long)]
    token: Option<String>,
    /// CA of the dispatcher's certificate (TLS); else `SLUICE_TLS_CA`.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
}

pub fn kube_scaler(a: KubeScalerArgs) -> Result<()> {
    let token = token(a.token);
    let ca = tls_ca(a.tls_ca);
    let mut dispatcher = ScaleClient::new(&a.dispatcher, token.as_deref(), ca.as_deref())
        .with_context(|| format!("cannot reach the dispatcher at {}", a.dispatcher))?;
    let statefulset = StatefulSetScaler::from_env(&a.statefulset)?;
    let stop = sluice_service::signal_flag()?;
    println!("sluice kube-scaler: StatefulSet {} follows the dispatcher at {}", a.statefulset, a.dispatcher);
    statefulset.follow(&mut dispatcher, Duration::from_millis(a.every_ms), &stop);
    Ok(())
}
