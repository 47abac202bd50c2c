// format/safetensors.c — every shard of a checkpoint, mapped and validated.
//
// A checkpoint directory holds one or more *.safetensors files, resolved through
// model.safetensors.index.json when it exists, else by scanning the directory. Each file is
// mmap'ed read-only; tensors point into the mapping (nothing is copied).
//
// A shard is: u64 LE header length N | N bytes of JSON header | data buffer. Validation (as the
// reference loader, CHECKPOINT.md §B): N ≤ 100 MB and within the file; the header is a JSON
// object; every entry has a known dtype, a shape of non-negative integers and data_offsets
// [begin, end) with end - begin = numel × dtype size (all arithmetic overflow-checked); sorted by
// begin, the entries tile the data buffer exactly, from 0 to its end, with no hole or overlap.
// A tensor name appears once across all shards.

enum { ST_U8, ST_I8, ST_BOOL, ST_F8_E4M3, ST_F8_E5M2, ST_I16, ST_U16, ST_F16, ST_BF16,
       ST_I32, ST_U32, ST_F32, ST_I64, ST_U64, ST_F64, ST_N_DTYPES };

static const struct { const char *name; int bytes; } st_dtypes[ST_N_DTYPES] = {
    [ST_U8] = {"U8", 1},       [ST_I8] = {"I8", 1},         [ST_BOOL] = {"BOOL", 1},
    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_I16] = {"I16", 2},     [ST_U16] = {"U16", 2},       [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},   [ST_I32] = {"I32", 4},       [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},     [ST_I64] = {"I64", 8},       [ST_U64] = {"U64", 8},
    [ST_F64] = {"F64", 8},
};

typedef struct {
    const char *name;              // NUL-terminated, in the set's name pool
    int dtype;                     // ST_*
    int ndim;
    int64_t shape[MOET_MAX_DIMS];
    size_t numel;
    const uint8_t *data;           // into the shard's mapping
    size_t bytes;
    int shard;                     // index into st_set.shards
} st_tensor;

typedef struct {
    int n_shards;
    char shard_path[MOET_MAX_SHARDS][MOET_MAX_PATH];
    arena_map maps[MOET_MAX_SHARDS];
    st_tensor *tensors;            // [n_tensors]
    uint32_t n_tensors;
    uint32_t *hash;                // [hash_cap] tensor index + 1, 0 = empty (open addressing)
    uint32_t hash_cap;
    char *names;                   // name pool
    uint8_t *mem;                  // the one allocation behind tensors/hash/names
    size_t mem_bytes;
} st_set;

static const char *st_dtype_name(int dt) { return dt >= 0 && dt < ST_N_DTYPES ? st_dtypes[dt].name : "?"; }

static int st_dtype_parse(const js_node *n) {
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (js_str_is(n, st_dtypes[i].name)) return i;
    return -1;
}

static uint32_t st_hash_name(const char *s) {
    uint32_t h = 2166136261u;  // FNV-1a
    while (*s) h = (h ^ (uint8_t)*s++) * 16777619u;
    return h;
}

static const st_tensor *st_find(const st_set *s, const char *name) {
    if (!s->hash_cap) return NULL;
    uint32_t m = s->hash_cap - 1;
    for (uint32_t i = st_hash_name(name) & m;; i = (i + 1) & m) {
        uint32_t v = s->hash[i];
        if (!v) return NULL;
        if (!strcmp(s->tensors[v - 1].name, name)) return &s->tensors[v - 1];
    }
}

// "[2, 3]" for messages.
static const char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, i ? ", %" PRId64 : "%" PRId64, shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

typedef struct {
    const js_node *entry;  // the header entry (an object)
    const js_node *key;    // its name
    size_t begin, end;
} st_span;

static int st_span_cmp(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

// Parses and validates one shard's header. With `out` NULL it only counts tensors and name bytes;
// otherwise it fills out[*count ...] and copies names into *names.
static int st_shard_scan(const st_set *s, int shard, js_doc *doc, st_tensor *out, uint32_t *count,
                         size_t *name_bytes, char **names, moet_err *e) {
    const char *path = s->shard_path[shard];
    const arena_map *m = &s->maps[shard];
    const js_node *root = js_root(doc);
    size_t hdr = (size_t)(m->data[0] | (uint64_t)m->data[1] << 8 | (uint64_t)m->data[2] << 16 |
                          (uint64_t)m->data[3] << 24 | (uint64_t)m->data[4] << 32 | (uint64_t)m->data[5] << 40 |
                          (uint64_t)m->data[6] << 48 | (uint64_t)m->data[7] << 56);
    size_t data_bytes = m->size - 8 - hdr;
    const uint8_t *base = m->data + 8 + hdr;
    if (!root || root->type != JS_OBJ) return err_set(e, "%s: header is not a JSON object", path);
    uint32_t n = 0;
    for (const js_node *k = js_first(root); k; k = js_member_next(doc, root, k))
        if (!js_str_is(k, "__metadata__")) n++;
    // spans of every tensor, sorted by begin, to check the tiling
    st_span *spans = n ? arena_sys_alloc((size_t)n * sizeof(st_span), "safetensors spans") : NULL;
    if (n && !spans) return err_set(e, "%s: out of memory for %u tensor entries", path, n);
    size_t spans_bytes = (size_t)n * sizeof(st_span);
    int rc = -1;
    uint32_t i = 0;
    char shp[160];
    for (const js_node *k = js_first(root); k; k = js_member_next(doc, root, k)) {
        const js_node *v = k + 1;
        if (js_str_is(k, "__metadata__")) {
            if (v->type != JS_OBJ) { err_set(e, "%s: __metadata__ is not an object", path); goto done; }
            for (const js_node *mk = js_first(v); mk; mk = js_member_next(doc, v, mk))
                if (mk[1].type != JS_STR) { err_set(e, "%s: __metadata__ value of '%s' is not a string", path, mk->str); goto done; }
            continue;
        }
        if (k->len == 0 || k->len >= MOET_MAX_NAME || memchr(k->str, 0, k->len)) {
            if (k->len == 0) err_set(e, "%s: a tensor name is empty", path);
            else if (k->len >= MOET_MAX_NAME) err_set(e, "%s: tensor name of %u bytes is too long (limit %d)", path, k->len, MOET_MAX_NAME - 1);
            else err_set(e, "%s: tensor name '%s' contains a NUL byte", path, k->str);
            goto done;
        }
        if (v->type != JS_OBJ) { err_set(e, "%s: entry '%s' is not an object", path, k->str); goto done; }
        const js_node *dt = js_get(doc, v, "dtype"), *sh = js_get(doc, v, "shape"), *of = js_get(doc, v, "data_offsets");
        int dtype = st_dtype_parse(dt);
        if (dtype < 0) {
            err_set(e, "%s: tensor '%s' has unsupported dtype %s%s%s", path, k->str,
                    dt && dt->type == JS_STR ? "'" : "", dt && dt->type == JS_STR ? dt->str : js_type_name(dt),
                    dt && dt->type == JS_STR ? "'" : "");
            goto done;
        }
        if (!sh || sh->type != JS_ARR || sh->len > MOET_MAX_DIMS) {
            err_set(e, "%s: tensor '%s' has no valid shape (an array of at most %d integers)", path, k->str, MOET_MAX_DIMS);
            goto done;
        }
        if (!of || of->type != JS_ARR || of->len != 2) {
            err_set(e, "%s: tensor '%s' has no valid data_offsets (two integers)", path, k->str);
            goto done;
        }
        int64_t shape[MOET_MAX_DIMS] = {0};
        size_t numel = 1;
        int d = 0;
        for (const js_node *x = js_first(sh); x; x = js_after(doc, sh, x), d++) {
            int64_t dim;
            if (js_int(x, &dim) || dim < 0) { err_set(e, "%s: tensor '%s': shape entry %d is not a non-negative integer", path, k->str, d); goto done; }
            shape[d] = dim;
            if (size_mul(numel, (size_t)dim, &numel)) { err_set(e, "%s: tensor '%s': element count overflows", path, k->str); goto done; }
        }
        int64_t b0, b1;
        if (js_int(js_at(doc, of, 0), &b0) || js_int(js_at(doc, of, 1), &b1) || b0 < 0) {
            err_set(e, "%s: tensor '%s': data_offsets must be two integers 0 <= begin <= end", path, k->str);
            goto done;
        }
        if (b1 < b0) {
            err_set(e, "%s: tensor '%s': data_offsets end %" PRId64 " is before begin %" PRId64, path, k->str, b1, b0);
            goto done;
        }
        size_t nbytes;
        if (size_mul(numel, (size_t)st_dtypes[dtype].bytes, &nbytes)) { err_set(e, "%s: tensor '%s': byte size overflows", path, k->str); goto done; }
        if ((uint64_t)(b1 - b0) != nbytes) {
            err_set(e, "%s: tensor '%s' %s %s needs %zu bytes but data_offsets [%" PRId64 ", %" PRId64 ") hold %" PRId64,
                    path, k->str, st_dtypes[dtype].name, st_shape_str(shape, (int)sh->len, shp, sizeof shp), nbytes, b0, b1, b1 - b0);
            goto done;
        }
        if ((uint64_t)b1 > data_bytes) {
            err_set(e, "%s: tensor '%s': data_offsets end %" PRId64 " is past the data buffer of %zu bytes (file truncated?)",
                    path, k->str, b1, data_bytes);
            goto done;
        }
        spans[i].entry = v;
        spans[i].key = k;
        spans[i].begin = (size_t)b0;
        spans[i].end = (size_t)b1;
        if (out) {
            st_tensor *t = &out[*count + i];
            memset(t, 0, sizeof *t);
            memcpy(*names, k->str, k->len + 1);
            t->name = *names;
            *names += k->len + 1;
            t->dtype = dtype;
            t->ndim = (int)sh->len;
            memcpy(t->shape, shape, sizeof shape);
            t->numel = numel;
            t->data = base + b0;
            t->bytes = nbytes;
            t->shard = shard;
        }
        *name_bytes += k->len + 1;
        i++;
    }
    if (n) qsort(spans, n, sizeof *spans, st_span_cmp);   // spans is NULL when n = 0
    size_t at = 0;
    for (uint32_t j = 0; j < n; j++) {
        if (spans[j].begin != at) {
            if (spans[j].begin < at)
                err_set(e, "%s: tensor '%s' at [%zu, %zu) overlaps the previous tensor ending at %zu", path,
                        spans[j].key->str, spans[j].begin, spans[j].end, at);
            else
                err_set(e, "%s: hole in the data buffer: bytes [%zu, %zu) belong to no tensor (before '%s')", path, at,
                        spans[j].begin, spans[j].key->str);
            goto done;
        }
        at = spans[j].end;
    }
    if (at != data_bytes) {
        err_set(e, "%s: the tensors cover %zu bytes of a %zu-byte data buffer", path, at, data_bytes);
        goto done;
    }
    *count += n;
    rc = 0;
done:
    if (spans) arena_sys_free(spans, spans_bytes);
    return rc;
}

static int st_add_shard(st_set *s, const char *dir, const char *file, moet_err *e) {
    if (s->n_shards >= MOET_MAX_SHARDS) return err_set(e, "%s: more than %d shards", dir, MOET_MAX_SHARDS);
    for (int i = 0; i < s->n_shards; i++) {
        const char *base = strrchr(s->shard_path[i], '/');
        if (!strcmp(base ? base + 1 : s->shard_path[i], file)) return 0;  // already listed
    }
    if (!*file || strchr(file, '/') || !strcmp(file, "..") || !strcmp(file, "."))
        return err_set(e, "%s: shard name '%s' is not a plain file name", dir, file);
    int k = snprintf(s->shard_path[s->n_shards], MOET_MAX_PATH, "%s/%s", dir, file);
    if (k < 0 || k >= MOET_MAX_PATH) return err_set(e, "%s/%s: path too long", dir, file);
    s->n_shards++;
    return 0;
}

static int st_name_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// The shard list: from the index's weight_map when present, else every *.safetensors file.
static int st_list_shards(st_set *s, const char *dir, js_doc *index, moet_err *e) {
    char path[MOET_MAX_PATH];
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) {   // a single .safetensors file
        if (strlen(dir) >= MOET_MAX_PATH) return err_set(e, "%s: path too long", dir);
        snprintf(s->shard_path[0], MOET_MAX_PATH, "%s", dir);
        s->n_shards = 1;
        return 0;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) == 0) {
        if (js_load_file(index, path, MOET_MAX_CONFIG_BYTES, e)) return -1;
        const js_node *wm = js_get(index, js_root(index), "weight_map");
        if (!wm || wm->type != JS_OBJ || wm->len == 0) return err_set(e, "%s: no weight_map object", path);
        for (const js_node *k = js_first(wm); k; k = js_member_next(index, wm, k)) {
            const js_node *v = k + 1;
            if (v->type != JS_STR) return err_set(e, "%s: weight_map entry '%s' is not a file name", path, k->str);
            // a NUL (from \u0000) would silently cut the name short in every C string use below
            if (memchr(k->str, 0, k->len) || memchr(v->str, 0, v->len))
                return err_set(e, "%s: weight_map entry '%s' contains a NUL byte", path, k->str);
            if (st_add_shard(s, dir, v->str, e)) return err_wrap(e, "%s", path);
        }
        return 0;
    }
    DIR *d = opendir(dir);
    if (!d) return err_set(e, "%s: cannot open the model directory: %s", dir, strerror(errno));
    const char *found[MOET_MAX_SHARDS];
    char keep[MOET_MAX_SHARDS][256];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors") && l < sizeof keep[0]) {
            if (n >= MOET_MAX_SHARDS) { closedir(d); return err_set(e, "%s: more than %d shards", dir, MOET_MAX_SHARDS); }
            memcpy(keep[n], de->d_name, l + 1);
            found[n] = keep[n];
            n++;
        }
    }
    closedir(d);
    if (!n) return err_set(e, "%s: no *.safetensors file and no model.safetensors.index.json", dir);
    qsort(found, (size_t)n, sizeof found[0], st_name_cmp);
    for (int i = 0; i < n; i++)
        if (st_add_shard(s, dir, found[i], e)) return -1;
    return 0;
}

static void st_close(st_set *s) {
    for (int i = 0; i < s->n_shards; i++) arena_unmap(&s->maps[i]);
    if (s->mem) arena_sys_free(s->mem, s->mem_bytes);
    memset(s, 0, sizeof *s);
}

// Opens every shard of the checkpoint in `dir` (or the one file `dir` names). On error
// everything is released.
static int st_open(st_set *s, const char *dir, moet_err *e) {
    memset(s, 0, sizeof *s);
    js_doc index = {0};
    js_doc docs[MOET_MAX_SHARDS];
    memset(docs, 0, sizeof docs);
    int rc = -1;
    if (st_list_shards(s, dir, &index, e)) goto out;
    uint32_t total = 0;
    size_t name_bytes = 0;
    for (int i = 0; i < s->n_shards; i++) {
        const char *path = s->shard_path[i];
        if (arena_map_file(&s->maps[i], path, e)) {
            if (index.n_nodes) err_wrap(e, "shard named by %s/model.safetensors.index.json", dir);
            goto out;
        }
        const arena_map *m = &s->maps[i];
        if (m->size < 8) { err_set(e, "%s: %zu bytes, too short for a safetensors header", path, m->size); goto out; }
        uint64_t hdr = 0;
        for (int b = 7; b >= 0; b--) hdr = hdr << 8 | m->data[b];
        if (hdr > MOET_ST_MAX_HEADER) { err_set(e, "%s: header length %" PRIu64 " exceeds the limit of %llu bytes (not a safetensors file?)", path, hdr, MOET_ST_MAX_HEADER); goto out; }
        if (hdr > m->size - 8) { err_set(e, "%s: header length %" PRIu64 " is past the end of the %zu-byte file (truncated?)", path, hdr, m->size); goto out; }
        if (hdr < 2) { err_set(e, "%s: header length %" PRIu64 " is too short for a JSON object", path, hdr); goto out; }
        if (m->data[8] != '{') { err_set(e, "%s: header does not start with '{' (found byte 0x%02x)", path, m->data[8]); goto out; }
        if (js_load_doc(&docs[i], (const char *)m->data + 8, (size_t)hdr, path, e)) goto out;
        if (st_shard_scan(s, i, &docs[i], NULL, &total, &name_bytes, NULL, e)) goto out;
        if (total > MOET_MAX_TENSORS) { err_set(e, "%s: more than %d tensors in the checkpoint", dir, MOET_MAX_TENSORS); goto out; }
    }
    // one allocation: tensors | hash | names
    uint32_t cap = 16;
    while (cap < 2 * total) cap <<= 1;
    size_t tb = (size_t)total * sizeof(st_tensor), hb = (size_t)cap * sizeof(uint32_t);
    s->mem_bytes = tb + hb + name_bytes + 1;
    s->mem = arena_sys_alloc(s->mem_bytes, "safetensors table");
    if (!s->mem) { err_set(e, "%s: out of memory for the tensor table", dir); goto out; }
    s->tensors = (st_tensor *)s->mem;
    s->hash = (uint32_t *)(s->mem + tb);
    s->hash_cap = cap;
    s->names = (char *)(s->mem + tb + hb);
    char *np = s->names;
    uint32_t filled = 0;
    size_t nb2 = 0;
    for (int i = 0; i < s->n_shards; i++)
        MOET_ASSERT(st_shard_scan(s, i, &docs[i], s->tensors, &filled, &nb2, &np, e) == 0, "rescan: %s", e ? e->msg : "");
    MOET_ASSERT(filled == total && nb2 == name_bytes, "shard rescan disagrees");
    s->n_tensors = total;
    for (uint32_t t = 0; t < total; t++) {
        uint32_t m = cap - 1, h = st_hash_name(s->tensors[t].name) & m;
        while (s->hash[h]) {
            const st_tensor *o = &s->tensors[s->hash[h] - 1];
            if (!strcmp(o->name, s->tensors[t].name)) {
                err_set(e, "tensor '%s' appears twice: in %s and in %s", o->name, s->shard_path[o->shard],
                        s->shard_path[s->tensors[t].shard]);
                goto out;
            }
            h = (h + 1) & m;
        }
        s->hash[h] = t + 1;
    }
    // the index must not promise a tensor that its shard does not hold
    if (index.n_nodes) {
        const js_node *wm = js_get(&index, js_root(&index), "weight_map");
        for (const js_node *k = js_first(wm); k; k = js_member_next(&index, wm, k)) {
            const js_node *v = k + 1;
            const st_tensor *t = st_find(s, k->str);
            if (!t) { err_set(e, "%s/model.safetensors.index.json: tensor '%s' is listed in %s but no shard holds it", dir, k->str, v->str); goto out; }
            const char *base = strrchr(s->shard_path[t->shard], '/');
            if (strcmp(base + 1, v->str)) {
                err_set(e, "%s/model.safetensors.index.json: tensor '%s' is listed in %s but found in %s", dir, k->str, v->str, base + 1);
                goto out;
            }
        }
    }
    rc = 0;
out:
    for (int i = 0; i < s->n_shards; i++) js_free_doc(&docs[i]);
    js_free_doc(&index);
    if (rc) st_close(s);
    return rc;
}
