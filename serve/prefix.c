// serve/prefix.c — the prefix cache's block table: which prompt prefixes have a saved state.
//
// JSONL jobs send many requests that share a long prefix (a system prompt, tool definitions,
// few-shot examples). On this hybrid model a prefix is not only attention KV: the 30 Gated
// DeltaNet layers carry a recurrent state that summarises everything before it. That state (and
// the conv windows) after a prefix is a fixed-size snapshot, so the backend can keep it
// (engine_backend.save) at every multiple of the block size and start a later sequence from it
// (engine_admit.from); this table decides which snapshots exist.
//
// A block is the prompt's tokens [k·N, (k+1)·N) after a given prefix: it is named by a hash
// chain (the identity of model and backend, then each block's tokens in turn) and found by
// that hash, but a hit is only taken when the parent block and the N tokens are equal too, so
// a hash collision can never give a request another prompt's state. A block's entry index is
// the backend's block id: the table and the backend's storage have the same number of slots,
// planned at boot.
//
// Lifetimes: a running request holds one block (users), the last one it started from or saved;
// a block with cached children is not a leaf. Only a leaf that nobody holds can be evicted, and
// the least recently used one goes first. So a request's chain stays whole while it runs, and
// a chain in the table is always whole from its first block (what a lookup walks).
//
// Exactness: a restored sequence is a prompt cut at k·N, a multiple of the backend's
// chunk_align, which the backend promises gives the same bits as no cut (tests/test_prefix.c
// checks it on the CPU and the GPU).

typedef struct {
    uint64_t hash;       // chain hash through this block (prefix_hash)
    int parent;          // the entry of the block before (−1: the prompt's first block)
    int depth;           // blocks up to and with this one: its state is after depth · N tokens
    int children;        // entries whose parent this is
    int users;           // running requests holding it
    int live;            // holds a saved state (else on the free list)
    uint64_t used;       // tick of its last lookup or save (least recently used goes first)
} prefix_entry;

typedef struct {
    int block;           // N: tokens per block (engine_backend.prefix_block); 0: no cache
    int cap;             // entries = the backend's block ids
    uint64_t seed;       // the chain's start: the identity of model, weights, plane file, backend, N
    prefix_entry *ent;   // [cap]
    int32_t *tokens;     // [cap, N] each block's own tokens, compared on every hit
    int32_t *slot;       // [tcap] hash table, linear probing: entry + 1, 0 empty
    int tcap;            // a power of two, at least 2 · cap
    int32_t *free;       // [cap] free entries (stack)
    int n_free, n_live;
    uint64_t tick;
    uint64_t saves, evictions, hits;   // blocks saved, blocks evicted, admissions that started from a block
} prefix_table;

static int prefix_tcap(int cap) {
    int t = 16;
    while (t < 2 * cap) t *= 2;
    return t;
}

// Planned with the server (serve_carve): block and cap set before.
static void prefix_carve(prefix_table *T, arena *a) {
    T->tcap = prefix_tcap(T->cap);
    ARENA_TAKE(a, T->ent, T->cap, "prefix table");
    ARENA_TAKE(a, T->tokens, (size_t)T->cap * T->block, "prefix block tokens");
    ARENA_TAKE(a, T->slot, T->tcap, "prefix hash table");
    ARENA_TAKE(a, T->free, T->cap, "prefix free list");
}

static void prefix_init(prefix_table *T) {
    memset(T->ent, 0, sizeof(prefix_entry) * (size_t)T->cap);
    memset(T->slot, 0, sizeof(int32_t) * (size_t)T->tcap);
    T->n_free = 0;
    for (int i = T->cap - 1; i >= 0; i--) T->free[T->n_free++] = i;
    T->n_live = 0;
    T->tick = T->saves = T->evictions = T->hits = 0;
}

// The chain hash of a block of n tokens after the chain hash h (murmur3's 64-bit finaliser over
// FNV-1a of the ids: collisions are caught by the token comparison, this only spreads).
static uint64_t prefix_hash(uint64_t h, const int32_t *ids, int n) {
    h ^= 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)ids[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

// The entry of the block (parent, tokens) whose chain hash is h, or −1.
static int prefix_find(const prefix_table *T, int parent, uint64_t h, const int32_t *ids) {
    for (int i = (int)(h & (uint64_t)(T->tcap - 1));; i = (i + 1) & (T->tcap - 1)) {
        int e = T->slot[i] - 1;
        if (e < 0) return -1;
        const prefix_entry *x = &T->ent[e];
        if (x->hash == h && x->parent == parent && !memcmp(T->tokens + (size_t)e * T->block, ids, sizeof(int32_t) * (size_t)T->block))
            return e;
    }
}

// The longest chain of cached blocks that starts the prompt ids[0 .. n_blocks · N): its entries
// into chain[0 ..), each touched (most recently used); returns how many, with *h the chain hash
// through the last (the seed when none).
static int prefix_match(prefix_table *T, const int32_t *ids, int n_blocks, int32_t *chain, uint64_t *h) {
    int k = 0, parent = -1;
    uint64_t hh = T->seed;
    T->tick++;
    for (; k < n_blocks; k++) {
        uint64_t nh = prefix_hash(hh, ids + (size_t)k * T->block, T->block);
        int e = prefix_find(T, parent, nh, ids + (size_t)k * T->block);
        if (e < 0) break;
        T->ent[e].used = T->tick;
        chain[k] = e;
        parent = e;
        hh = nh;
    }
    *h = hh;
    return k;
}

static void prefix_hold(prefix_table *T, int e) { T->ent[e].users++; }

static void prefix_unhold(prefix_table *T, int e) {
    MOET_ASSERT(T->ent[e].users > 0, "prefix block %d released by nobody", e);
    T->ent[e].users--;
    T->ent[e].used = ++T->tick;   // its holder just used it
}

// Takes entry e out of the hash table (backward-shift deletion: later entries of its probe run
// move up, so no lookup ever stops at a hole before them).
static void prefix_unlink(prefix_table *T, int e) {
    int m = T->tcap - 1, i = (int)(T->ent[e].hash & (uint64_t)m);
    while (T->slot[i] != e + 1) i = (i + 1) & m;
    for (int j = (i + 1) & m;; j = (j + 1) & m) {
        int x = T->slot[j] - 1;
        if (x < 0) break;
        int home = (int)(T->ent[x].hash & (uint64_t)m);
        // x may fill the hole at i unless its home lies cyclically in (i, j]
        if (((j - home) & m) >= ((j - i) & m)) {
            T->slot[i] = T->slot[j];
            i = j;
        }
    }
    T->slot[i] = 0;
}

// Evicts the least recently used leaf nobody holds: out of the table, its backend block dropped.
// Returns 0 when every block is held or has children (nothing may go).
static int prefix_evict(prefix_table *T, const engine_backend *be) {
    int best = -1;
    for (int e = 0; e < T->cap; e++) {
        const prefix_entry *x = &T->ent[e];
        if (x->live && !x->users && !x->children && (best < 0 || x->used < T->ent[best].used)) best = e;
    }
    if (best < 0) return 0;
    prefix_entry *x = &T->ent[best];
    prefix_unlink(T, best);
    if (x->parent >= 0) T->ent[x->parent].children--;
    be->drop(be->self, best);
    memset(x, 0, sizeof *x);
    T->free[T->n_free++] = best;
    T->n_live--;
    T->evictions++;
    return 1;
}

// A free entry for a new block, evicting one when none is free; −1 when nothing may be evicted.
static int prefix_take(prefix_table *T, const engine_backend *be) {
    if (!T->n_free && !prefix_evict(T, be)) return -1;
    return T->free[--T->n_free];
}

// A taken entry whose state could not be saved goes back.
static void prefix_put(prefix_table *T, int e) { T->free[T->n_free++] = e; }

// Entry e (taken, its state saved by the backend) becomes the block `ids` after parent.
static void prefix_link(prefix_table *T, int e, int parent, int depth, uint64_t h, const int32_t *ids) {
    prefix_entry *x = &T->ent[e];
    *x = (prefix_entry){h, parent, depth, 0, 0, 1, ++T->tick};
    memcpy(T->tokens + (size_t)e * T->block, ids, sizeof(int32_t) * (size_t)T->block);
    if (parent >= 0) T->ent[parent].children++;
    int i = (int)(h & (uint64_t)(T->tcap - 1));
    while (T->slot[i]) i = (i + 1) & (T->tcap - 1);
    T->slot[i] = e + 1;
    T->n_live++;
    T->saves++;
}

// Blocks held by running requests (each holds at most one).
static int prefix_held(const prefix_table *T) {
    int n = 0;
    for (int e = 0; e < T->cap; e++) n += T->ent[e].users;
    return n;
}

// ---- identity -----------------------------------------------------------------------------
//
// What the chain starts from: one process serves one model, so the table never mixes models,
// but the key says what a state depends on, so a cache kept across models could never mix them
// either: the model's config.json, every shard's safetensors header (tensor names, dtypes,
// shapes, offsets) with its size and modification time, the Hugging Face revision when the
// path names one, the plane file's header page (its SHA-256 covers the hash of every expert
// slot), the backend (CPU or GPU, and the GPU's KV dtype) and the block size. SHA-256, first
// 8 bytes. Boot only (it allocates).
static uint64_t prefix_identity(const ck_model *m, const char *planes, int is_gpu, int kv_dtype, int block, moet_err *e) {
    pf_sha sha;
    if (pf_sha_init(&sha, e)) return 0;
    uint8_t sum[32], acc[32];
    memset(acc, 0, sizeof acc);
    // acc = SHA-256(acc || piece) for each piece, in order
#define PREFIX_ID_ADD(p, n)                                                 \
    do {                                                                    \
        uint8_t t_[32];                                                     \
        pf_sha256(&sha, (p), (n), t_);                                      \
        uint8_t both_[64];                                                  \
        memcpy(both_, acc, 32);                                             \
        memcpy(both_ + 32, t_, 32);                                         \
        pf_sha256(&sha, both_, 64, acc);                                    \
    } while (0)
    char path[MOET_MAX_PATH];
    size_t n = 0;
    if (ck_path(path, sizeof path, m->dir, "config.json") == 0) {
        moet_err ce;
        char *cfg = arena_read_small(path, MOET_MAX_CONFIG_BYTES, &n, &ce);
        if (cfg) {
            PREFIX_ID_ADD(cfg, n);
            arena_sys_free(cfg, n + 1);
        }
    }
    for (int i = 0; i < m->st.n_shards; i++) {
        const arena_map *mp = &m->st.maps[i];
        uint64_t hdr = 0;
        for (int b = 0; b < 8 && (size_t)b < mp->size; b++) hdr |= (uint64_t)mp->data[b] << (8 * b);
        if (hdr <= mp->size - 8) PREFIX_ID_ADD(mp->data, 8 + hdr);
        struct stat st;
        if (stat(m->st.shard_path[i], &st) == 0) {
            int64_t v[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
            PREFIX_ID_ADD(v, sizeof v);
        }
    }
    char repo[256], rev[256];
    if (ck_hf_snapshot(m->dir, repo, sizeof repo, rev, sizeof rev)) PREFIX_ID_ADD(rev, strlen(rev));
    if (planes) {
        uint8_t page[4096];
        int fd = open(planes, O_RDONLY | O_CLOEXEC);
        ssize_t got = fd >= 0 ? read(fd, page, sizeof page) : -1;
        if (fd >= 0) close(fd);
        if (got > 0) PREFIX_ID_ADD(page, (size_t)got);
    }
    int32_t be[3] = {is_gpu, is_gpu ? kv_dtype : -1, block};
    PREFIX_ID_ADD(be, sizeof be);
#undef PREFIX_ID_ADD
    memcpy(sum, acc, 32);
    pf_sha_free(&sha);
    uint64_t id = 0;
    for (int i = 0; i < 8; i++) id = id << 8 | sum[i];
    return id;
}
