/* A native stack on demand, for a process that never returns from C (no gdb on the GPU
 * machine): ``install(path, signo)`` makes ``signo`` append the receiving thread's id and its
 * C stack (glibc's backtrace, symbol names as exported) to ``path``. Another process sends
 * the signal to each thread with tgkill; a thread waiting on a futex runs the handler and goes
 * back to waiting. Built by benchmarks/native_stacks.py; never loaded by gpumem_nb itself. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int out_fd = -1;

static void on_signal(int signo) {
    (void)signo;
    void *frames[128];
    char head[64];
    int n = backtrace(frames, 128);
    int len = snprintf(head, sizeof head, "--- tid %ld, %d frames\n", (long)syscall(SYS_gettid), n);
    if (out_fd >= 0) {
        ssize_t w = write(out_fd, head, (size_t)len);
        (void)w;
        backtrace_symbols_fd(frames, n, out_fd);
    }
}

int install(const char *path, int signo) {
    void *warm[4];
    backtrace(warm, 4); /* loads libgcc_s now, not inside the handler */
    out_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out_fd < 0) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(signo, &sa, NULL);
}
