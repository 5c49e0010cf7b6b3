//! Compiles every `bpf/*.bpf.c` into a libbpf-rs skeleton in OUT_DIR.
use std::{env, path::PathBuf};

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let bpf_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../bpf");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    // Watch the whole folder so that added or removed headers are noticed.
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    // One skeleton per program; more names join this list.
    for name in ["requests", "sockets", "grpc", "sched", "net"] {
        let src = bpf_dir.join(format!("{name}.bpf.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        SkeletonBuilder::new()
            .source(&src)
            .clang_args([
                format!("-I{}", bpf_dir.display()),
                "-D__TARGET_ARCH_x86".to_string(),
                "-Wall".to_string(),
                // Atomic or/and on the tgid bitmap (sockets.bpf.c); v3 is
                // Linux 5.1+.
                "-mcpu=v3".to_string(),
            ])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {}: {e:#}", src.display()));
    }
}
