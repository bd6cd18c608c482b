//! Compiles `trireme/v1/queue.proto` with the pure-Rust `protox`, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=trireme/v1/queue.proto");
    let descriptors = protox::compile(["trireme/v1/queue.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
