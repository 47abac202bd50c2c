// tests/capture.h — running a command's entry point in-process with its stdout and stderr captured: capture(fn, argc,
// argv) returns fn's exit code and leaves what it wrote in cap_out and cap_err (NUL-terminated, cut at 64 KiB each).
// The includer has moet.c (MOET_ASSERT) and defines tpath(out, cap, name), a path in its scratch directory, before this file.
#ifndef MOET_CAPTURE_H
#define MOET_CAPTURE_H
#include <fcntl.h>
#include <unistd.h>

static char cap_out[65536], cap_err[65536];

static int capture(int (*fn)(int, char **), int argc, char **argv) {
    fflush(stdout);
    fflush(stderr);
    char po[128], pe[128];
    tpath(po, sizeof po, "cap_out");
    tpath(pe, sizeof pe, "cap_err");
    int fo = open(po, O_RDWR | O_CREAT | O_TRUNC, 0600), fe = open(pe, O_RDWR | O_CREAT | O_TRUNC, 0600);
    MOET_ASSERT(fo >= 0 && fe >= 0, "capture files");
    int so = dup(1), se = dup(2);
    dup2(fo, 1);
    dup2(fe, 2);
    int rc = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    ssize_t n = pread(fo, cap_out, sizeof cap_out - 1, 0);
    cap_out[n > 0 ? n : 0] = 0;
    n = pread(fe, cap_err, sizeof cap_err - 1, 0);
    cap_err[n > 0 ? n : 0] = 0;
    close(fo);
    close(fe);
    unlink(po);
    unlink(pe);
    return rc;
}
#define CAPTURE(fn, argv) capture(fn, (int)(sizeof argv / sizeof argv[0]), argv)
#endif
