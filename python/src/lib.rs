//! `sluice._sluice`: the native half of the `sluice` Python package. A thin layer: specs go
//! in as JSON, batches come out as numpy arrays that own the Rust buffers, and errors cross
//! into Python in one place (`errors.rs`). The friendly API is the pure-Python package.

mod buffers;
mod errors;
mod loader;
mod map_op;
mod pack;
mod policy;
mod profile;
mod remote;
mod serial;
mod spec;
mod stream;
mod synth;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Sends sluice's Rust logs (skipped samples, dataset enumeration...) to stderr, filtered
/// like `RUST_LOG` (e.g. `"warn"`, `"sluice_pipeline=info"`). Only the first call counts.
#[pyfunction]
#[pyo3(signature = (filter = "warn"))]
fn enable_logging(filter: &str) -> PyResult<bool> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let subscriber = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    Ok(subscriber.with_ansi(sluice_core::logging::stderr_colours()).try_init().is_ok())
}

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<loader::PyEpochIterator>()?;
    m.add_class::<loader::RawBatch>()?;
    m.add_class::<map_op::MapSample>()?;
    m.add_function(wrap_pyfunction!(map_op::register_map, m)?)?;
    m.add_class::<remote::PyRemoteLoader>()?;
    m.add_class::<stream::PyStreamLoader>()?;
    m.add_function(wrap_pyfunction!(stream::stream_push, m)?)?;
    m.add_function(wrap_pyfunction!(spec::spec_canonical_json, m)?)?;
    m.add_function(wrap_pyfunction!(spec::spec_json_to_toml, m)?)?;
    m.add_function(wrap_pyfunction!(spec::spec_process_share, m)?)?;
    m.add_function(wrap_pyfunction!(spec::spec_toml_to_json, m)?)?;
    m.add_function(wrap_pyfunction!(spec::spec_load_file, m)?)?;
    m.add_function(wrap_pyfunction!(synth::generate_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(pack::pack, m)?)?;
    m.add_function(wrap_pyfunction!(policy::policy_space, m)?)?;
    m.add_function(wrap_pyfunction!(policy::policy_op, m)?)?;
    m.add_function(wrap_pyfunction!(profile::profile_threads, m)?)?;
    m.add_function(wrap_pyfunction!(enable_logging, m)?)?;
    Ok(())
}
