//! Compiles the public API `trireme/v1/queue.proto` and the internal node-to-node service
//! `trireme/replica/v1/replica.proto` with the pure-Rust `protox`, so no system `protoc` is
//! needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=trireme/v1/queue.proto");
    println!("cargo:rerun-if-changed=trireme/replica/v1/replica.proto");
    let descriptors = protox::compile(
        ["trireme/v1/queue.proto", "trireme/replica/v1/replica.proto"],
        ["."],
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
