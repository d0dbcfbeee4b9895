//! Generates the wire messages and the gRPC client and server code from
//! `proto/sluice.proto`. protox compiles the `.proto` in Rust, so building needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(["proto/sluice.proto"], ["proto"])?;
    tonic_build::configure().compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto/sluice.proto");
    Ok(())
}
