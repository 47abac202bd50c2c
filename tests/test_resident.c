// tests/test_resident.c — memory that is resident when it is handed out (arena_resident,
// arena_sys_alloc), on this kernel and on one without MADV_POPULATE_* (before Linux 5.14),
// which the test stands in for by making madvise fail with EINVAL.
#define madvise test_madvise   // every madvise of moet.c goes through the stand-in below
#include "../moet.c"
#undef madvise
#include "check.h"

int madvise(void *addr, size_t len, int advice);   // the real one (sys/mman.h declared the stand-in)

static int old_kernel;   // 1: madvise answers EINVAL, as a kernel that does not know the advice

int test_madvise(void *p, size_t n, int advice) {
    if (old_kernel) {
        errno = EINVAL;
        return -1;
    }
    return madvise(p, n, advice);
}

// Page faults taken while touching one byte of every page of [p, p + bytes) (writing it when
// `write`): 0 when the range was resident.
static long faults_touching(uint8_t *p, size_t bytes, int write) {
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    for (size_t i = 0; i < bytes; i += 4096)
        if (write) ((volatile uint8_t *)p)[i] = 1;
        else (void)((volatile uint8_t *)p)[i];
    getrusage(RUSAGE_SELF, &r1);
    return (r1.ru_minflt - r0.ru_minflt) + (r1.ru_majflt - r0.ru_majflt);
}

int main(void) {
    for (old_kernel = 0; old_kernel < 2; old_kernel++) {
        const char *k = old_kernel ? "without MADV_POPULATE" : "with MADV_POPULATE";
        // an allocation: zero, and every page resident (writing it faults nowhere)
        size_t bytes = (1u << 20) + 1;
        uint8_t *p = arena_sys_alloc(bytes, "test");
        CHECK(p != NULL, "%s: allocation", k);
        if (!p) continue;
        size_t nonzero = 0;
        for (size_t i = 0; i < bytes; i++) nonzero += p[i] != 0;
        CHECK(nonzero == 0, "%s: %zu bytes not zero", k, nonzero);
        long f = faults_touching(p, bytes, 1);
        CHECK(f == 0, "%s: %ld page faults writing a fresh allocation", k, f);
        arena_sys_free(p, bytes);

        // a file mapping read in: its pages present, its bytes those of the file
        char path[] = "/tmp/moet_resident_XXXXXX";
        int fd = mkstemp(path);
        MOET_ASSERT(fd >= 0, "temp file");
        static uint8_t data[64 * 4096];
        for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + 1);
        MOET_ASSERT(write(fd, data, sizeof data) == (ssize_t)sizeof data, "write");
        uint8_t *m = mmap(NULL, sizeof data, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        unlink(path);
        MOET_ASSERT(m != MAP_FAILED, "mmap");
        CHECK(arena_resident(m + 5000, 20 * 4096, 0) == 0, "%s: a file range read in", k);
        f = faults_touching(m + 4096, 21 * 4096, 0);   // [5000, 5000 + 80 KiB) widened to whole pages
        CHECK(f == 0, "%s: %ld page faults reading the range made resident", k, f);
        f = faults_touching(m + 40 * 4096, 24 * 4096, 0);
        CHECK(f > 0, "%s: reading pages not made resident faults (%ld): the measure above can fail", k, f);
        CHECK(!memcmp(m, data, sizeof data), "%s: the file's bytes", k);
        munmap(m, sizeof data);
    }
    old_kernel = 0;

    // the kernel refuses a range with a hole: an error, not a crash
    uint8_t *h = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    MOET_ASSERT(h != MAP_FAILED, "mmap");
    munmap(h + 4096, 4096);
    errno = 0;
    CHECK(arena_resident(h, 3 * 4096, 1) == -1 && errno == ENOMEM, "a hole in the range: -1 with ENOMEM (errno %d)", errno);
    munmap(h, 4096);
    munmap(h + 2 * 4096, 4096);
    CHECK(arena_resident(h, 0, 1) == 0, "an empty range");
    return check_report("test_resident");
}
