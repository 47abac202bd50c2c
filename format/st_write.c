// format/st_write.c — a streaming safetensors writer, for files too large to hold in memory.
//
// The caller declares every tensor (name, dtype, shape) up front; stw_begin writes the header
// (JSON through js_writer, offsets tiling the data buffer in the declared order, padded with
// spaces to a multiple of 8 as the reference writer does), then the data is appended in that
// order with stw_write, through a large buffer, and stw_end checks that exactly the declared
// bytes arrived. The file is written through format/outfile.c: the path must be absent or a
// regular file, it is replaced only by a complete file, and the temporary file never outlives
// an error or a fatal signal. st_save writes tensors that are already in memory with it.

typedef struct {
    const char *name;
    int dtype;                       // ST_*
    int ndim;
    int64_t shape[MOET_MAX_DIMS];
} stw_tensor;

#define STW_BUF_BYTES (8u << 20)    // write() size: large sequential writes

typedef struct {
    of_file of;                      // the temporary file being written (of.fd)
    char path[MOET_MAX_PATH];
    uint64_t data_bytes;             // declared size of the data buffer
    uint64_t written;                // data bytes accepted so far
    uint8_t *buf;                    // [STW_BUF_BYTES]
    size_t used;
} stw_file;

static uint64_t stw_bytes(const stw_tensor *t) {
    uint64_t n = (uint64_t)st_dtypes[t->dtype].bytes;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

static int stw_flush(stw_file *f, moet_err *e) {
    size_t off = 0;
    while (off < f->used) {
        ssize_t r = write(f->of.fd, f->buf + off, f->used - off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return err_set(e, "%s: write failed: %s", f->path, r < 0 ? strerror(errno) : "no progress");
        off += (size_t)r;
    }
    f->used = 0;
    return 0;
}

static void stw_free(stw_file *f) {
    if (f->buf) arena_sys_free(f->buf, STW_BUF_BYTES);
    f->buf = NULL;
}

// Gives up: the temporary file is removed, path is left as it was. Safe to call twice.
static void stw_abort(stw_file *f) {
    of_abort(&f->of);
    stw_free(f);
}

// Starts path (through its temporary file) and writes the header of n tensors (data in the
// given order). With `begun`, the output file was begun already (of_begin: a command that makes
// its output before the work) and is taken over; path is its path.
static int stw_begin_on(stw_file *f, of_file *begun, const char *path, const stw_tensor *t, uint32_t n, moet_err *e) {
    memset(f, 0, sizeof *f);
    f->of.fd = -1;
    if (begun) {
        f->of = *begun;   // the writer owns it now: committed or removed by stw_end / stw_abort
        begun->fd = -1;
    }
    if (strlen(path) >= sizeof f->path) { stw_abort(f); return err_set(e, "%s: path too long", path); }
    snprintf(f->path, sizeof f->path, "%s", path);
    size_t cap = 256;
    for (uint32_t i = 0; i < n; i++) cap += strlen(t[i].name) * 6 + 96 + 24 * (size_t)t[i].ndim;
    char *hdr = arena_sys_alloc(cap + 8, "safetensors header");
    if (!hdr) { stw_abort(f); return err_set(e, "%s: out of memory for a %zu-byte header", path, cap); }
    js_writer w;
    js_w_init(&w, hdr + 8, cap);
    js_w_obj(&w);
    js_w_key(&w, "__metadata__");
    js_w_obj(&w);
    js_w_key(&w, "format");
    js_w_str(&w, "pt");
    js_w_end_obj(&w);
    uint64_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t b = stw_bytes(&t[i]);
        js_w_key(&w, t[i].name);
        js_w_obj(&w);
        js_w_key(&w, "dtype");
        js_w_str(&w, st_dtypes[t[i].dtype].name);
        js_w_key(&w, "shape");
        js_w_arr(&w);
        for (int d = 0; d < t[i].ndim; d++) js_w_int(&w, t[i].shape[d]);
        js_w_end_arr(&w);
        js_w_key(&w, "data_offsets");
        js_w_arr(&w);
        js_w_int(&w, (int64_t)at);
        js_w_int(&w, (int64_t)(at + b));
        js_w_end_arr(&w);
        js_w_end_obj(&w);
        at += b;
    }
    js_w_end_obj(&w);
    MOET_ASSERT(!w.overflow, "safetensors header exceeds its planned %zu bytes", cap);
    size_t len = w.len;
    while (len % 8) hdr[8 + len++] = ' ';   // the reference writer aligns the data buffer to 8
    for (int i = 0; i < 8; i++) hdr[i] = (char)((uint64_t)len >> (8 * i));
    f->data_bytes = at;
    f->buf = arena_sys_alloc(STW_BUF_BYTES, "safetensors write buffer");
    int rc = 0;
    if (!f->buf) rc = err_set(e, "%s: out of memory for the write buffer", path);
    else if (f->of.fd < 0 && of_begin(&f->of, path, e)) rc = -1;
    else rc = of_write(&f->of, hdr, len + 8, e);
    arena_sys_free(hdr, cap + 8);
    if (rc) stw_abort(f);
    return rc;
}

static int stw_begin(stw_file *f, const char *path, const stw_tensor *t, uint32_t n, moet_err *e) {
    return stw_begin_on(f, NULL, path, t, n, e);
}

// Appends n data bytes (the declared tensors, in order, back to back).
static int stw_write(stw_file *f, const void *p, size_t n, moet_err *e) {
    if (n > f->data_bytes - f->written)
        return err_set(e, "%s: %zu more bytes than the %" PRIu64 " declared", f->path, n - (size_t)(f->data_bytes - f->written),
                       f->data_bytes);
    const uint8_t *s = p;
    f->written += n;
    while (n) {
        size_t k = STW_BUF_BYTES - f->used < n ? STW_BUF_BYTES - f->used : n;
        memcpy(f->buf + f->used, s, k);
        f->used += k;
        s += k;
        n -= k;
        if (f->used == STW_BUF_BYTES && stw_flush(f, e)) return -1;
    }
    return 0;
}

// A pointer to the next `n` bytes of the buffer to fill in place (n ≤ STW_BUF_BYTES), saving a
// copy for generated data; stw_commit(n) accepts them.
static uint8_t *stw_reserve(stw_file *f, size_t n, moet_err *e) {
    MOET_ASSERT(n <= STW_BUF_BYTES, "reserve of %zu bytes", n);
    if (STW_BUF_BYTES - f->used < n && stw_flush(f, e)) return NULL;
    return f->buf + f->used;
}

static int stw_commit(stw_file *f, size_t n, moet_err *e) {
    if (n > f->data_bytes - f->written) return err_set(e, "%s: more bytes than declared", f->path);
    f->used += n;
    f->written += n;
    return 0;
}

// Flushes and puts the file in place; the data must be exactly the declared size. On failure
// the temporary file is removed and path is left as it was.
static int stw_end(stw_file *f, moet_err *e) {
    int rc = 0;
    if (f->written != f->data_bytes)
        rc = err_set(e, "%s: %" PRIu64 " data bytes written, %" PRIu64 " declared", f->path, f->written, f->data_bytes);
    if (!rc) rc = stw_flush(f, e);
    if (!rc) rc = of_commit(&f->of, e);
    stw_abort(f);   // after a commit only the buffer is left to free
    return rc;
}

// ---- tensors already in memory -----------------------------------------------------------

typedef struct {
    const char *name;
    int dtype;                    // ST_*
    int ndim;
    int64_t shape[MOET_MAX_DIMS];
    const void *data;             // numel × dtype size bytes, little-endian
} st_out;

// Writes the tensors as one safetensors file into the output file `begun` (of_begin'ed; NULL:
// begun here at `path`), through a temporary file renamed into place, so `path` is never
// half-written (and must be absent or a regular file).
static int st_save_on(of_file *begun, const char *path, const st_out *t, int n, moet_err *e) {
    stw_tensor decl[MOET_ST_SAVE_MAX];
    if (n < 0 || n > MOET_ST_SAVE_MAX) {
        if (begun) of_abort(begun);
        return err_set(e, "%s: %d tensors, at most %d can be saved at once", path, n, MOET_ST_SAVE_MAX);
    }
    for (int i = 0; i < n; i++) {
        decl[i].name = t[i].name;
        decl[i].dtype = t[i].dtype;
        decl[i].ndim = t[i].ndim;
        memcpy(decl[i].shape, t[i].shape, sizeof decl[i].shape);
    }
    stw_file f;
    if (stw_begin_on(&f, begun, path, decl, (uint32_t)n, e)) return -1;
    for (int i = 0; i < n; i++)
        if (stw_write(&f, t[i].data, (size_t)stw_bytes(&decl[i]), e)) {
            stw_abort(&f);
            return -1;
        }
    return stw_end(&f, e);
}

static int st_save(const char *path, const st_out *t, int n, moet_err *e) { return st_save_on(NULL, path, t, n, e); }
static int st_save_into(of_file *begun, const st_out *t, int n, moet_err *e) { return st_save_on(begun, begun->path, t, n, e); }
