// tests/bench_prefix.c — what the prefix cache saves on a JSONL job whose requests share a long
// prefix (not part of ./build.sh test):
//   cc -std=c11 -O2 -DMOET_TEST -o build/bench_prefix tests/bench_prefix.c -lcrypto -ldl -lpthread -lm
//   build/bench_prefix --model DIR [--planes FILE] [--requests 256] [--prefix 2048] [--question 64] [--gen 16]
//                      [--max-num-seqs 16] [--max-batch-tokens 2048] [--prefix-block 256] [--prefix-cache-gb G]
//                      [--backend auto|cpu|gpu] [--kv-dtype T] [--threads N] [--only on|off]
// The job: R requests (input_ids, greedy, ignore_eos, --gen tokens each) whose prompts are one
// shared prefix of P random ids and a question of Q ids of their own. The scheduler and serve
// loop (serve_run) answer it twice over the same backend kind, the prefix cache off and then on
// (a fresh engine each time), from a file of requests read as fast as the queue takes them: the
// prompt tokens computed (prompt − cached), the steps and the wall time from the ready line to
// the last answer; the generated tokens of the two runs are compared. One JSON line on stdout.
#ifndef MOET_TEST
#define MOET_TEST
#endif
#include "../moet.c"

static int bp_encode(void *self, const char *text, size_t n, int32_t *ids, int cap, int *n_ids, moet_err *e) {
    (void)self, (void)text, (void)n, (void)ids, (void)cap, (void)n_ids;
    return err_set(e, "token ids only");
}
static void bp_piece(void *self, int32_t id, int skip_special, const char **s, size_t *n) {
    (void)self, (void)skip_special;
    static const char hex[] = "0123456789abcdef";
    *s = hex + (id & 15);
    *n = 1;
}

typedef struct {
    double seconds;
    uint64_t prompt, cached, gen, steps, saves, evictions, hits;
    int blocks, block;
    double block_mib;
    uint64_t digest;   // of every answer's token ids, in id order
} bp_result;

// FNV-1a over the "token_ids" arrays of the answers in out (each request's line found by its id).
static uint64_t bp_digest(const char *out, int R) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int k = 0; k < R; k++) {
        char key[48];
        snprintf(key, sizeof key, "{\"id\":\"r%d\",", k);
        const char *l = strstr(out, key), *t = l ? strstr(l, "\"token_ids\":[") : NULL, *end = t ? strchr(t, ']') : NULL;
        for (const char *p = t; p && p < end; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
        if (!t) h ^= 0xdead;
    }
    return h;
}

static int bp_run(ck_model *m, const char *backend, const char *planes, pf_serve_opts popt, int kv_dtype, int threads, int seqs, int batch,
                  int max_len, int R, int block, double gb, const char *in_path, bp_result *res) {
    static engine_any E;
    static serve_ctx S;
    moet_err e = {{0}};
    engine_opts eo = {seqs, max_len, batch, threads, kv_dtype, planes, popt, MOET_HOST_MARGIN_GB, 0, 0, 0};
    if (engine_open_prefix(&E, backend, m, &eo, block, gb, "bench_prefix", &e)) {
        fprintf(stderr, "bench_prefix: %s\n", e.msg);
        return -1;
    }
    serve_config cfg = {seqs, batch, R, 0, "bench", {1.0f, 0, 1.0f, 0, 0, 0, 1.0f}, 0, {0}, 1, 0, 0, 0, 0, 0};
    if (E.be.prefix_blocks) cfg.prefix_identity = prefix_identity(m, planes, E.is_gpu, kv_dtype, 0, E.be.prefix_block, &e);
    if (serve_init(&S, &cfg, E.be, (serve_codec){NULL, bp_encode, bp_piece}, &e)) {
        fprintf(stderr, "bench_prefix: %s\n", e.msg);
        engine_close(&E);
        return -1;
    }
    char out_path[] = "/tmp/bench_prefix_out_XXXXXX";
    int fi = open(in_path, O_RDONLY), fo = mkstemp(out_path);
    MOET_ASSERT(fi >= 0 && fo >= 0, "files");
    arena_freeze();
    double t0 = moet_now();
    int rc = serve_run(&S, fi, fo);
    res->seconds = moet_now() - t0;
    arena_stats.frozen = 0;
    res->prompt = S.prompt_tokens, res->cached = S.cached_tokens, res->gen = S.gen_tokens, res->steps = S.steps;
    res->saves = S.pfx.saves, res->evictions = S.pfx.evictions, res->hits = S.pfx.hits;
    res->blocks = E.be.prefix_blocks, res->block = E.be.prefix_block;
    res->block_mib = !E.be.prefix_blocks ? 0 : (E.is_gpu ? gpu_prefix_bytes(&m->cfg, kv_dtype, block, E.g.g.o.mtp) : ref_prefix_bytes(&m->cfg, block)) / 1048576.0;
    off_t size = lseek(fo, 0, SEEK_END);
    char *out = malloc((size_t)size + 1);
    MOET_ASSERT(out && pread(fo, out, (size_t)size, 0) == size, "read answers");
    out[size] = 0;
    res->digest = bp_digest(out, R);
    free(out);
    close(fi), close(fo);
    unlink(out_path);
    serve_free(&S);
    engine_close(&E);
    return rc || S.n_errors ? -1 : 0;
}

// --flag N: an integer in [lo, hi] into *out; 2 with a message otherwise (a bench's own flags).
static int moet_arg_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || n < lo || n > hi) {
        fprintf(stderr, "%s: %s %s: expected an integer in %ld..%ld\n", cmd, flag, v ? v : "(missing)", lo, hi);
        return 2;
    }
    *out = (int)n;
    return 0;
}

int main(int argc, char **argv) {
    const char *model = NULL, *planes = NULL, *backend = "auto", *only = NULL;
    int R = 256, P = 2048, Q = 64, G = 16, seqs = 16, batch = 2048, block = MOET_PREFIX_BLOCK, threads = 0, kv_dtype = GPU_KV_BF16;
    double gb = -1;
    pf_serve_opts popt = {0, 0, 0, 1, 0, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        int rc = 0;
        if (!strcmp(a, "--no-verify")) { popt.no_verify = 1; continue; }
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--planes")) planes = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--only")) only = v;
        else if (!strcmp(a, "--requests")) rc = moet_arg_int("bench_prefix", a, v, 1, 60000, &R);
        else if (!strcmp(a, "--prefix")) rc = moet_arg_int("bench_prefix", a, v, 1, 1 << 20, &P);
        else if (!strcmp(a, "--question")) rc = moet_arg_int("bench_prefix", a, v, 1, 1 << 20, &Q);
        else if (!strcmp(a, "--gen")) rc = moet_arg_int("bench_prefix", a, v, 1, 1 << 20, &G);
        else if (!strcmp(a, "--max-num-seqs")) rc = moet_arg_int("bench_prefix", a, v, 1, MOET_MAX_SEQS, &seqs);
        else if (!strcmp(a, "--max-batch-tokens")) rc = moet_arg_int("bench_prefix", a, v, 1, 1 << 20, &batch);
        else if (!strcmp(a, "--prefix-block")) rc = moet_arg_int("bench_prefix", a, v, 1, 1 << 20, &block);
        else if (!strcmp(a, "--threads")) rc = moet_arg_int("bench_prefix", a, v, 1, MOET_MAX_THREADS, &threads);
        else if (!strcmp(a, "--prefix-cache-gb")) gb = atof(v);
        else if (!strcmp(a, "--kv-dtype")) rc = engine_kv_dtype(v, &kv_dtype);
        else rc = 1;
        if (rc) { fprintf(stderr, "bench_prefix: bad option %s %s (see the head of tests/bench_prefix.c)\n", a, v); return 2; }
    }
    if (!model) { fprintf(stderr, "bench_prefix: need --model DIR\n"); return 2; }
    moet_err e = {{0}};
    static ck_model m;
    if (ck_open(&m, model, &e)) { fprintf(stderr, "bench_prefix: %s\n", e.msg); return 1; }
    int V = m.cfg.vocab < 4000 ? m.cfg.vocab : 4000, max_len = P + Q + G + 8;
    if (!threads) threads = pf_ncpu();
    // the job, as a file of request lines
    char in_path[] = "/tmp/bench_prefix_in_XXXXXX";
    int fd = mkstemp(in_path);
    FILE *f = fdopen(fd, "w");
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int32_t *pre = malloc(sizeof(int32_t) * (size_t)P);
    for (int i = 0; i < P; i++) pre[i] = (int32_t)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % V;
    for (int k = 0; k < R; k++) {
        fprintf(f, "{\"id\":\"r%d\",\"input_ids\":[", k);
        for (int i = 0; i < P; i++) fprintf(f, i ? ",%d" : "%d", pre[i]);
        for (int i = 0; i < Q; i++) fprintf(f, ",%d", (int)(((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % V));
        fprintf(f, "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"return_token_ids\":true}\n", G);
    }
    fclose(f);
    free(pre);
    bp_result off = {0}, on = {0};
    int rc = 0;
    if (!only || !strcmp(only, "off")) rc |= bp_run(&m, backend, planes, popt, kv_dtype, threads, seqs, batch, max_len, R, 0, 0, in_path, &off);
    if (!only || !strcmp(only, "on")) rc |= bp_run(&m, backend, planes, popt, kv_dtype, threads, seqs, batch, max_len, R, block, gb, in_path, &on);
    unlink(in_path);
    const bp_result *rs[2] = {&off, &on};
    const char *names[2] = {"off", "on"};
    printf("{\"object\":\"bench_prefix\",\"model\":\"%s\",\"requests\":%d,\"prefix\":%d,\"question\":%d,\"gen\":%d,\"max_num_seqs\":%d,"
           "\"max_batch_tokens\":%d",
           model, R, P, Q, G, seqs, batch);
    for (int i = 0; i < 2; i++) {
        const bp_result *r = rs[i];
        if (only && strcmp(only, names[i])) continue;
        printf(",\"%s\":{\"seconds\":%.3f,\"prompt_tokens\":%" PRIu64 ",\"cached_tokens\":%" PRIu64 ",\"prefill_tokens_computed\":%" PRIu64
               ",\"generated\":%" PRIu64 ",\"steps\":%" PRIu64 ",\"prefix_block\":%d,\"prefix_blocks\":%d,\"block_mib\":%.3f,"
               "\"hits\":%" PRIu64 ",\"saves\":%" PRIu64 ",\"evictions\":%" PRIu64 ",\"tokens_digest\":\"%016" PRIx64 "\"}",
               names[i], r->seconds, r->prompt, r->cached, r->prompt - r->cached, r->gen, r->steps, r->block, r->blocks, r->block_mib,
               r->hits, r->saves, r->evictions, r->digest);
        fprintf(stderr, "bench_prefix: cache %-3s: %" PRIu64 " of %" PRIu64 " prompt tokens computed (%" PRIu64 " cached), %" PRIu64
                        " steps, %.2f s from ready to the last answer\n",
                names[i], r->prompt - r->cached, r->prompt, r->cached, r->steps, r->seconds);
    }
    int same = !only ? off.digest == on.digest : -1;
    if (!only) printf(",\"same_tokens\":%s,\"speedup\":%.2f", same ? "true" : "false", on.seconds > 0 ? off.seconds / on.seconds : 0);
    printf("}\n");
    if (!only) fprintf(stderr, "bench_prefix: %.2fx faster; the generated tokens are %s\n", off.seconds / on.seconds, same ? "the same" : "NOT the same");
    ck_close(&m);
    return rc || same == 0;
}
