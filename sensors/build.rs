//! Compiles every `bpf/*.bpf.c` into a libbpf-rs skeleton in OUT_DIR
//! (`NAME.bpf.c` -> `NAME.skel.rs`), for the architecture being built for:
//! a new program is a new file in `bpf/`, nothing to list here.
use std::{env, path::Path, path::PathBuf};

use libbpf_cargo::SkeletonBuilder;

/// libbpf's `__TARGET_ARCH_*` name of a Rust target architecture (the
/// `PT_REGS_*` macros of bpf_tracing.h need it).
fn bpf_arch(rust_arch: &str) -> &'static str {
    match rust_arch {
        "x86_64" | "x86" => "x86",
        "aarch64" => "arm64",
        "arm" => "arm",
        "riscv64" => "riscv",
        "powerpc64" => "powerpc",
        "s390x" => "s390",
        "loongarch64" => "loongarch",
        "mips" | "mips64" => "mips",
        "sparc64" => "sparc",
        other => panic!("no BPF target architecture known for {other}"),
    }
}

/// The programs under `dir`: the names of its `*.bpf.c` files, sorted.
fn programs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(name.strip_suffix(".bpf.c")?.to_owned())
        })
        .collect();
    names.sort();
    names
}

fn main() {
    let bpf_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../bpf");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let arch = bpf_arch(&env::var("CARGO_CFG_TARGET_ARCH").unwrap());
    // Watch the whole folder so that added or removed files are noticed.
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    for name in programs(&bpf_dir) {
        let src = bpf_dir.join(format!("{name}.bpf.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        SkeletonBuilder::new()
            .source(&src)
            .clang_args([
                format!("-I{}", bpf_dir.display()),
                format!("-D__TARGET_ARCH_{arch}"),
                "-Wall".to_string(),
                // Atomic or/and on the tgid bitmap (sockets.bpf.c); v3 is
                // Linux 5.1+.
                "-mcpu=v3".to_string(),
            ])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {}: {e:#}", src.display()));
    }
}
