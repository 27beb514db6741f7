//! The committed C header (`include/clink.h`) is what cbindgen makes of the crate now.
//! `CLINK_BLESS=1 cargo test -p clink-c --test header` rewrites it.

use std::path::PathBuf;

#[test]
fn header_is_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("read clink-c/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header from clink-c/src");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("header is UTF-8");
    let path = dir.join("include/clink.h");
    if std::env::var_os("CLINK_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("write include/clink.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || "one is a prefix of the other".to_string(),
                |i| {
                    format!(
                        "first difference at line {}:\n  committed: {}\n  generated: {}",
                        i + 1,
                        committed.lines().nth(i).unwrap_or(""),
                        generated.lines().nth(i).unwrap_or("")
                    )
                },
            );
        panic!(
            "clink-c/include/clink.h is out of date with clink-c/src ({first}).\n\
             Regenerate it with: CLINK_BLESS=1 cargo test -p clink-c --test header"
        );
    }
}
