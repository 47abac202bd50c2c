// gpu/pool.c — the resident expert pool: every slot of the plane file on the device, one slot
// per (layer, expert), addressed through each layer's expert table (gate, up, down descriptors
// pointing into the slot, format/PLANES.md §1: w13 rows 0..I−1 are gate_proj, I..2I−1 up_proj).
//
// Boot load: reader threads claim runs of consecutive slots, read each run with one O_DIRECT
// pread into their own pinned buffer, hash every slot against its table entry (SHA-256) and
// check its padding, then copy the run to the pool on their own copy stream while they read
// and hash the next run into their second buffer (an event per buffer protects it from reuse
// until its copy is done). The first bad slot is named and nothing is served.

#define GPU_POOL_RUN_BYTES (8u << 20)   // bytes per read: large enough for full disk speed

typedef struct {
    const gpu_device *dev;
    CUdeviceptr pool;                // the pool's device memory: slot i at pool + i · slot_stride
    pf_file *f;
    uint32_t run;                    // slots per read
    _Atomic uint64_t *next, *done;   // next run, slots done
    _Atomic int *failed;
    int verify;                      // hash and check padding (not with --no-verify)
    uint8_t *buf[2];                 // pinned [run · slot_stride] each
    pf_sha sha;
    moet_err err;
    int bad;
} gpu_pool_reader;

static void *gpu_pool_read(void *arg) {
    gpu_pool_reader *w = arg;
    pf_file *f = w->f;
    const pf_layout *L = &f->h.L;
    gpu_bind(w->dev);
    CUstream s;
    CUevent ev[2];
    int used[2] = {0, 0}, cur = 0;
    CU_CHECK(cu.cuStreamCreate(&s, GPU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 2; i++) CU_CHECK(cu.cuEventCreate(&ev[i], 2 /* CU_EVENT_DISABLE_TIMING */));
    uint64_t n_runs = (L->n_slots + w->run - 1) / w->run;
    while (!atomic_load(w->failed)) {
        uint64_t r = atomic_fetch_add(w->next, 1);
        if (r >= n_runs) break;
        uint64_t first = r * w->run, count = L->n_slots - first < w->run ? L->n_slots - first : w->run;
        size_t bytes = (size_t)(count * L->slot_stride);
        if (used[cur]) CU_CHECK(cu.cuEventSynchronize(ev[cur]));   // the copy out of this buffer is done
        int fd = f->fd_direct >= 0 ? f->fd_direct : f->fd;
        uint64_t off = pf_slot_offset(L, first);
        if (pf_pread_full(fd, w->buf[cur], bytes, off)) {
            err_set(&w->err, "%s: slots %" PRIu64 "..%" PRIu64 " at offset %" PRIu64 ": read failed: %s", f->path, first,
                    first + count - 1, off, errno ? strerror(errno) : "unexpected end of file");
            w->bad = 1;
            atomic_store(w->failed, 1);
            break;
        }
        for (uint64_t k = 0; k < count && w->verify && !w->bad; k++) {
            uint64_t i = first + k;
            const uint8_t *p = w->buf[cur] + k * L->slot_stride;
            uint8_t sum[32];
            pf_sha256(&w->sha, p, L->slot_bytes, sum);
            uint32_t layer = L->g.first_layer + (uint32_t)(i / L->g.n_experts), x = (uint32_t)(i % L->g.n_experts);
            if (memcmp(sum, f->table[i].sha256, 32)) {
                char a[65], b[65];
                pf_hex(f->table[i].sha256, 32, a);
                pf_hex(sum, 32, b);
                err_set(&w->err, "%s: slot (layer %u, expert %u): SHA-256 mismatch: the table says %s, the slot hashes to %s", f->path,
                        layer, x, a, b);
                w->bad = 1;
            }
            for (uint64_t q = L->slot_bytes; q < L->slot_stride && !w->bad; q++)
                if (p[q]) {
                    err_set(&w->err, "%s: slot (layer %u, expert %u): padding byte at slot offset %" PRIu64 " is not zero", f->path,
                            layer, x, q);
                    w->bad = 1;
                }
        }
        if (w->bad) {
            atomic_store(w->failed, 1);
            break;
        }
        CU_CHECK(cu.cuMemcpyHtoDAsync(w->pool + first * L->slot_stride, w->buf[cur], bytes, s));
        CU_CHECK(cu.cuEventRecord(ev[cur], s));
        used[cur] = 1;
        cur ^= 1;
        atomic_fetch_add(w->done, count);
    }
    CU_CHECK(cu.cuStreamSynchronize(s));
    for (int i = 0; i < 2; i++) CU_CHECK(cu.cuEventDestroy(ev[i]));
    CU_CHECK(cu.cuStreamDestroy(s));
    return NULL;
}

// Loads and checks every slot of the plane file `path` (for model m) into the device memory at
// `pool` (n_slots · slot_stride bytes), then writes each layer's expert table: tables[l] is the
// device address of layer l's [E, 3] gpu_mat descriptors (gate, up, down) over its slots.
static int gpu_pool_load(const gpu_device *dev, CUdeviceptr pool, const CUdeviceptr *tables /* [L] */, const ck_model *m,
                         const char *path, const pf_serve_opts *po, moet_err *e) {
    const ck_config *c = &m->cfg;
    pf_file f;
    pf_serve_opts oo = *po;
    oo.no_verify = 1;   // hashed below as the slots arrive: one pass over the file
    if (pf_open_for_model(&f, path, c, m->dir, &oo, e)) return -1;
    const pf_layout *L = &f.h.L;
    int T = po->threads > 0 ? po->threads : 8;   // readers: enough requests in flight for NVMe, hashing spread
    if (T > MOET_PF_MAX_THREADS) T = MOET_PF_MAX_THREADS;
    uint32_t run = (uint32_t)(GPU_POOL_RUN_BYTES / L->slot_stride);
    if (run < 1) run = 1;
    if ((uint64_t)T * run > L->n_slots) {   // small files: spread the slots over the threads
        run = (uint32_t)((L->n_slots + (uint64_t)T - 1) / (uint64_t)T);
        if ((uint64_t)T > L->n_slots) T = (int)L->n_slots;
    }
    arena staging;
    int rc = -1, started = 0;
    static gpu_pool_reader w[MOET_PF_MAX_THREADS];
    pthread_t tid[MOET_PF_MAX_THREADS];
    _Atomic uint64_t next = 0, done = 0;
    _Atomic int failed = 0;
    for (int t = 0; t < T; t++) {
        memset(&w[t], 0, sizeof w[t]);
        w[t] = (gpu_pool_reader){dev, pool, &f, run, &next, &done, &failed, !po->no_verify, {0}, {0}, {{0}}, 0};
    }
    arena_plan sp = arena_plan_begin(&staging, "plane staging", ARENA_PINNED, e);   // two buffers of `run` slots per reader
    while (arena_plan_pass(&sp))
        for (int t = 0; t < T; t++)
            for (int b = 0; b < 2; b++) w[t].buf[b] = arena_take(sp.on, (size_t)run * L->slot_stride, PF_PAGE, "plane staging");
    if (sp.failed) goto out0;
    for (int t = 0; t < T; t++)
        if (pf_sha_init(&w[t].sha, e)) goto join;
    pf_progress pr;
    pf_progress_start(&pr, po->no_verify ? "loading experts into the GPU pool" : "loading + verifying experts into the GPU pool");
    for (; started < T; started++)
        if (pthread_create(&tid[started], NULL, gpu_pool_read, &w[started])) {
            err_set(e, "cannot start plane reader thread %d", started);
            atomic_store(&failed, 1);
            goto join;
        }
    for (;;) {
        uint64_t d = atomic_load(&done);
        int busy = d < L->n_slots && !atomic_load(&failed);
        char rate[48];
        double dt = moet_now() - pr.t0;
        snprintf(rate, sizeof rate, "%.2f GB/s", dt > 0 ? (double)d * L->slot_stride / dt / 1e9 : 0.0);
        if (po->progress) pf_progress_show(&pr, d, L->n_slots, rate, !busy);
        if (!busy) break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    rc = 0;
join:
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    for (int t = 0; t < T; t++) {
        if (rc == 0 && w[t].bad) {
            *e = w[t].err;
            rc = -1;
        }
        pf_sha_free(&w[t].sha);
    }
    if (rc == 0 && atomic_load(&done) != L->n_slots)
        rc = err_set(e, "%s: %" PRIu64 " of %" PRIu64 " slots loaded", path, (uint64_t)atomic_load(&done), L->n_slots);
    if (rc == 0) {
        double dt = moet_now() - pr.t0;
        fprintf(stderr, "moet: expert pool: %" PRIu64 " slots, %.2f GiB in %.1f s (%.2f GB/s%s)\n", L->n_slots,
                (double)L->n_slots * L->slot_stride / 1073741824.0, dt, (double)L->n_slots * L->slot_stride / 1e9 / (dt + 1e-9), po->no_verify ? ", not verified" : ", SHA-256 checked");
        // each layer's expert table: gate / up / down descriptors over its slots, laid out as the
        // CPU reference reads them (pf_expert_mats over the slot's device address)
        for (uint32_t l = 0; l < L->g.n_layers; l++) {
            gpu_mat *tab = arena_sys_alloc(sizeof(gpu_mat) * 3 * L->g.n_experts, "expert table");
            MOET_ASSERT(tab, "expert table");
            for (uint32_t x = 0; x < L->g.n_experts; x++) {
                uint64_t base = pool + ((uint64_t)l * L->g.n_experts + x) * L->slot_stride;
                ck_mat m3[3];
                pf_expert_mats(L, (const uint8_t *)(uintptr_t)base, &m3[0], &m3[1], &m3[2]);
                for (int j = 0; j < 3; j++) tab[3 * x + j] = gpu_mat_desc(&m3[j], (uintptr_t)m3[j].w, (uintptr_t)m3[j].scale);
            }
            CU_CHECK(cu.cuMemcpyHtoD(tables[L->g.first_layer + l], tab, sizeof(gpu_mat) * 3 * L->g.n_experts));
            arena_sys_free(tab, sizeof(gpu_mat) * 3 * L->g.n_experts);
        }
    }
    arena_release(&staging);
out0:
    pf_close(&f);
    return rc;
}
