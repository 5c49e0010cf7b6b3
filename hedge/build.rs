//! Compiles `bpf/hedge.bpf.c` into a libbpf-rs skeleton in OUT_DIR.
use std::{env, path::PathBuf};

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let bpf_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../bpf");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for f in ["hedge.bpf.c", "hedge.h"] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(f).display());
    }
    let src = bpf_dir.join("hedge.bpf.c");
    SkeletonBuilder::new()
        .source(&src)
        .clang_args([
            format!("-I{}", bpf_dir.display()),
            "-D__TARGET_ARCH_x86".to_string(),
            "-Wall".to_string(),
            // cmpxchg on the scoreboard state: Linux 5.12+ atomics.
            "-mcpu=v3".to_string(),
        ])
        .build_and_generate(out.join("hedge.skel.rs"))
        .unwrap_or_else(|e| panic!("building {}: {e:#}", src.display()));
}
