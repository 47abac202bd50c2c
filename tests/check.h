// tests/check.h — the test harness: CHECK counts, a failure prints where and why.
// Each test program ends with check_report(name), which prints "name: N passed, M failed,
// K skipped" (build.sh adds them up per file and over all files).
//
// What counts as one check: one CHECK, one property (CHECK_PROP … check_prop_end) however many
// cases it went through, one named skip (CHECK_SKIP). A loop over the elements of one result
// should fold them into one CHECK (or one property), so that the counts say how many things
// were asserted, not how many numbers were compared.
#ifndef MOET_CHECK_H
#define MOET_CHECK_H

static int check_passed, check_failed, check_skipped;

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

// A part of the test that did not run here: counted, and named on stderr with the reason, so
// that a skip never reads as a pass. Where running is required (MOET_REQUIRE_GPU=1 for the GPU
// parts), the caller makes it a failure instead.
#define CHECK_SKIP(what, ...)                                                   \
    do {                                                                        \
        check_skipped++;                                                        \
        fprintf(stderr, "SKIP %s:%d: %s:", __FILE__, __LINE__, (what));         \
        fprintf(stderr, " " __VA_ARGS__);                                        \
        fputc('\n', stderr);                                                    \
    } while (0)

// A property checked over many cases (random inputs, every line of an output, every element of
// a tensor): each case is CHECK_PROP(&p, cond, …), and check_prop_end(&p) counts the property
// once, as passed when every case held. The first few failing cases are printed, then the total.
typedef struct {
    const char *name;
    long cases, failed;
} check_prop;

#define CHECK_PROP(p, cond, ...)                                                                \
    do {                                                                                        \
        (p)->cases++;                                                                           \
        if (!(cond) && (p)->failed++ < 5) {                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: %s:", __FILE__, __LINE__, (p)->name, #cond);       \
            fprintf(stderr, " " __VA_ARGS__);                                                   \
            fputc('\n', stderr);                                                                \
        }                                                                                       \
    } while (0)

static void check_prop_end(check_prop *p) {
    if (p->failed) {
        check_failed++;
        fprintf(stderr, "FAIL property \"%s\": %ld of %ld cases failed\n", p->name, p->failed, p->cases);
    } else if (p->cases == 0) {
        check_failed++;
        fprintf(stderr, "FAIL property \"%s\": no case was checked\n", p->name);
    } else check_passed++;
    p->cases = p->failed = 0;
}

static int check_report(const char *name) {
    printf("%s: %d passed, %d failed, %d skipped\n", name, check_passed, check_failed, check_skipped);
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

// check_nerr against a float64 reference b (an oracle computed in f64).
static double check_nerr64(const float *a, const double *b, size_t n) {
    double d = 0, mean = 0, var = 0;
    for (size_t i = 0; i < n; i++) mean += b[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) var += (b[i] - mean) * (b[i] - mean);
    for (size_t i = 0; i < n; i++) d = isnan(a[i]) ? INFINITY : fmax(d, fabs((double)a[i] - b[i]));
    return d / sqrt(var / (double)n);
}

#endif
