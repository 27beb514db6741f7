//! The C library's own functions, found with `dlsym(RTLD_NEXT)`: the wrappers call these
//! for everything that is not an accelerated connection, and the library never calls the
//! symbols it exports itself (that would recurse into the wrappers).

use libc::{
    c_char, c_int, c_void, iovec, msghdr, nfds_t, off_t, pollfd, sigset_t, size_t, sockaddr,
    socklen_t, ssize_t, timespec,
};
use std::sync::atomic::{AtomicUsize, Ordering};

fn resolve(name: &'static [u8]) -> usize {
    // SAFETY: `name` is NUL-terminated (every call site passes a literal ending in \0).
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) };
    if p.is_null() {
        let msg = b"libclink_preload: a C library function is missing\n";
        // SAFETY: writing a static buffer to stderr, then aborting: nothing can go on.
        unsafe {
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::abort();
        }
    }
    p as usize
}

macro_rules! real_fns {
    ($( $name:ident ( $($a:ident : $t:ty),* ) -> $r:ty ;)*) => {
        $(
            #[doc = concat!("The C library's `", stringify!($name), "`.")]
            #[allow(clippy::missing_safety_doc)]
            pub unsafe fn $name($($a: $t),*) -> $r {
                static P: AtomicUsize = AtomicUsize::new(0);
                let mut p = P.load(Ordering::Relaxed);
                if p == 0 {
                    p = resolve(concat!(stringify!($name), "\0").as_bytes());
                    P.store(p, Ordering::Relaxed);
                }
                // SAFETY: `p` is the address of the C library's function of this name,
                // whose C signature is the one declared here.
                let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute::<usize, _>(p) };
                // SAFETY: the caller's arguments for that function (this one's contract).
                unsafe { f($($a),*) }
            }
        )*
    };
}

real_fns! {
    connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    ppoll(fds: *mut pollfd, n: nfds_t, ts: *const timespec, mask: *const sigset_t) -> c_int;
    select(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, tv: *mut libc::timeval) -> c_int;
    pselect(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, ts: *const timespec, mask: *const sigset_t) -> c_int;
    epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int;
    epoll_wait(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int;
    epoll_pwait(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
    epoll_pwait2(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, ts: *const timespec, mask: *const sigset_t) -> c_int;
    close(fd: c_int) -> c_int;
    close_range(first: libc::c_uint, last: libc::c_uint, flags: c_int) -> c_int;
    dup(fd: c_int) -> c_int;
    dup2(fd: c_int, to: c_int) -> c_int;
    dup3(fd: c_int, to: c_int, flags: c_int) -> c_int;
    fcntl(fd: c_int, cmd: c_int, arg: libc::c_long) -> c_int;
    ioctl(fd: c_int, req: libc::c_ulong, arg: *mut c_void) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t;
    recvmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int, ts: *mut timespec) -> c_int;
    sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int;
    splice(fd_in: c_int, off_in: *mut libc::loff_t, fd_out: c_int, off_out: *mut libc::loff_t, n: size_t, flags: libc::c_uint) -> ssize_t;
    execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    posix_spawn(pid: *mut libc::pid_t, path: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    system(cmd: *const c_char) -> c_int;
    fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE;
    syscall(n: libc::c_long, a: libc::c_long, b: libc::c_long, c: libc::c_long, d: libc::c_long, e: libc::c_long, f: libc::c_long) -> libc::c_long;
    popen(cmd: *const c_char, mode: *const c_char) -> *mut libc::FILE;
}
