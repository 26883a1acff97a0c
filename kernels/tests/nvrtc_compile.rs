//! Every kernel program of `kernels/cuda/` compiles with NVRTC, exactly as the
//! CUDA backend compiles it at run time (same headers in front, same options),
//! for the oldest and the newest architecture we target. Needs libnvrtc, not a
//! GPU: `LD_LIBRARY_PATH=$(scripts/nvrtc.sh) cargo test -p cachet-kernels --test nvrtc_compile`.
//!
//! Skips when libnvrtc cannot be loaded; fails then with `REQUIRE_NVRTC=1`.

use cachet_kernels::cuda;
use std::collections::BTreeSet;
use std::path::Path;

#[test]
fn every_program_is_registered() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu") || n.ends_with(".cuh"))
        .collect();
    let programs = cuda::programs();
    let known: BTreeSet<String> =
        programs.iter().map(|p| p.file.to_string()).chain(cuda::HEADERS.iter().map(|h| h.to_string())).collect();
    assert_eq!(on_disk, known, "every .cu file in kernels/cuda is a program of src/cuda/module.rs");
    for p in &programs {
        let body = std::fs::read_to_string(dir.join(p.file)).unwrap();
        assert!(p.source.ends_with(&body), "{} is embedded as it is on disk", p.file);
    }
}

#[test]
fn every_program_compiles_with_nvrtc() {
    if !cuda::nvrtc_available() {
        if std::env::var("REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
            panic!("REQUIRE_NVRTC=1 but libnvrtc cannot be loaded (run scripts/nvrtc.sh, add its output to LD_LIBRARY_PATH)");
        }
        println!("skipped: libnvrtc not found (scripts/nvrtc.sh installs it)");
        return;
    }
    // PTX for the oldest architecture we support (Ampere), CUBINs for
    // Ampere and Hopper (what the backend builds at run time).
    for arch in ["compute_80", "sm_80", "sm_90"] {
        for p in cuda::programs() {
            let image = cuda::compile(&p, arch).unwrap_or_else(|e| panic!("{e}"));
            assert!(!image.is_empty(), "{} for {arch}: empty image", p.file);
            if arch.starts_with("compute_") {
                // Every kernel the backend loads from this program is in it.
                let ptx = String::from_utf8_lossy(&image);
                for (_, name) in cuda::kernel_names().into_iter().filter(|(f, _)| *f == p.file) {
                    assert!(ptx.contains(&format!(".entry {name}(")), "{}: no kernel {name} in the PTX", p.file);
                }
            }
            println!("{:14} {arch:10} {:7} bytes", p.file, image.len());
        }
    }
}
