//! The cross-language LTO build (`lto.sh`): clink's static library as LLVM bitcode, the
//! C ping-pong and the hop-cost program compiled with `-flto` against it, each run.
//! Needs a clang whose LLVM is at least rustc's (Debian's is older): name it in `LTO_CC`
//! (for example `LTO_CC="python3 -m ziglang cc"` after `pip install ziglang`) and run
//! with `--ignored`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[test]
#[ignore = "needs a clang of rustc's LLVM in LTO_CC (e.g. \"python3 -m ziglang cc\")"]
fn c_programs_link_with_clink_as_bitcode_and_run() {
    let cc = std::env::var("LTO_CC").expect(
        "LTO_CC names a clang of LLVM >= rustc's (e.g. \"python3 -m ziglang cc\" after pip install ziglang)",
    );
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let built = Command::new("bash")
        .arg(here.join("lto.sh"))
        .arg(&cc)
        .output()
        .expect("run lto.sh");
    assert!(
        built.status.success(),
        "lto.sh failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let stdout = String::from_utf8_lossy(&built.stdout);
    let lib = stdout
        .split_whitespace()
        .find(|w| w.ends_with("libclink.a"))
        .expect("lto.sh names the library it built");
    let out = tempdir();
    let words: Vec<&str> = cc.split_whitespace().collect();
    for (src, arg, says) in [
        ("pingpong", "2000", "us one-way"),
        ("path_cost", "2000", "ns per hop"),
    ] {
        let exe = out.join(src);
        let st = Command::new(words[0])
            .args(&words[1..])
            .args(["-O2", "-flto"])
            .arg(here.join(format!("examples/{src}.c")))
            .arg(format!("-I{}", here.join("include").display()))
            .arg(format!("-I{}", here.join("examples").display()))
            .arg(lib)
            .args(["-lgcc_s", "-lpthread", "-ldl", "-lm", "-o"])
            .arg(&exe)
            .status()
            .expect("run the compiler");
        assert!(st.success(), "{cc} -flto {src}.c failed");
        let run = Command::new("timeout")
            .arg(Duration::from_secs(60).as_secs().to_string())
            .arg(&exe)
            .arg(arg)
            .env("CLINK_CALIBRATE", "0")
            .output()
            .expect("run the program");
        let text = String::from_utf8_lossy(&run.stdout);
        println!("{src}: {text}");
        assert!(
            run.status.success() && text.contains(says),
            "{src} failed ({}): {}",
            run.status,
            String::from_utf8_lossy(&run.stderr)
        );
    }
    std::fs::remove_dir_all(&out).ok();
}

/// A fresh directory for the programs.
fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("clink-lto-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("make a temporary directory");
    d
}
