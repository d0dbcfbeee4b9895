//! Generates the Perfetto trace messages the trace exporter writes from the vendored
//! `proto/perfetto_trace.proto`. protox compiles it in Rust, so building needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(["proto/perfetto_trace.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto/perfetto_trace.proto");
    Ok(())
}
