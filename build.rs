//! Compiles talboot's own Talos API subset (`proto/`) into Rust with protox (a pure-Rust
//! protobuf compiler, so the build needs no `protoc`) and tonic-prost-build. Servers are
//! generated too: the simulated Talos node (`src/sim/talos.rs`) serves the same API.

use std::path::PathBuf;

/// Every `.proto` file we compile, relative to `proto/` (also the import root).
const PROTOS: &[&str] = &[
    "google/rpc/status.proto",
    "common/common.proto",
    "machine/machine.proto",
    "machine/lifecycle.proto",
    "machine/image.proto",
    "storage/storage.proto",
    "cosi/resource.proto",
    "cosi/state.proto",
    "resource/definitions/block.proto",
    "resource/definitions/hardware.proto",
    "resource/definitions/k8s.proto",
    "resource/definitions/runtime.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    for file in PROTOS {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }

    // protox reports the file, line and column of a syntax or type error; a plain `?` would
    // lose that, so the Display form (which carries them) is what the build prints.
    let fds = protox::compile(PROTOS, [&root]).map_err(|e| format!("proto/: {e}"))?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)?;
    Ok(())
}
