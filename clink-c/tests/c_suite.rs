//! Runs the C suite (tests/run.sh: every C test and example compiled with `cc -Wall
//! -Werror`, run plain, under ASan/UBSan and under valgrind) against the library cargo
//! built for this test. Fails, with the reason, when `cc` or `valgrind` is missing: the
//! suite is never skipped silently.

use std::path::{Path, PathBuf};
use std::process::Command;

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            let p = dir.join(tool);
            p.is_file()
                && std::fs::metadata(&p).is_ok_and(|m| {
                    use std::os::unix::fs::PermissionsExt;
                    m.permissions().mode() & 0o111 != 0
                })
        })
    })
}

/// The directory cargo put this package's libclink.so and libclink.a in (the profile
/// directory above this test's `deps/`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable under <target>/<profile>/deps")
        .to_path_buf()
}

#[test]
fn c_suite() {
    for (tool, package) in [
        ("cc", "gcc"),
        ("valgrind", "valgrind"),
        ("timeout", "coreutils"),
    ] {
        assert!(
            on_path(tool),
            "the C suite needs `{tool}`, which is not installed: apt-get install -y {package} \
             (.ci/run installs it)"
        );
    }
    let lib = lib_dir();
    for f in ["libclink.so", "libclink.a"] {
        assert!(
            lib.join(f).is_file(),
            "{} was not built (clink-c's crate types include cdylib and staticlib)",
            lib.join(f).display()
        );
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/run.sh");
    let status = Command::new("bash")
        .arg(&script)
        .env("C_SUITE_LIB_DIR", &lib)
        .status()
        .expect("run bash tests/run.sh");
    assert!(
        status.success(),
        "the C suite failed ({status}); its report is above"
    );
}
