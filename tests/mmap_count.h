// tests/mmap_count.h — counts the memory mappings the code under test holds, so a test can
// prove that an error path released everything. arena_sys_alloc and arena_map_file allocate
// with mmap, which LeakSanitizer does not track. Include it before ../moet.c: every mmap /
// munmap call in moet.c then goes through these two counters.
#ifndef MOET_MMAP_COUNT_H
#define MOET_MMAP_COUNT_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sys/mman.h>
#include <sys/types.h>

static long mc_live;        // mappings made and not yet unmapped
static long long mc_bytes;  // their bytes, as the callers declared them

static void *mc_mmap(void *addr, size_t n, int prot, int flags, int fd, off_t off) {
    void *p = mmap(addr, n, prot, flags, fd, off);
    if (p != MAP_FAILED) {
        mc_live++;
        mc_bytes += (long long)n;
    }
    return p;
}

static int mc_munmap(void *addr, size_t n) {
    int rc = munmap(addr, n);
    if (rc == 0) {
        mc_live--;
        mc_bytes -= (long long)n;
    }
    return rc;
}

#define mmap mc_mmap
#define munmap mc_munmap
#endif
