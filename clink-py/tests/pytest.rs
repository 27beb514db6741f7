//! Runs the Python suite (tests/test_clink.py) from `cargo test`: makes a virtual
//! environment under the target directory, installs maturin, numpy and pytest from PyPI
//! into it (once; later runs reuse it), builds and installs the extension with
//! `maturin develop` (cargo profile `pyext`: optimised, no fat LTO; target directory
//! `<target>/clink-py-ext`), then runs pytest.
//! Fails, with the reason, when python3, its venv module or PyPI is unavailable: the
//! suite is never skipped silently. The network namespace test needs root and iproute2
//! (CLINK_SKIP_NETNS=1 skips that one test explicitly).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target directory cargo builds this test into (the one above `<profile>/deps/`).
fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        let d = PathBuf::from(d);
        return if d.is_absolute() {
            d
        } else {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(d)
        };
    }
    let exe = std::env::current_exe().expect("path of the test executable");
    exe.ancestors()
        .nth(3)
        .expect("test executable under <target>/<profile>/deps")
        .to_path_buf()
}

fn run(what: &str, cmd: &mut Command) {
    eprintln!("pytest.rs: {what}: {cmd:?}");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        status.success(),
        "{what} failed ({status}); its output is above"
    );
}

#[test]
fn python_suite() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import venv, ensurepip"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the Python suite needs `{python}` with its venv and ensurepip modules: \
         apt-get install -y python3 python3-venv python3-pip (.ci/run installs them)"
    );
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = target_dir();
    let venv = target.join("clink-py-venv");
    let bin = venv.join("bin");
    if !bin.join("pytest").is_file() || !bin.join("maturin").is_file() {
        run(
            "create the virtual environment",
            Command::new(&python).args(["-m", "venv"]).arg(&venv),
        );
        run(
            "install maturin, numpy and pytest from PyPI (needs the network to PyPI)",
            Command::new(bin.join("python")).args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                "maturin>=1.7,<2",
                "numpy",
                "pytest",
            ]),
        );
    }
    // Build the extension into the venv. Its own target directory: the cargo running this
    // test holds the lock of this one (later runs reuse the dependencies' builds).
    run(
        "build and install the extension (maturin develop)",
        Command::new(bin.join("maturin"))
            .arg("develop")
            .arg("--quiet")
            .current_dir(crate_dir)
            .env("VIRTUAL_ENV", &venv)
            .env("CARGO_TARGET_DIR", target.join("clink-py-ext"))
            .env("PATH", {
                let mut p = std::ffi::OsString::from(bin.as_os_str());
                p.push(":");
                p.push(std::env::var_os("PATH").unwrap_or_default());
                p
            }),
    );
    run(
        "pytest",
        Command::new(bin.join("python"))
            .args(["-m", "pytest", "-v", "-p", "no:cacheprovider", "tests"])
            .args(["-o", "faulthandler_timeout=300"])
            .current_dir(crate_dir),
    );
}
