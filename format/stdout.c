// format/stdout.c — what the commands write on stdout goes through this one writer (the server's
// answer lines have their own, proto_out, with the same rule):
// - a line is written when it is complete, so a reader at the other end of a pipe has it at once;
// - a failed write (a full disk, a closed or read-only stdout, a reader gone away with SIGPIPE
//   ignored) is remembered with its errno, and nothing more is written;
// - so_finish, which main calls after every command, flushes what is left and turns a failure
//   into exit status 1 and one line on stderr, after everything that could be written was.
// main first makes sure descriptors 0, 1 and 2 are open (so_guard_fds): a closed stdout becomes
// /dev/null opened read-only, so every write to it fails as it should — and a file the command
// opens can never land on descriptor 1 or 2 and receive its output or its messages.

static struct {
    char buf[1 << 16];
    size_t len;
    int err;   // errno of the first failed write; 0: none
} so_w;

static void so_flush(void) {
    size_t at = 0;
    while (at < so_w.len && !so_w.err) {
        ssize_t k = write(1, so_w.buf + at, so_w.len - at);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) so_w.err = k < 0 ? errno : EIO;
        else at += (size_t)k;
    }
    so_w.len = 0;
}

static void so_write(const void *p, size_t n) {
    const char *s = p;
    int line_end = n && s[n - 1] == '\n';
    while (n && !so_w.err) {
        size_t k = sizeof so_w.buf - so_w.len < n ? sizeof so_w.buf - so_w.len : n;
        memcpy(so_w.buf + so_w.len, s, k);
        so_w.len += k;
        s += k;
        n -= k;
        if (so_w.len == sizeof so_w.buf) so_flush();
    }
    if (line_end) so_flush();
}

static void so_puts(const char *s) { so_write(s, strlen(s)); }

static void so_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void so_printf(const char *fmt, ...) {
    char t[1024];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    MOET_ASSERT(k >= 0 && (size_t)k < sizeof t, "so_printf piece longer than %zu bytes", sizeof t);
    so_write(t, (size_t)k);
}

// A write to stdout failed (the rest of the output is dropped).
static int so_failed(void) { return so_w.err != 0; }

// The end of a command: what is left is written; a failure is the command's failure. Returns
// the exit status: rc, or 1 when stdout failed and rc was 0.
static int so_finish(const char *cmd, int rc) {
    so_flush();
    if (fflush(stdout) != 0 && !so_w.err) so_w.err = errno ? errno : EIO;   // nothing should use stdio's stdout; if it did
    if (ferror(stdout) && !so_w.err) so_w.err = EIO;
    if (!so_w.err) return rc;
    fprintf(stderr, "moet%s%s: writing stdout failed: %s (the output is incomplete)\n", *cmd ? " " : "", cmd, strerror(so_w.err));
    so_w.err = 0;   // reported: a later command (in a test's process) starts clean
    return rc ? rc : 1;
}

// Descriptors 0, 1 and 2 open: a closed one becomes /dev/null (stdout read-only, so that writing
// to it fails; stdin read-only: empty; stderr write-only: messages are dropped).
static void so_guard_fds(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        int got = open("/dev/null", fd == 2 ? O_WRONLY : O_RDONLY);
        if (got >= 0 && got != fd) {   // a lower descriptor was closed too and took it: move it
            dup2(got, fd);
            close(got);
        }
    }
}
