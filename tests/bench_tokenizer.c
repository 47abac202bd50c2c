// tests/bench_tokenizer.c — encode speed of the tokenizer on one core (not part of ./build.sh test).
//   cc -std=c11 -O2 -DMOET_TEST -o build/bench_tokenizer tests/bench_tokenizer.c -lcrypto -ldl -lpthread -lm
//   build/bench_tokenizer TOKENIZER.json TEXT.txt [MAX_MB]
// Encodes the text (well-formed UTF-8; at most MAX_MB MB, default 10) in chunks of up to 64 KiB
// cut at line ends, checks that decoding gives the text back (for NFC input), and prints MB/s
// of wall time and of the thread's CPU time (the latter stays meaningful on a busy machine).
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"

#define BENCH_CHUNK (64u << 10)

static double bench_clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
static double bench_now(void) { return bench_clock(CLOCK_MONOTONIC); }
// CPU time of this thread: the one-core speed even when other processes share the core
static double bench_cpu(void) { return bench_clock(CLOCK_THREAD_CPUTIME_ID); }

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER.json TEXT.txt [MAX_MB]\n", argv[0]);
        return 2;
    }
    moet_err e;
    tok t;
    double t0 = bench_now();
    if (tok_load(&t, argv[1], NULL, &e)) { fprintf(stderr, "%s\n", e.msg); return 1; }
    double t_load = bench_now() - t0;
    size_t len;
    char *text = arena_read_small(argv[2], 1u << 30, &len, &e);
    if (!text) { fprintf(stderr, "%s\n", e.msg); return 1; }
    size_t max = (argc > 3 ? (size_t)atoi(argv[3]) : 10) << 20;
    if (len > max) {
        len = max;
        while (len && text[len - 1] != '\n') len--;
    }
    tok_scratch s;
    arena mem;
    if (tok_scratch_init(&s, &mem, BENCH_CHUNK, &e)) { fprintf(stderr, "%s\n", e.msg); return 1; }
    static int32_t ids[BENCH_CHUNK];
    static char back[4 * BENCH_CHUNK];
    size_t total_ids = 0, mismatches = 0;
    double best = 1e30, best_cpu = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double a = bench_now(), c = bench_cpu();
        total_ids = 0;
        for (size_t off = 0; off < len;) {
            size_t n = len - off < BENCH_CHUNK ? len - off : BENCH_CHUNK;
            if (off + n < len)
                while (n > 1 && text[off + n - 1] != '\n') n--;
            size_t k;
            if (tok_encode(&t, &s, text + off, n, ids, BENCH_CHUNK, &k, &e)) { fprintf(stderr, "%s\n", e.msg); return 1; }
            total_ids += k;
            if (rep == 0) {
                size_t bl;
                if (tok_decode(&t, ids, k, 0, back, sizeof back, &bl, &e) || bl != n || memcmp(back, text + off, n)) mismatches++;
            }
            off += n;
        }
        double dt = bench_now() - a, dc = bench_cpu() - c;
        if (rep == 0) continue;   // the first pass also decodes
        if (dt < best) best = dt;
        if (dc < best_cpu) best_cpu = dc;
    }
    printf("load %.2f s; %.2f MB -> %zu ids (%.2f bytes/id); encode %.1f MB/s wall, %.1f MB/s of CPU time (best of 2); "
           "round-trip mismatches: %zu chunks\n",
           t_load, len / 1e6, total_ids, (double)len / total_ids, len / 1e6 / best, len / 1e6 / best_cpu, mismatches);
    return 0;
}
