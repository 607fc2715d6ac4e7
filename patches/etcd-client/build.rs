// talboot patch: compile the protos with protox (pure Rust) instead of protoc, so building
// talboot needs no protoc; see TALBOOT-PATCH.md. The proto list and options are upstream's.
#[cfg(feature = "build-server")]
fn should_build_server() -> bool {
    true
}

#[cfg(not(feature = "build-server"))]
fn should_build_server() -> bool {
    false
}

fn main() {
    let proto_root = "proto";
    println!("cargo:rerun-if-changed={proto_root}");

    let fds = protox::compile(
        [
            "proto/etcd/api/authpb/auth.proto",
            "proto/etcd/api/etcdserverpb/rpc.proto",
            "proto/etcd/api/mvccpb/kv.proto",
            "proto/etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
            "proto/etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
        ],
        [proto_root],
    )
    .unwrap_or_else(|e| panic!("Failed to compile proto files: {e}"));
    tonic_prost_build::configure()
        .build_server(should_build_server())
        .emit_rerun_if_changed(false)
        .compile_fds(fds)
        .expect("Failed to generate code from proto files");
}
