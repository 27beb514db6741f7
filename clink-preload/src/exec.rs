//! Connections across exec. A followed connection whose descriptor survives an exec
//! (inetd style: socat's EXEC, a shell redirect) goes to a program that may read it in
//! ways no wrapper sees (the C library's stdio calls the kernel directly), so before the
//! exec each such connection goes back to the kernel: the peer is asked to resend what the
//! ring holds unread, and this end's own ring data is followed by the kernel at a stream
//! position the peer can tell (see `Conn::leave`). New connections of the new program are
//! paired as usual.

use crate::conn::{Conn, Why};
use crate::{real, table};
use libc::{c_char, c_int};
use std::sync::Arc;

fn survives(fd: c_int) -> bool {
    // SAFETY: reading descriptor flags.
    let f = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    f >= 0 && f & libc::FD_CLOEXEC == 0
}

/// Hands back to the kernel every connection one of whose descriptors `pick` chooses, and
/// stops following all of its descriptors here.
pub fn leave_where(why: Why, pick: impl Fn(c_int) -> bool) {
    if !crate::config().enabled {
        return;
    }
    let _keep = crate::sys::SavedErrno::save();
    let all = table::all();
    let mut left: Vec<Arc<Conn>> = Vec::new();
    for (fd, c) in &all {
        if pick(*fd) && !c.left() && !left.iter().any(|l| Arc::ptr_eq(l, c)) {
            c.leave(*fd, why);
            left.push(c.clone());
        }
    }
    for (fd, c) in all {
        if left.iter().any(|l| Arc::ptr_eq(l, &c)) {
            drop(table::remove(fd));
        }
    }
}

/// Hands `fd`'s connection back to the kernel (its descriptor is about to escape, or a
/// call only the kernel serves is about to be made on it).
pub fn leave_fd(fd: c_int, why: Why) {
    if table::get(fd).is_some() {
        leave_where(why, |f| f == fd);
    }
}

/// Hands every connection whose descriptor survives exec back to the kernel.
pub fn before_exec() {
    leave_where(Why::Escaped, survives);
}

/// execve, after [`before_exec`].
pub fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments, forwarded.
    unsafe { real::execve(path, argv, envp) }
}

/// The list forms of exec, exported as the C library's names: each jumps, with the
/// caller's registers and stack untouched, to its C implementation in `csrc/exec_list.c`,
/// which builds the argument vector and calls the vector form this library wraps. The C
/// library's own list forms call its internal execve, which no wrapper sees.
macro_rules! list_exec {
    ($( $name:ident => $imp:ident; )*) => {
        extern "C" {
            $( fn $imp(); )*
        }
        $(
            #[unsafe(naked)]
            #[no_mangle]
            pub unsafe extern "C" fn $name() {
                #[cfg(target_arch = "x86_64")]
                core::arch::naked_asm!("jmp {}", sym $imp);
                #[cfg(target_arch = "aarch64")]
                core::arch::naked_asm!("b {}", sym $imp);
            }
        )*
    };
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
list_exec! {
    execl => clink_preload_execl;
    execlp => clink_preload_execlp;
    execle => clink_preload_execle;
}
