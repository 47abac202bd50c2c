// tests/bench_sampler.c — the sampler's time per row at Qwen3.6's vocabulary, before and after
// (not part of ./build.sh test):
//   cc -std=c11 -O2 -DMOET_TEST -o build/bench_sampler tests/bench_sampler.c -lcrypto -ldl -lpthread -lm
//   build/bench_sampler [V] [ROWS]
// Rows of V logits (default 248,320) spread like a language model's: most tokens around 0
// (sd 2.5), one in a thousand 8-12 above. "before" is the plain sampler the fast one replaced
// (tests/samp_oracle.h: every probability, qsort on a global key, logprobs with a double exp
// per token); "after" is samp_bank_pick. Both pick from the same rows with the same seeds, and
// the tokens are compared. Prints µs per row of the thread's CPU time (the one-core speed even
// on a busy machine) and of wall time, best of 3 passes.
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"
#include "samp_oracle.h"

static double bench_clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    const char *name;
    samp_params sp;
    int logprobs, top;
} bench_case;

int main(int argc, char **argv) {
    int V = argc > 1 ? atoi(argv[1]) : 248320, R = argc > 2 ? atoi(argv[2]) : 64;
    if (V < 64 || R < 1) {
        fprintf(stderr, "usage: %s [V >= 64] [ROWS >= 1]\n", argv[0]);
        return 2;
    }
    const bench_case cases[] = {
        {"greedy", {0, 0, 1, 0, 0, 0, 1}, 0, 0},
        {"top-k 20 / top-p 0.8, T 0.7", {0.7f, 20, 0.8f, 0, 0, 0, 1}, 0, 0},
        {"top-k 20 / top-p 0.95, T 0.6", {0.6f, 20, 0.95f, 0, 0, 0, 1}, 0, 0},
        {"min-p 0.05, T 1", {1, 0, 1, 0.05f, 0, 0, 1}, 0, 0},
        {"greedy + logprobs, top 20", {0, 0, 1, 0, 0, 0, 1}, 1, 20},
        {"top-k/top-p + logprobs, top 20", {0.7f, 20, 0.8f, 0, 0, 0, 1}, 1, 20},
        {"top-k/top-p + penalties (4096 seen)", {0.7f, 20, 0.8f, 0, 0.5f, 0.2f, 1.1f}, 0, 0},
        {"top-p 0.9 alone, T 1", {1, 0, 0.9f, 0, 0, 0, 1}, 0, 0},
        {"temperature 1 alone", {1, 0, 1, 0, 0, 0, 1}, 0, 0},
    };
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    float *rows = malloc(sizeof(float) * (size_t)R * V), *owork = malloc(sizeof(float) * (size_t)V);
    int32_t *ocand = malloc(sizeof(int32_t) * (size_t)V), *prompt = malloc(sizeof(int32_t) * 4096);
    uint16_t *count = calloc((size_t)V, sizeof(uint16_t));
    uint8_t *seen = calloc((size_t)(V + 7) / 8, 1);
    int32_t *tok_a = malloc(sizeof(int32_t) * (size_t)R), *tok_b = malloc(sizeof(int32_t) * (size_t)R);
    uint64_t s = 12345;
    for (size_t i = 0; i < (size_t)R * V; i++) {
        double u1 = (double)(samp_splitmix(&s) >> 11) / 9007199254740992.0 + 1e-12;
        double u2 = (double)(samp_splitmix(&s) >> 11) / 9007199254740992.0;
        rows[i] = (float)(2.5 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
        if (samp_splitmix(&s) % 1000 == 0) rows[i] += 8 + (float)(samp_splitmix(&s) % 5);
    }
    for (int i = 0; i < 4096; i++) prompt[i] = (int32_t)(samp_splitmix(&s) % (uint64_t)V);
    samp_bank bank;
    moet_err e = {{0}};
    if (samp_bank_init(&bank, V, 1, 8192 + R, &e)) { fprintf(stderr, "%s\n", e.msg); return 1; }
    printf("sampler, V = %d, %d rows; microseconds per row (thread CPU time / wall), best of 3\n", V, R);
    printf("%-38s %17s %17s %8s %s\n", "", "before", "after", "speedup", "tokens");
    for (int c = 0; c < nc; c++) {
        const bench_case *bc = &cases[c];
        int penalized = samp_has_penalty(&bc->sp);
        double best[2][2] = {{1e30, 1e30}, {1e30, 1e30}};
        for (int pass = 0; pass < 3; pass++) {
            // before
            oracle_rng orng;
            oracle_seed(&orng, 77);
            oracle_scratch osc = {V, owork, ocand};
            oracle_slot os = {count, seen};
            memset(count, 0, sizeof(uint16_t) * (size_t)V);
            memset(seen, 0, (size_t)(V + 7) / 8);
            if (penalized) oracle_note_prompt(&os, prompt, 4096);
            int32_t ids[MOET_MAX_LOGPROBS];
            float lps[MOET_MAX_LOGPROBS], lp;
            double c0 = bench_clock(CLOCK_THREAD_CPUTIME_ID), w0 = bench_clock(CLOCK_MONOTONIC);
            for (int r = 0; r < R; r++) {
                const float *row = rows + (size_t)r * V;
                tok_a[r] = oracle_pick(&osc, &os, &bc->sp, &orng, row);
                if (bc->logprobs) oracle_logprobs(row, V, tok_a[r], bc->top, ids, lps);
                oracle_note_output(&os, tok_a[r]);
            }
            double c1 = bench_clock(CLOCK_THREAD_CPUTIME_ID), w1 = bench_clock(CLOCK_MONOTONIC);
            // after
            if (samp_bank_admit(&bank, 0, &bc->sp, 77, bc->logprobs, bc->top, prompt, penalized ? 4096 : 0, &e)) {
                fprintf(stderr, "%s\n", e.msg);
                return 1;
            }
            for (int r = 0; r < R; r++) samp_bank_pick(&bank, 0, rows + (size_t)r * V, &tok_b[r], &lp, ids, lps);
            double c2 = bench_clock(CLOCK_THREAD_CPUTIME_ID), w2 = bench_clock(CLOCK_MONOTONIC);
            samp_bank_release(&bank, 0);
            double t[2][2] = {{c1 - c0, w1 - w0}, {c2 - c1, w2 - w1}};
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++)
                    if (t[i][j] < best[i][j]) best[i][j] = t[i][j];
        }
        int same = !memcmp(tok_a, tok_b, sizeof(int32_t) * (size_t)R);
        printf("%-38s %8.1f /%7.1f %8.1f /%7.1f %7.1fx %s\n", bc->name, best[0][0] * 1e6 / R, best[0][1] * 1e6 / R,
               best[1][0] * 1e6 / R, best[1][1] * 1e6 / R, best[0][0] / best[1][0], same ? "same" : "DIFFERENT");
    }
    samp_bank_free(&bank);
    return 0;
}
