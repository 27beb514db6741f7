//! Compiles the list forms of exec (execl, execlp, execle): C, because stable Rust cannot
//! define a C variadic function (see `csrc/exec_list.c` and `exec.rs`).

fn main() {
    println!("cargo:rerun-if-changed=csrc/exec_list.c");
    cc::Build::new()
        .file("csrc/exec_list.c")
        .warnings(true)
        .extra_warnings(true)
        .compile("clink_exec_list");
}
