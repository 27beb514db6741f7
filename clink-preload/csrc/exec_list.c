/* The exec calls that take their arguments as a list: execl, execlp and execle. The C
 * library builds the argument vector and calls its internal execve, which no wrapper of
 * this library sees, so a connection whose descriptor the new program inherits would
 * not go back to the kernel first. These build the vector themselves and call the vector
 * forms this library wraps (execv, execvp, execve). They are reached through the exported
 * symbols of exec.rs, naked functions that jump here with the caller's arguments
 * untouched (stable Rust cannot define a C variadic function). */

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#define HIDDEN __attribute__((visibility("hidden")))

/* The number of arguments from `arg` up to the terminating NULL. */
static size_t list_len(const char *arg, va_list *ap) {
    size_t n = 0;
    for (const char *a = arg; a != NULL; a = va_arg(*ap, const char *))
        n++;
    return n;
}

/* Copies the arguments from `arg` up to the terminating NULL into `argv`, NULL after them;
 * `ap` is left after the NULL. */
static void list_fill(const char **argv, const char *arg, va_list *ap) {
    size_t i = 0;
    for (const char *a = arg; a != NULL; a = va_arg(*ap, const char *))
        argv[i++] = a;
    argv[i] = NULL;
}

/* Declares `argv`, the list from `arg` up to its NULL (E2BIG for one no vector can hold,
 * the C library's own limit), and leaves `ap` open after that NULL: the caller reads what
 * follows, if anything, and ends it. */
#define LIST_ARGV(argv, ap, arg)                                                            \
    size_t argc_;                                                                          \
    va_start(ap, arg);                                                                     \
    argc_ = list_len(arg, &ap);                                                            \
    va_end(ap);                                                                            \
    if (argc_ >= INT_MAX) {                                                                \
        errno = E2BIG;                                                                     \
        return -1;                                                                         \
    }                                                                                      \
    const char *argv[argc_ + 1];                                                           \
    va_start(ap, arg);                                                                     \
    list_fill(argv, arg, &ap)

HIDDEN int clink_preload_execl(const char *path, const char *arg, ...) {
    va_list ap;
    LIST_ARGV(argv, ap, arg);
    va_end(ap);
    return execv(path, (char *const *)argv);
}

HIDDEN int clink_preload_execlp(const char *file, const char *arg, ...) {
    va_list ap;
    LIST_ARGV(argv, ap, arg);
    va_end(ap);
    return execvp(file, (char *const *)argv);
}

/* execle: the environment follows the list's NULL. */
HIDDEN int clink_preload_execle(const char *path, const char *arg, ...) {
    va_list ap;
    LIST_ARGV(argv, ap, arg);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, (char *const *)argv, envp);
}
