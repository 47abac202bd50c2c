// tests/check.h — the test harness: CHECK counts, a failure prints where and why.
// Each test program ends by printing "N passed, M failed" (build.sh adds them up).
#ifndef MOET_CHECK_H
#define MOET_CHECK_H

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) check_passed++;                                               \
        else {                                                                  \
            check_failed++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s:", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, " " __VA_ARGS__);                                    \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

static int check_report(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

// The error of a against the reference b normalised by b's spread: max |a − b| / std(b).
// A NaN anywhere counts as an infinite error.
static double check_nerr(const float *a, const float *b, size_t n) {
    double mean = 0, var = 0, mx = 0;
    for (size_t i = 0; i < n; i++) mean += b[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) var += (b[i] - mean) * (b[i] - mean);
    double sd = sqrt(var / (double)n);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= mx)) mx = isnan(d) ? INFINITY : d;
    }
    return mx / (sd > 0 ? sd : 1);
}

#endif
