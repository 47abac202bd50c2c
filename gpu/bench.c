// gpu/bench.c — `moet bench`: prefill and decode throughput of a model on the GPU (or the CPU
// reference), with the bytes a decode step must read and the bandwidth that achieves, next to
// the device's own copy bandwidth measured in the same run (calm's built-in profiler idea:
// we know the bytes, so we know how far from the memory roofline we are).
//
// Per batch size B: B sequences get a prompt of --prompt random tokens (prefill, timed, in
// steps of --max-batch-tokens), then are filled to --depth tokens of context (untimed), then
// decode --gen steps of B tokens each (timed; the first two are warm-up, untimed). Prompt tokens are random ids: throughput does not
// depend on the values (every op's work is fixed by the shapes), except the routed experts,
// whose touched set at B > 1 follows the router. Each decode step feeds every sequence its own
// last token, picked greedily (or sampled: --temperature, --top-k, --top-p), as serving does; with --speculative-tokens N its MTP head drafts N
// a step and a step emits 1 .. N + 1 tokens a sequence (counted: the decode rate is of tokens);
// with --speculative-tokens auto each step's drafts come from the server's controller (spec_ctrl,
// moet.c), whose first probes of every k run untimed before the timed steps (which then hold its
// choice, with its reprobes), as a server that has been running a while decodes. The probes come
// before the fill to --depth, so the timed steps start at --depth as without drafts (a step's
// attention costs more the deeper it is) unless the probes' tokens took a sequence past it: the
// result says the depth the timed steps started from (the smallest and the largest of the batch).

typedef struct {
    const char *model, *planes, *backend, *kv_dtype_name, *act_dtype_name;
    moet_list batch;
    int prompt, gen, depth, max_batch_tokens, threads, kv_dtype, act_bf16, profile, no_verify, spec, spec_auto, io_depth;
    const char *spec_name;
    pf_serve_opts popt;
    double host_margin_gb, expert_cache_gb, route_zipf;
    double temperature, top_p;   // each sequence's sampling (its seed its index); temperature 0: greedy
    int top_k;
    const char *prefetch, *graphs, *mtp;
} bench_opts;

static const char bench_usage[] =
    "usage: moet bench --model DIR [--planes FILE] [--batch 1,16] [--prompt N] [--gen N] [--depth N] [options]\n"
    "Prefill and decode throughput per batch size, bytes read per decode step, achieved GB/s and the\n"
    "device's copy bandwidth measured in the same run.\n"
    "options:\n"
    "  --model DIR           checkpoint directory\n"
    "  --planes FILE         routed experts from this MOET2PF1 plane file (the resident expert pool)\n"
    "  --no-verify           with --planes: skip the SHA-256 check of every slot\n"
    "  --batch LIST          batch sizes, comma separated (default 1,16)\n"
    "  --prompt N            prompt tokens per sequence, prefill timed (default 512)\n"
    "  --gen N               decode steps (default 64, at least 3): the first two warm up, the rest\n"
    "                        are timed\n"
    "  --depth N             context length before the timed decode (default: the prompt; with\n"
    "                        --speculative-tokens auto the probes' tokens come first and may take a\n"
    "                        sequence past it: the result says the depth the timed steps start at)\n"
    "  --max-batch-tokens N  tokens per prefill step (default 8192)\n"
    "  --kv-dtype T          KV cache: bf16 (default), fp8 or f32\n"
    "  --act-dtype T         the matrix products' inputs: auto (default: bf16 on the GPU, f32 with\n"
    "                        --kv-dtype f32 and on the CPU), f32 or bf16 (rounded to bf16)\n"
    "  --backend B           auto (default: the GPU when there is one), gpu or cpu\n"
    "  --profile             GPU: time every kernel of the decode steps and print where the time goes, one by one and\n"
    "                        inside the decode graph (each kernel's nodes disabled in turn)\n"
    "  --cuda-graphs on|off  GPU: decode steps replay a graph captured at boot (default on); off: the\n"
    "                        host launches every kernel of every step\n"
    "  --speculative-tokens auto|0..8  drafts the MTP head proposes per decode step (default 0): each\n"
    "                        batch then reports the drafts verified and accepted and the tokens per\n"
    "                        step; auto: the server's choice per batch size (0 to 4, measured; its\n"
    "                        first probes untimed), reported with the tok/s it measured for each\n"
    "  --mtp FILE            the MTP head (mtp.* tensors) from this file, for a checkpoint without one\n"
    "  --temperature X       decode picks sampled at this temperature (default 0: greedy), each\n"
    "                        sequence seeded by its index\n"
    "  --top-k N             with --temperature: the N most likely tokens (default 0, or above the\n"
    "                        vocabulary: all)\n"
    "  --top-p X             with --temperature: the most likely tokens up to this mass (default 1)\n"
    "  --threads N           CPU backend: worker threads (default: the cores)\n"
    "  --host-margin-gb G    on a GPU that shares the host's memory (GB10): GiB of MemAvailable the\n"
    "                        memory plan leaves the host (default 4)\n"
    "  --expert-cache-gb G   with --planes: hold at most G GiB of expert slots (on the GPU at least one\n"
    "                        layer's experts, no decode graphs), reading the\n"
    "                        others from the file as they are used; each batch's decode then reports\n"
    "                        the cache's hits, misses, bytes read, read GB/s and the time steps waited\n"
    "  --expert-prefetch on|off  with --expert-cache-gb: reads ahead (default: on for the CPU\n"
    "                        reference, off on the GPU, where it measured slower)\n"
    "  --io-depth N          GPU, with --expert-cache-gb: slot reads in flight (reader threads, 1 to\n"
    "                        32; default 8)\n"
    "  --route-zipf S        GPU, with --expert-cache-gb: what the cache sees from a router with skewed\n"
    "                        expert popularity: each layer's choices replaced by draws from a Zipf\n"
    "                        popularity of exponent S (a fixed seed; no reads ahead): the cache's\n"
    "                        counters and the speed are measured, the tokens are not the model's\n"
    "  -h, --help            this text\n";

static const moet_flag bench_flag_table[] = {
    FLAG_DIR("--model", bench_opts, model),
    FLAG_FILE("--planes", bench_opts, planes),
    FLAG_SWITCH("--no-verify", bench_opts, no_verify),
    FLAG_LIST("--batch", bench_opts, batch, 1, 1024),
    FLAG_INT("--prompt", bench_opts, prompt, 1, 1 << 20),
    FLAG_INT("--gen", bench_opts, gen, 3, 1 << 20),   // two warm-up steps and at least one timed
    FLAG_INT("--depth", bench_opts, depth, 1, 1 << 22),
    FLAG_INT("--max-batch-tokens", bench_opts, max_batch_tokens, 1, 1 << 20),
    FLAG_CHOICE("--kv-dtype", bench_opts, kv_dtype_name, "bf16|fp8|f32"),
    FLAG_CHOICE("--act-dtype", bench_opts, act_dtype_name, "auto|f32|bf16"),
    FLAG_CHOICE("--backend", bench_opts, backend, "auto|gpu|cpu"),
    FLAG_SWITCH("--profile", bench_opts, profile),
    FLAG_NUM("--temperature", bench_opts, temperature, 0, 1e6),
    FLAG_INT("--top-k", bench_opts, top_k, 0, 1 << 30),
    FLAG_NUM("--top-p", bench_opts, top_p, 1e-9, 1),
    FLAG_INT("--threads", bench_opts, threads, 1, MOET_MAX_THREADS),
    FLAG_NUM("--host-margin-gb", bench_opts, host_margin_gb, 0, 1 << 20),
    FLAG_NUM("--expert-cache-gb", bench_opts, expert_cache_gb, 0, 1 << 20),
    FLAG_CHOICE("--expert-prefetch", bench_opts, prefetch, "on|off"),
    FLAG_INT("--io-depth", bench_opts, io_depth, 1, MOET_GPU_CACHE_READERS),
    FLAG_NUM("--route-zipf", bench_opts, route_zipf, 0, 100),
    FLAG_CHOICE("--cuda-graphs", bench_opts, graphs, "on|off"),
    FLAG_CHOICE("--speculative-tokens", bench_opts, spec_name, "auto|0|1|2|3|4|5|6|7|8"),
    FLAG_FILE("--mtp", bench_opts, mtp),
};

// The device's copy bandwidth: a 1 GiB device-to-device copy, best of 5, bytes read + written.
static double bench_copy_gbs(gpu_engine *g) {
    size_t n = (size_t)1 << 30;
    arena a;
    moet_err e;
    if (arena_init_kind(&a, "copy probe", ARENA_DEVICE, 2 * n, &e)) return 0;
    CUevent t0, t1;
    CU_CHECK(cu.cuEventCreate(&t0, 0));
    CU_CHECK(cu.cuEventCreate(&t1, 0));
    CUdeviceptr src = (uintptr_t)a.base, dst = src + n;
    CU_CHECK(cu.cuMemsetD8(src, 1, n));
    CU_CHECK(cu.cuCtxSynchronize());   // the legacy stream's memset before the compute stream's copies
    float best = 1e30f;
    for (int i = 0; i < 6; i++) {
        CU_CHECK(cu.cuEventRecord(t0, g->compute));
        CU_CHECK(cu.cuMemcpyDtoDAsync(dst, src, n, g->compute));
        CU_CHECK(cu.cuEventRecord(t1, g->compute));
        CU_CHECK(cu.cuEventSynchronize(t1));
        float ms;
        CU_CHECK(cu.cuEventElapsedTime(&ms, t0, t1));
        if (i && ms < best) best = ms;   // the first copy warms up
    }
    CU_CHECK(cu.cuEventDestroy(t0));
    CU_CHECK(cu.cuEventDestroy(t1));
    arena_release(&a);
    return 2.0 * n / (best / 1e3) / 1e9;
}

// One step through the backend interface, waited for (launch + collect): what serving does.
// *launch_s (if not NULL) += the seconds the host spent queueing the step (be->launch): next to
// the step's time, how much of it the host's launches take. res (if not NULL): the step's results.
static int bench_step(engine_backend *be, int n, const int *slots, const int32_t *ids, const int *off, const uint8_t *want, double *launch_s,
                      engine_result *res, moet_err *e) {
    engine_step st = {n, slots, ids, off, want};
    engine_result r;
    double t = moet_now();
    if (be->launch(be->self, &st, e)) return -1;
    if (launch_s) *launch_s += moet_now() - t;
    return be->collect(be->self, res ? res : &r, e);
}

// Row i's last token of a step's results: the picked one, or the last of those a speculating row emitted.
static int32_t bench_last(const engine_result *res, int i) {
    int nt = res->n_tok ? res->n_tok[i] : 1;
    return nt > 1 ? res->more[(size_t)i * MOET_MAX_SPEC + nt - 2] : res->token[i];
}

// Feeds each of the B sequences random tokens from fed[s] up to `goal` positions, as many whole
// sequences' chunks per step as fit in Tm tokens (cut as the server cuts prompts, at multiples of
// the backend's chunk alignment, where that takes something, else as far as the room goes); a
// sequence that reaches the goal takes its pick into last[s]. *steps counts the steps (for
// --profile's kernel times per step).
static int bench_feed(engine_backend *be, int B, int *fed, int goal, int Tm, int vocab, uint64_t *rng, int32_t *ids, int *slots, int *off,
                      uint8_t *want, int32_t *last, gpu_engine *prof, int *steps, moet_err *e) {
    for (;;) {
        int n = 0, T = 0;
        off[0] = 0;
        for (int s = 0; s < B && T < Tm; s++) {
            int left = goal - fed[s];
            if (left <= 0) continue;
            int k = engine_chunk_take(fed[s], left, Tm - T, be->chunk_align);
            if (k <= 0) k = Tm - T;
            for (int j = 0; j < k; j++) {
                *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
                ids[T + j] = (int32_t)((*rng >> 33) % (uint64_t)vocab);
            }
            T += k;
            fed[s] += k;
            want[n] = fed[s] == goal;
            slots[n++] = s;
            off[n] = T;
        }
        if (!n) return 0;
        engine_result res;
        if (bench_step(be, n, slots, ids, off, want, NULL, &res, e)) return -1;
        for (int i = 0; i < n; i++)
            if (want[i]) last[slots[i]] = bench_last(&res, i);
        if (prof && prof->k.prof) gpu_prof_collect(&prof->k), (*steps)++;
    }
}

// The expert cache (--expert-cache-gb, format/planes_model.c) over a batch's timed decode steps:
// pool and file slots, hits and misses, bytes read (by the steps and the prefetch thread), what
// that is per second of decode, the steps' milliseconds spent reading or waiting for a slot, the
// slots prefetched and used, and of the experts layers ≥ 1 used those the next-layer guess named.
typedef struct {
    int on;
    uint64_t pool, file, hits, misses, bytes, prefetched, prefetch_used, guess_needed, guess_named, prefetch_dropped;
    double read_gbs, wait_ms;
} bench_cache;

static bench_cache bench_cache_over(const pf_cache_counters *a, double seconds, int steps) {
    bench_cache x = {0};
    x.on = pf_cache_stats.pool_slots > 0;
    x.pool = pf_cache_stats.pool_slots, x.file = pf_cache_stats.file_slots;
    x.hits = pf_cache_stats.hits - a->hits, x.misses = pf_cache_stats.misses - a->misses, x.bytes = pf_cache_stats.bytes - a->bytes;
    x.prefetched = pf_cache_stats.prefetched - a->prefetched, x.prefetch_used = pf_cache_stats.prefetch_used - a->prefetch_used;
    x.guess_needed = pf_cache_stats.guess_needed - a->guess_needed, x.guess_named = pf_cache_stats.guess_named - a->guess_named;
    x.prefetch_dropped = pf_cache_stats.prefetch_dropped - a->prefetch_dropped;
    x.read_gbs = seconds > 0 ? x.bytes / seconds / 1e9 : 0;
    x.wait_ms = (pf_cache_stats.read_s - a->read_s) * 1e3 / (steps > 0 ? steps : 1);
    return x;
}

static void bench_cache_json(js_writer *w, const bench_cache *x) {
    js_w_key(w, "expert_cache"), js_w_obj(w);
    js_w_key(w, "pool_slots"), js_w_num(w, (double)x->pool);
    js_w_key(w, "file_slots"), js_w_num(w, (double)x->file);
    js_w_key(w, "hits"), js_w_num(w, (double)x->hits);
    js_w_key(w, "misses"), js_w_num(w, (double)x->misses);
    js_w_key(w, "bytes_read"), js_w_num(w, (double)x->bytes);
    js_w_key(w, "read_gbs"), js_w_num(w, round(x->read_gbs * 1e3) / 1e3);
    js_w_key(w, "wait_ms_per_step"), js_w_num(w, round(x->wait_ms * 1e3) / 1e3);
    js_w_key(w, "prefetched"), js_w_num(w, (double)x->prefetched);
    js_w_key(w, "prefetch_used"), js_w_num(w, (double)x->prefetch_used);
    js_w_key(w, "prefetch_dropped"), js_w_num(w, (double)x->prefetch_dropped);
    js_w_key(w, "next_layer_used"), js_w_num(w, (double)x->guess_needed);
    js_w_key(w, "next_layer_named"), js_w_num(w, (double)x->guess_named);
    js_w_end_obj(w);
}

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmd_bench(int argc, char **argv) {
    bench_opts o = {.backend = "auto", .kv_dtype_name = "bf16", .act_dtype_name = "auto", .prompt = 512, .gen = 64, .depth = -1, .max_batch_tokens = 8192, .host_margin_gb = MOET_HOST_MARGIN_GB,
                    .batch = {2, {1, 16}}, .top_p = 1};
    int arc = moet_args("bench", bench_usage, bench_flag_table, (int)(sizeof bench_flag_table / sizeof bench_flag_table[0]), argc,
                        argv, &o);
    if (arc) return arc == MOET_ARGS_HELP ? 0 : arc;
    if (!o.model) return moet_usage_error("bench", bench_usage, "need --model DIR");
    if (o.expert_cache_gb > 0 && !o.planes)
        return moet_usage_error("bench", bench_usage, "--expert-cache-gb needs --planes FILE (the cache holds the plane file's slots)");
    if (o.route_zipf > 0 && !(o.expert_cache_gb > 0))
        return moet_usage_error("bench", bench_usage, "--route-zipf shapes what the expert cache sees: it needs --expert-cache-gb");
    MOET_ASSERT(engine_kv_dtype(o.kv_dtype_name, &o.kv_dtype) == 0, "kv dtype %s", o.kv_dtype_name);
    MOET_ASSERT(engine_act_dtype(o.act_dtype_name, &o.act_bf16) == 0, "act dtype %s", o.act_dtype_name);
    // progress on stderr; every slot held, or a pool of --expert-cache-gb (the CPU reference)
    o.popt = (pf_serve_opts){o.no_verify, 0, 0, 1, o.expert_cache_gb, o.prefetch ? strcmp(o.prefetch, "off") != 0 : -1, o.io_depth, o.route_zipf};
    if (o.depth < 0) o.depth = o.prompt;
    if (o.temperature < SAMP_GREEDY_BELOW) o.temperature = 0;   // (a request's rule)
    o.spec_auto = o.spec_name && !strcmp(o.spec_name, "auto");
    o.spec = o.spec_auto ? SPEC_AUTO_MAX : o.spec_name ? atoi(o.spec_name) : 0;
    _Static_assert(SPEC_AUTO_MAX <= MOET_MAX_SPEC, "bench: auto's drafts fit a row's");
    // auto: the controller's first probes of every k (SPEC_PROBES runs of SPEC_RUN steps each), untimed
    const int probe_steps = o.spec_auto ? SPEC_PROBES * (SPEC_AUTO_MAX + 1) * SPEC_RUN : 0;
    if (o.depth < o.prompt) { fprintf(stderr, "moet bench: --depth %d is shorter than --prompt %d\n", o.depth, o.prompt); return 2; }
    int maxB = 0;
    for (int i = 0; i < o.batch.n; i++) if (o.batch.v[i] > maxB) maxB = o.batch.v[i];
    moet_err e = {{0}};
    ck_model m;
    if (ck_open(&m, o.model, &e)) { fprintf(stderr, "moet bench: %s\n", e.msg); return 1; }
    const ck_config *c = &m.cfg;
    if (o.top_k > c->vocab) o.top_k = 0;   // above the vocabulary: every token (a request's rule; the sampler's k ≤ V)
    // a decode step emits up to spec + 1 tokens a sequence
    int max_len = o.depth + (o.gen + probe_steps + (o.profile ? 4 : 0)) * (o.spec + 1) + 1, rc = 1, Tm = o.max_batch_tokens < maxB ? maxB : o.max_batch_tokens;
    static engine_any E;
    double copy_gbs = 0;
    if ((o.mtp && ck_mtp_open(&m, o.mtp, &e)) || (o.spec && ck_mtp_need(&m, &e))) {
        fprintf(stderr, "moet bench: %s\n", e.msg);
        ck_close(&m);
        return 1;
    }
    engine_opts eo = {maxB, max_len, Tm, o.threads ? o.threads : pf_ncpu(), o.kv_dtype, o.planes, o.popt, o.host_margin_gb,
                      o.graphs && !strcmp(o.graphs, "off"), !o.spec, o.act_bf16};
    if (engine_open(&E, o.backend, &m, &eo, "moet bench", &e)) { fprintf(stderr, "moet bench: %s\n", e.msg); goto out0; }
    engine_backend *be = &E.be;
    int use_gpu = E.is_gpu;
    if (o.spec_auto && be->max_spec > 0 && o.spec > be->max_spec) o.spec = be->max_spec;   // auto: up to what the backend drafts
    if (o.spec > be->max_spec) {
        fprintf(stderr, "moet bench: --speculative-tokens %s: the %s backend %s\n", o.spec_name, use_gpu ? "GPU" : "CPU",
                be->max_spec ? "drafts fewer tokens per step" : "does not draft (yet)");
        goto out;
    }
    if (o.route_zipf > 0 && !use_gpu) {   // (the CPU reference's cache follows its router only)
        fprintf(stderr, "moet bench: --route-zipf is the GPU expert cache's; this run is on the CPU reference\n");
        rc = 2;
        goto out;
    }
    if (o.profile && !use_gpu) {   // nothing to time kernel by kernel: say so rather than print nothing
        fprintf(stderr, "moet bench: --profile times the GPU's kernels; this run is on the CPU reference\n");
        rc = 2;
        goto out;
    }
    gpu_engine *gp = use_gpu ? &E.g.g : NULL;
    if (use_gpu) copy_gbs = bench_copy_gbs(gp);
    int32_t *ids = arena_sys_alloc(sizeof(int32_t) * (size_t)Tm, "bench ids");
    int *slots = arena_sys_alloc(sizeof(int) * (size_t)maxB, "bench slots"), *off = arena_sys_alloc(sizeof(int) * (size_t)(maxB + 1), "bench offsets");
    uint8_t *want = arena_sys_alloc((size_t)maxB, "bench wants");
    double *step_t = arena_sys_alloc(sizeof(double) * (size_t)o.gen, "bench step times");   // [gen] seconds of each timed step
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    // the result line, written to stdout whole at the end (never a partial line on a failure)
    static char line[8192 + 8 * MOET_MAX_PATH];   // 16 results + the model path escaped (≤ 6 bytes a byte)
    js_writer w;
    js_w_init(&w, line, sizeof line);
    js_w_obj(&w);
    js_w_key(&w, "object"), js_w_str(&w, "bench");
    js_w_key(&w, "backend"), js_w_str(&w, use_gpu ? "gpu" : "cpu");
    js_w_key(&w, "device"), js_w_str(&w, use_gpu ? gp->dev.name : "cpu");
    char model_name[MOET_MAX_PATH];
    ck_model_name(o.model, model_name, sizeof model_name);   // as serve and eval name it
    js_w_key(&w, "model"), js_w_str(&w, model_name);
    js_w_key(&w, "experts"), js_w_str(&w, o.planes ? "planes" : m.expert_format);
    js_w_key(&w, "kv_dtype"), js_w_str(&w, gpu_kv_names[o.kv_dtype]);
    js_w_key(&w, "act_dtype"), js_w_str(&w, engine_act_bf16(&E) ? "bf16" : "f32");
    js_w_key(&w, "temperature"), js_w_num(&w, o.temperature);   // the decode picks' sampling (0: greedy)
    js_w_key(&w, "top_k"), js_w_int(&w, o.top_k);
    js_w_key(&w, "top_p"), js_w_num(&w, o.top_p);
    if (use_gpu) js_w_key(&w, "copy_gbs"), js_w_num(&w, round(copy_gbs * 10) / 10);   // the byte model is the GPU's
    js_w_key(&w, "results"), js_w_arr(&w);
    for (int bi = 0; bi < o.batch.n; bi++) {
        int B = o.batch.v[bi];
        for (int s = 0; s < B; s++) {
            engine_admit ad = {{(float)o.temperature, o.top_k, (float)o.top_p, 0, 0, 0, 1}, (uint64_t)s, 0, 0, NULL, 0, max_len, o.spec};
            int ar = be->admit(be->self, s, &ad, &e);
            if (ar) {
                fprintf(stderr, "moet bench: %s\n", ar > 0 ? "the KV cache has no room for every sequence" : e.msg);
                goto out;
            }
        }
        // prefill: every sequence's prompt, as many whole sequences' chunks per step as fit
        int *fed = arena_sys_alloc(sizeof(int) * (size_t)B, "bench progress");
        int32_t *last = arena_sys_alloc(sizeof(int32_t) * (size_t)B, "bench last tokens");   // each sequence's last pick
        double t0 = moet_now();
        int psteps = 0;
        if (use_gpu && o.profile) gpu_prof_start(&gp->k);   // the prompt's steps, each kernel timed
        // the prompt (timed); the fill to --depth comes before the decode's first step (below)
        if (bench_feed(be, B, fed, o.prompt, Tm, c->vocab, &rng, ids, slots, off, want, last, use_gpu ? gp : NULL, &psteps, &e)) {
            fprintf(stderr, "moet bench: %s\n", e.msg);
            goto out;
        }
        t0 = moet_now() - t0;
        if (use_gpu && gp->k.prof) {
            gp->k.prof = 0;
            char what[64];
            snprintf(what, sizeof what, "batch-%d prefill (%d-token prompts)", B, o.prompt);
            gpu_prof_print(&gp->k, stderr, what, psteps);
        }
        double prefill_s = t0;
        // decode: each sequence's last token a step (and its drafts: 1 .. spec + 1 tokens out)
        double t1 = 0, ts = 0, launch_s = 0;
        int n_st = 0;
        uint64_t emitted = 0, drafted = 0, accepted = 0;   // over the timed steps
        pf_cache_counters xc0 = pf_cache_stats;   // the expert cache's counters at the timed steps' start
        static spec_ctrl ctl;   // --speculative-tokens auto: this batch's controller
        spec_ctrl_init(&ctl, o.spec_auto ? o.spec : 0);
        int d_lo = 0, d_hi = 0;   // each sequence's context before the warm-up steps: the smallest, the largest
        for (int step = -probe_steps; step < o.gen + 2; step++) {
            if (step == 0) {   // untimed: every sequence filled to --depth, after auto's probes (their tokens come first)
                if (bench_feed(be, B, fed, o.depth, Tm, c->vocab, &rng, ids, slots, off, want, last, NULL, NULL, &e)) {
                    fprintf(stderr, "moet bench: %s\n", e.msg);
                    goto out;
                }
            }
            if (step == 0) {   // where the warm-up steps start
                d_lo = d_hi = fed[0];
                for (int s = 1; s < B; s++) d_lo = fed[s] < d_lo ? fed[s] : d_lo, d_hi = fed[s] > d_hi ? fed[s] : d_hi;
            }
            if (step == 2) t1 = moet_now(), xc0 = pf_cache_stats;   // two warm-up steps
            if (step > 2) step_t[n_st++] = moet_now() - ts;   // the step before this one, with its sampling
            ts = moet_now();
            for (int s = 0; s < B; s++) {
                slots[s] = s;
                off[s] = s;
                want[s] = 1;
                ids[s] = last[s];
            }
            off[B] = B;
            if (step >= o.gen) break;
            int k = -1;
            if (o.spec_auto) {   // as the server: one choice for the step's rows
                k = spec_ctrl_pick(&ctl, B);
                for (int s = 0; s < B; s++) be->set_spec(be->self, s, k);
            }
            engine_result res;
            double tk = moet_now();
            if (bench_step(be, B, slots, ids, off, want, step >= 2 ? &launch_s : NULL, &res, &e)) {
                fprintf(stderr, "moet bench: %s\n", e.msg);
                goto out;
            }
            tk = moet_now() - tk;
            int out_n = 0;
            for (int i = 0; i < B; i++) {
                int nt = res.n_tok ? res.n_tok[i] : 1;
                out_n += nt;
                fed[i] += nt;   // (its last token and the accepted drafts: the picks but the last)
                last[i] = bench_last(&res, i);
                if (step >= 2) emitted += (uint64_t)nt, drafted += (uint64_t)(res.n_tok ? res.drafted[i] : 0), accepted += (uint64_t)nt - 1;
            }
            if (k >= 0) spec_ctrl_note(&ctl, B, k, out_n, tk);
        }
        int timed = o.gen - 2 > 0 ? o.gen - 2 : 1;
        double dec_s = moet_now() - t1;
        bench_cache xc = bench_cache_over(&xc0, dec_s, timed);
        // time per output token over the timed steps: median and 99th percentile (nearest rank)
        qsort(step_t, (size_t)n_st, sizeof(double), bench_cmp_double);
        double p50 = n_st ? step_t[(n_st - 1) / 2] : dec_s, p99 = n_st ? step_t[(int)ceil(0.99 * n_st) - 1] : dec_s;
        if (use_gpu && o.profile) {   // a few more decode steps, each kernel timed
            gpu_prof_start(&gp->k);
            int steps = 4;
            for (int step = 0; step < steps; step++) {
                if (bench_step(be, B, slots, ids, off, want, NULL, NULL, &e)) { fprintf(stderr, "moet bench: %s\n", e.msg); goto out; }
                gpu_prof_collect(&gp->k);
            }
            gp->k.prof = 0;
            char what[64];
            snprintf(what, sizeof what, "batch-%d decode", B);
            gpu_prof_print(&gp->k, stderr, what, steps);
            // the same step as a graph replay, then without each kernel's nodes in turn: what each
            // costs inside the graph, where launches overlap
            double g_ms[K_COUNT];
            int g_nodes[K_COUNT];
            const double whole = gpu_graph_costs(gp, B, 20, g_ms, g_nodes);
            if (whole > 0) {
                fprintf(stderr, "moet bench: the batch-%d decode graph: %.3f ms a replay; without each kernel's nodes (disabled in turn, 20 replays each):\n",
                        B, whole);
                for (int i = 0; i < K_COUNT; i++)
                    if (g_nodes[i])
                        fprintf(stderr, "moet bench:   %-18s %6d nodes  without them %7.3f ms  (they cost %7.3f ms, %5.1f%%)\n", gpu_kernel_names[i],
                                g_nodes[i], g_ms[i], whole - g_ms[i], 100 * (whole - g_ms[i]) / whole);
                fprintf(stderr, "moet bench:   (a kernel whose outputs choose later work — the router, the norms and conv before it — changes that\n"
                                "moet bench:    work when disabled: its number there is not its cost alone)\n");
            } else
                fprintf(stderr, "moet bench: batch %d decodes without a graph (the expert cache, or more rows than the graphs hold): no in-graph costs\n", B);
        }
        // bytes one decode step reads: dense weights + the experts B tokens touch (uniform routing:
        // E·(1 − (1 − K/E)^B) distinct experts per layer) + GDN state read and written + KV read
        double touched = c->n_experts * (1.0 - pow(1.0 - (double)c->topk / c->n_experts, B));
        double expert_b = use_gpu ? gp->expert_bytes * touched * c->n_layers : 0;
        double state_b = use_gpu ? 2.0 * sizeof(float) * gp->ssm_slot * B : 0;
        double kv_b = use_gpu ? (double)B * ((d_lo + d_hi) / 2.0 + o.gen / 2) * 2 * gpu_kv_page_bytes(c, o.kv_dtype) / GPU_KV_PAGE : 0;
        double dense_b = use_gpu ? gp->dense_bytes : 0;
        double step_b = dense_b + expert_b + state_b + kv_b;
        double step_s = dec_s / timed, toks = emitted ? (double)emitted : (double)B * timed;   // tokens out of the timed steps
        js_w_obj(&w);
        js_w_key(&w, "batch"), js_w_int(&w, B);
        js_w_key(&w, "prompt"), js_w_int(&w, o.prompt);
        js_w_key(&w, "depth"), js_w_int(&w, d_lo);   // (--depth, or past it where auto's probes took the sequences further)
        js_w_key(&w, "depth_max"), js_w_int(&w, d_hi);
        js_w_key(&w, "prefill_tok_s"), js_w_num(&w, round((double)B * o.prompt / prefill_s * 10) / 10);
        js_w_key(&w, "decode_tok_s"), js_w_num(&w, round(toks / dec_s * 10) / 10);
        js_w_key(&w, "step_ms"), js_w_num(&w, round(step_s * 1e6) / 1e3);
        js_w_key(&w, "step_ms_p50"), js_w_num(&w, round(p50 * 1e6) / 1e3);
        js_w_key(&w, "step_ms_p99"), js_w_num(&w, round(p99 * 1e6) / 1e3);
        js_w_key(&w, "launch_ms"), js_w_num(&w, round(launch_s / timed * 1e6) / 1e3);   // the host's queueing per step
        if (use_gpu) {
            // what the same bytes would give at the copy bandwidth measured in this run
            js_w_key(&w, "roofline_tok_s"), js_w_num(&w, round(B / (step_b / (copy_gbs * 1e9)) * 10) / 10);
            js_w_key(&w, "bytes_per_step"), js_w_num(&w, round(step_b));
            js_w_key(&w, "bytes_per_token"), js_w_num(&w, round(step_b / B));
            js_w_key(&w, "achieved_gbs"), js_w_num(&w, round(step_b / step_s / 1e8) / 10);
        }
        if (xc.on) bench_cache_json(&w, &xc);
        if (o.spec) {   // the drafts of the timed steps: verified, accepted, and tokens a sequence per step
            js_w_key(&w, "speculation"), js_w_obj(&w);
            if (o.spec_auto) {   // the controller's choice and what it measured for each k (null: not measured)
                const int bk = spec_bucket(B);
                js_w_key(&w, "draft_tokens"), js_w_str(&w, "auto");
                js_w_key(&w, "auto_choice"), js_w_int(&w, spec_ctrl_best(&ctl, bk));
                js_w_key(&w, "auto_tok_s"), js_w_arr(&w);
                for (int k = 0; k <= ctl.kmax; k++)
                    if (ctl.obs[bk][k]) js_w_num(&w, round(ctl.tps[bk][k] * 10) / 10);
                    else js_w_null(&w);
                js_w_end_arr(&w);
            } else
                js_w_key(&w, "draft_tokens"), js_w_int(&w, o.spec);
            js_w_key(&w, "drafted"), js_w_num(&w, (double)drafted);
            js_w_key(&w, "accepted"), js_w_num(&w, (double)accepted);
            js_w_key(&w, "tokens_per_step"), js_w_num(&w, round(toks / ((double)B * timed) * 1000) / 1000);
            js_w_end_obj(&w);
        }
        js_w_end_obj(&w);
        char dep[32];
        snprintf(dep, sizeof dep, d_hi > d_lo ? "%d–%d" : "%d", d_lo, d_hi);
        fprintf(stderr, "moet bench: batch %d: prefill %.0f tok/s (%d × %d tokens), decode %.1f tok/s at depth %s (%.2f ms/step, "
                        "p50 %.2f, p99 %.2f; the host queues a step in %.2f ms)", B, (double)B * o.prompt / prefill_s, B, o.prompt, toks / dec_s, dep, step_s * 1e3,
                p50 * 1e3, p99 * 1e3, launch_s / timed * 1e3);
        if (use_gpu)
            fprintf(stderr, ", %.0f MB/step, %.0f GB/s of %.0f copy (roofline %.0f tok/s)", step_b / 1e6, step_b / step_s / 1e9, copy_gbs,
                    B / (step_b / (copy_gbs * 1e9)));
        if (xc.on)
            fprintf(stderr, "; expert cache %" PRIu64 " of %" PRIu64 " slots: %" PRIu64 " hits, %" PRIu64 " misses (%.1f %% hits), %.1f MB read "
                            "(%.2f GB/s), %.2f ms/step waiting on reads",
                    xc.pool, xc.file, xc.hits, xc.misses, 100.0 * xc.hits / (xc.hits + xc.misses > 0 ? (double)(xc.hits + xc.misses) : 1.0),
                    xc.bytes / 1e6, xc.read_gbs, xc.wait_ms);
        if (xc.on && (xc.prefetched || xc.prefetch_dropped))
            fprintf(stderr, ", %" PRIu64 " read ahead (%" PRIu64 " then chosen), %" PRIu64 " dropped unread", xc.prefetched, xc.prefetch_used,
                    xc.prefetch_dropped);
        if (o.spec && o.spec_auto) {
            const int bk = spec_bucket(B);
            fprintf(stderr, "; auto drafts: %d chosen (tok/s measured for 0..%d drafts:", spec_ctrl_best(&ctl, bk), ctl.kmax);
            for (int k = 0; k <= ctl.kmax; k++) fprintf(stderr, ctl.obs[bk][k] ? " %.1f" : " -", ctl.tps[bk][k]);
            fprintf(stderr, ")");
        }
        if (o.spec)
            fprintf(stderr, "; %s drafts a step: %" PRIu64 " verified, %" PRIu64 " accepted (%.1f %%), %.3f tokens a sequence per step",
                    o.spec_name, drafted, accepted, drafted ? 100.0 * accepted / drafted : 0.0, toks / ((double)B * timed));
        fputc('\n', stderr);
        for (int s = 0; s < B; s++) be->release(be->self, s);
        arena_sys_free(fed, sizeof(int) * (size_t)B);
        arena_sys_free(last, sizeof(int32_t) * (size_t)B);
    }
    js_w_end_arr(&w);
    js_w_end_obj(&w);
    MOET_ASSERT(!w.overflow, "bench result line");
    so_puts(line);
    so_puts("\n");
    rc = 0;
out:
    engine_close(&E);
out0:
    ck_close(&m);
    return rc;
}
