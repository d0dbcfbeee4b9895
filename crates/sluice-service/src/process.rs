//! Running a dispatcher or worker as a process: a runtime, and a clean stop on Ctrl-C or
//! SIGTERM (what Kubernetes sends).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::ServiceError;
use crate::{run_dispatcher, run_worker, DispatcherConfig, WorkerConfig};

fn runtime() -> Result<tokio::runtime::Runtime, ServiceError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| ServiceError::Internal(format!("cannot start the runtime: {e}")))
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutting down");
}

/// Serves a dispatcher until Ctrl-C/SIGTERM.
pub fn serve_dispatcher(config: DispatcherConfig, on_listening: impl FnOnce(SocketAddr)) -> Result<(), ServiceError> {
    runtime()?.block_on(run_dispatcher(config, shutdown_signal(), on_listening))
}

/// Serves a worker until Ctrl-C/SIGTERM.
pub fn serve_worker(config: WorkerConfig, on_listening: impl FnOnce(SocketAddr)) -> Result<(), ServiceError> {
    runtime()?.block_on(run_worker(config, shutdown_signal(), on_listening))
}

/// A flag that turns true on Ctrl-C/SIGTERM, for synchronous supervisors (`sluice up`).
pub fn signal_flag() -> Result<Arc<AtomicBool>, ServiceError> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ServiceError::Internal(format!("cannot start the runtime: {e}")))?;
    std::thread::Builder::new()
        .name("sluice-signals".into())
        .spawn(move || {
            rt.block_on(shutdown_signal());
            set.store(true, Ordering::SeqCst);
        })
        .map_err(|e| ServiceError::Internal(format!("cannot start the signal thread: {e}")))?;
    Ok(flag)
}
