//! Running a dispatcher or worker as a process: a runtime, and a clean stop on Ctrl-C or
//! SIGTERM (what Kubernetes sends).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sluice_client::runtime::{runtime, Threads};

use crate::error::ServiceError;
use crate::{run_dispatcher, run_worker, DispatcherConfig, WorkerConfig};

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
    runtime("dispatcher", Threads::Workers(2))?.block_on(run_dispatcher(config, shutdown_signal(), on_listening))
}

/// Keeps freed batch buffers mapped in a worker process. A batch is allocated on the
/// loader's thread and freed on the data plane's after sending; with glibc's defaults the
/// arena trims (or unmaps) the multi-MB buffer each time, so every batch faults its pages
/// in again and the kernel zeroes them: ~3% of a worker's CPU in the profile. Memory held
/// stays bounded by the batches in flight.
fn keep_batch_buffers_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // Allocations up to 32 MiB (glibc's cap) come from the heap, not mmap, and a heap
        // gives memory back only when over 1 GiB is free at its top.
        // SAFETY: mallopt only changes allocator parameters; called before any thread starts.
        let ok = unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30) == 1
        };
        if !ok {
            tracing::debug!("mallopt refused; batch buffers are mapped afresh each time");
        }
    }
}

/// Serves a worker until Ctrl-C/SIGTERM.
pub fn serve_worker(config: WorkerConfig, on_listening: impl FnOnce(SocketAddr)) -> Result<(), ServiceError> {
    keep_batch_buffers_mapped();
    runtime("worker", Threads::Workers(2))?.block_on(run_worker(config, shutdown_signal(), on_listening))
}

/// A flag that turns true on Ctrl-C/SIGTERM, for synchronous supervisors (`sluice up`).
pub fn signal_flag() -> Result<Arc<AtomicBool>, ServiceError> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    let rt = runtime("signal", Threads::Caller)?;
    std::thread::Builder::new()
        .name("sluice-signals".into())
        .spawn(move || {
            rt.block_on(shutdown_signal());
            set.store(true, Ordering::SeqCst);
        })
        .map_err(ServiceError::SignalThread)?;
    Ok(flag)
}
