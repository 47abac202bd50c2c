// arena/arena.c — planned memory: measure, allocate once, carve.
//
// The same carving code runs twice: first on a measuring arena (base == NULL), which only
// adds up sizes and alignments, then on a real arena allocated with exactly that total.
// So the plan and the carve cannot drift apart, and arena_done() asserts they agree.
// Three kinds share the carve code: host memory (mmap), pinned host memory (cuMemHostAlloc,
// for copies to and from the GPU) and device memory (cuMemAlloc; base is the device address,
// carved like any other, never dereferenced on the host).
//
// Every allocation of the process goes through arena_sys_alloc / arena_map_file and is
// counted. After the `ready` line the counter is frozen: arena_freeze() makes any later
// allocation abort, and a test reads arena_stats to prove nothing was allocated.

enum { ARENA_HOST, ARENA_PINNED, ARENA_DEVICE };
static const char *const arena_kind_name[] = {"host", "pinned", "device"};

typedef struct {
    const char *name;   // what it holds, for the plan printout and errors
    int kind;           // ARENA_*
    uint8_t *base;      // NULL while measuring
    size_t cap;         // bytes (0 while measuring)
    size_t used;        // bytes carved so far (including alignment gaps)
} arena;

static struct {
    uint64_t allocs;    // successful system allocations (malloc/mmap) since start
    uint64_t bytes;     // their total size
    uint64_t pinned_allocs, pinned_bytes;   // cuMemHostAlloc
    uint64_t device_allocs, device_bytes;   // cuMemAlloc
    int frozen;         // set by arena_freeze(): any further allocation is a bug
} arena_stats;

static void arena_freeze(void) { arena_stats.frozen = 1; }

// System allocations of every kind so far (host, pinned, device).
static uint64_t arena_total_allocs(void) { return arena_stats.allocs + arena_stats.pinned_allocs + arena_stats.device_allocs; }

// Makes [p, p + bytes) resident now, so that no later access takes a page fault: the page
// tables are filled (write: with private, writable pages, as after a first write). The range is
// widened to whole pages. Returns 0, or -1 with errno (ENOMEM: memory is short; EFAULT: part of
// the range cannot be accessed that way). MADV_POPULATE_* (Linux 5.14) report a failure where
// MAP_POPULATE would ignore it; an older kernel (EINVAL) gets one access per 4 KiB (the smallest
// page size), a write being an atomic OR of 0 so that it cannot undo another thread's store.
static int arena_resident(const void *p, size_t bytes, int write) {
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095, b = ((uintptr_t)p + bytes + 4095) & ~(uintptr_t)4095;
    if (bytes == 0) return 0;
    if (madvise((void *)a, b - a, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0) return 0;
    if (errno != EINVAL) return -1;
    for (uintptr_t q = a; q < b; q += 4096)
        if (write) __atomic_fetch_or((uint8_t *)q, 0, __ATOMIC_RELAXED);
        else (void)*(volatile const uint8_t *)q;
    return 0;
}

// One system allocation, zeroed, page aligned, resident. Returns NULL when the system refuses
// (the caller turns that into a clear "does not fit" message).
//
// Resident: every page is faulted in here, at boot, not at its first use. Memory is planned, so
// all of it is meant to be used; a page first touched after `ready` would be a page fault in the
// hot path and a step in resident memory.
static void *arena_sys_alloc(size_t bytes, const char *what) {
    MOET_ASSERT(!arena_stats.frozen, "allocation of %zu bytes for %s after ready", bytes, what);
    if (bytes == 0) bytes = 1;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (arena_resident(p, bytes, 1) != 0) {
        munmap(p, bytes);
        return NULL;
    }
    arena_stats.allocs++;
    arena_stats.bytes += bytes;
    return p;
}

static void arena_sys_free(void *p, size_t bytes) {
    if (p) munmap(p, bytes ? bytes : 1);
}

static arena arena_measure(const char *name) {
    arena a = {name, ARENA_HOST, NULL, 0, 0};
    return a;
}



// Allocates a real arena of `cap` bytes (from a measuring pass). Returns -1 on refusal.
static int arena_init(arena *a, const char *name, size_t cap, moet_err *e) {
    a->name = name;
    a->kind = ARENA_HOST;
    a->used = 0;
    a->cap = cap;
    a->base = arena_sys_alloc(cap, name);
    if (!a->base) return err_set(e, "cannot allocate %zu bytes for the %s arena", cap, name);
#ifdef MOET_POISON
    memset(a->base, 0xff, cap);   // 0xffffffff is a NaN: a read before a write shows up
#endif
    return 0;
}

// Pinned host memory and device memory come from the GPU runtime: gpu/cuda.c registers these
// when it opens the driver (gpu_open). The arena only plans, counts and carves them, so memory
// sits below the device in the include order.
typedef struct {
    void *(*alloc)(int kind, size_t bytes);                 // NULL when the driver refuses
    void (*free)(int kind, void *p);
    void (*fill)(int kind, void *p, int byte, size_t bytes);   // MOET_POISON
} arena_gpu_ops;
static arena_gpu_ops arena_gpu;

// A pinned-host or device allocation of `bytes`, counted and frozen like host ones. Returns
// NULL when the driver refuses (out of memory): the caller says what did not fit.
static uint8_t *arena_gpu_alloc(int kind, size_t bytes, const char *what) {
    MOET_ASSERT(!arena_stats.frozen, "%s allocation of %zu bytes for %s after ready", arena_kind_name[kind], bytes, what);
    MOET_ASSERT(arena_gpu.alloc, "%s memory for %s before the GPU was opened", arena_kind_name[kind], what);
    if (bytes == 0) bytes = 1;
    uint8_t *p = arena_gpu.alloc(kind, bytes);
    if (!p) return NULL;
    if (kind == ARENA_PINNED) arena_stats.pinned_allocs++, arena_stats.pinned_bytes += bytes;
    else arena_stats.device_allocs++, arena_stats.device_bytes += bytes;
    return p;
}

// Allocates a real arena of `cap` bytes of `kind` (from a measuring pass). -1 on refusal.
// MOET_POISON fills it with 0xff bytes (a NaN in every float) on the device too.
static int arena_init_kind(arena *a, const char *name, int kind, size_t cap, moet_err *e) {
    if (kind == ARENA_HOST) {
        return arena_init(a, name, cap, e);
    }
    a->name = name;
    a->kind = kind;
    a->used = 0;
    a->cap = cap;
    a->base = arena_gpu_alloc(kind, cap, name);
    if (!a->base)
        return err_set(e, "cannot allocate %.2f GiB of %s memory for the %s arena", (double)cap / (1u << 30), arena_kind_name[kind], name);
#ifdef MOET_POISON
    arena_gpu.fill(kind, a->base, 0xff, cap);
#endif
    return 0;
}

static void arena_release(arena *a) {
    if (a->base && a->kind != ARENA_HOST) arena_gpu.free(a->kind, a->base);
    else if (a->base) arena_sys_free(a->base, a->cap);
    a->base = NULL;
    a->cap = a->used = 0;
}

// Carves `bytes` aligned to `align` (a power of two). On a measuring arena it returns NULL
// and only counts. On a real arena running past the plan is a bug, not an input error.
static void *arena_take(arena *a, size_t bytes, size_t align, const char *what) {
    MOET_ASSERT(align && (align & (align - 1)) == 0, "alignment %zu of %s", align, what);
    size_t off = (a->used + align - 1) & ~(align - 1);
    MOET_ASSERT(off >= a->used && bytes <= SIZE_MAX - off, "size overflow carving %s", what);
    a->used = off + bytes;
    if (!a->base) return NULL;
    MOET_ASSERT(a->used <= a->cap, "arena %s: %s needs %zu bytes past the plan of %zu",
                a->name, what, a->used - a->cap, a->cap);
    return a->base + off;
}

// The carve of a real arena must use exactly the measured plan.
static void arena_done(const arena *a) {
    MOET_ASSERT(!a->base || a->used == a->cap, "arena %s carved %zu of %zu planned bytes",
                a->name, a->used, a->cap);
}

// The one carve macro: `ptr` gets `count` elements of its own type, 64-byte aligned (a cache
// line). Carve functions take an arena and run on a measuring one and then on the real one.
#define ARENA_TAKE(a, ptr, count, what) ((ptr) = arena_take((a), sizeof(*(ptr)) * (size_t)(count), 64, (what)))

// The plan of one arena from its carve function: a measuring pass, one allocation of exactly
// what it measured, the real pass, and the check that both agree (arena_done):
//
//     arena_plan p = arena_plan_begin(&x->mem, "what it holds", ARENA_HOST, e);
//     while (arena_plan_pass(&p)) x_carve(x, p.on);
//     if (p.failed) return -1;   // e says what did not fit; nothing is left allocated
typedef struct {
    arena *mem;        // the real arena: allocated between the two passes
    arena measure;     // the measuring pass's
    arena *on;         // the arena this pass carves
    int kind, pass, failed;
    const char *name;
    moet_err *e;
} arena_plan;

static arena_plan arena_plan_begin(arena *mem, const char *name, int kind, moet_err *e) {
    arena_plan p = {mem, arena_measure(name), NULL, kind, 0, 0, name, e};
    return p;
}

// 1 while a pass is to run (carve on p->on); 0 when the plan is done or failed (p->failed).
static int arena_plan_pass(arena_plan *p) {
    switch (p->pass++) {
    case 0: p->on = &p->measure; return 1;
    case 1:
        if (arena_init_kind(p->mem, p->name, p->kind, p->measure.used, p->e)) {
            p->failed = 1;
            return 0;
        }
        p->on = p->mem;
        return 1;
    default: arena_done(p->mem); return 0;
    }
}

// ---- read-only file mappings (checkpoint shards); counted like allocations
typedef struct {
    const uint8_t *data;
    size_t size;
} arena_map;

static int arena_map_file(arena_map *m, const char *path, moet_err *e) {
    MOET_ASSERT(!arena_stats.frozen, "mapping %s after ready", path);
    m->data = NULL;
    m->size = 0;
    // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below like every
    // non-file (the flag does nothing to a regular file)
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return err_set(e, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(e, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return err_set(e, "%s: empty file", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return err_set(e, "%s: cannot map: %s", path, strerror(errno));
    arena_stats.allocs++;
    m->data = p;
    m->size = (size_t)st.st_size;
    return 0;
}

static void arena_unmap(arena_map *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

// Reads a whole small file (config.json …) into a fresh allocation of its size + 1 (NUL).
// The caller owns it (arena_sys_free(p, size + 1)). Boot only.
static char *arena_read_small(const char *path, size_t max, size_t *size, moet_err *e) {
    arena_map m;
    if (arena_map_file(&m, path, e) != 0) return NULL;
    if (m.size > max) {
        arena_unmap(&m);
        err_set(e, "%s: %zu bytes, more than the limit of %zu", path, m.size, max);
        return NULL;
    }
    char *p = arena_sys_alloc(m.size + 1, path);
    if (!p) {
        arena_unmap(&m);
        err_set(e, "%s: out of memory", path);
        return NULL;
    }
    memcpy(p, m.data, m.size);
    p[m.size] = 0;
    *size = m.size;
    arena_unmap(&m);
    return p;
}
