// arena/base.c — the two error tiers and the allocation counter.
//
// Tier 1, broken invariants (a bug or a GPU fault): MOET_ASSERT / moet_die print the place
// and reason to stderr and abort. stdout is the protocol and never sees these.
// Tier 2, bad input (a file, a request, a flag): functions return -1 and fill a moet_err
// with one clear sentence (what, where, expected, actual); the caller reports it and goes on
// or refuses to boot.

typedef struct {
    char msg[1024];
} moet_err;

static void moet_die_at(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

static void moet_die_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "moet: fatal: %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

#define moet_die(...) moet_die_at(__FILE__, __LINE__, __VA_ARGS__)
#define MOET_ASSERT(cond, ...)                                                   \
    do {                                                                         \
        if (!(cond)) moet_die_at(__FILE__, __LINE__, "assertion `" #cond "` failed: " __VA_ARGS__); \
    } while (0)

// Fills e (when given) and returns -1, so an error path reads `return err_set(e, ...)`.
static int err_set(moet_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int err_set(moet_err *e, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

// Prepends context to an error already set: "while X: <old message>".
static int err_wrap(moet_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int err_wrap(moet_err *e, const char *fmt, ...) {
    if (e) {
        char pre[512], old[sizeof e->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(pre, sizeof pre, fmt, ap);
        va_end(ap);
        memcpy(old, e->msg, sizeof old);
        old[sizeof old - 1] = 0;
        size_t pl = strlen(pre), ol = strlen(old), cap = sizeof e->msg - 1;
        if (pl > cap - 2) pl = cap - 2;
        memcpy(e->msg, pre, pl);
        memcpy(e->msg + pl, ": ", 2);
        if (ol > cap - pl - 2) ol = cap - pl - 2;
        memcpy(e->msg + pl + 2, old, ol);
        e->msg[pl + 2 + ol] = 0;
    }
    return -1;
}

// ---- checked size arithmetic: every size computed from file contents goes through these
static int size_mul(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return -1;
    *out = a * b;
    return 0;
}
static int size_add(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return -1;
    *out = a + b;
    return 0;
}

// Seconds on the monotonic clock (for rates and timings; never for protocol values).
static double moet_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
