// tests/test_cli.c — the command line as a new user meets it: where commands write (--out of
// build-planes, run and synth: only a new path or a regular file is replaced, never half-written,
// no temporary file left by an error or a fatal signal), the flags and paths they refuse (each
// message naming the bad one), the model name `moet serve` reports, and the documents the
// README points to (they must be in the repository).
#include "../moet.c"
#include "check.h"
#include <sys/sysmacros.h>
#include <sys/wait.h>

static char tdir[64];   // scratch directory of this run
static void tpath(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tdir, name); }

// ---- running a command in-process with its output captured ----------------------------------

#include "capture.h"

// Names in tdir that contain ".tmp" (a temporary output file left behind).
static int tmp_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *x;
    while (d && (x = readdir(d)))
        if (strstr(x->d_name, ".tmp")) n++;
    if (d) closedir(d);
    return n;
}

static mode_t lmode(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0 ? st.st_mode : 0;
}

static void write_text(const char *p, const char *s) {
    FILE *f = fopen(p, "w");
    MOET_ASSERT(f, "%s", p);
    fputs(s, f);
    fclose(f);
}

// 1 when file p holds exactly s.
static int holds(const char *p, const char *s) {
    char b[256];
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    size_t n = fread(b, 1, sizeof b - 1, f);
    fclose(f);
    b[n] = 0;
    return !strcmp(b, s);
}

// ---- what is at the output path -------------------------------------------------------------

// Each kind of non-file is named; a new path and a regular file are accepted.
static void test_target_kinds(void) {
    moet_err e = {{0}};
    char p[96], q[96];
    tpath(p, sizeof p, "absent");
    CHECK(of_check_target(p, &e) == 0, "a new path: %s", e.msg);
    tpath(p, sizeof p, "regular");
    write_text(p, "x");
    CHECK(of_check_target(p, &e) == 0, "a regular file: %s", e.msg);
    tpath(q, sizeof q, "link");
    MOET_ASSERT(symlink(p, q) == 0, "symlink");
    CHECK(of_check_target(q, &e) == -1 && strstr(e.msg, "a symbolic link"), "symlink to a file: %s", e.msg);
    tpath(q, sizeof q, "fifo");
    MOET_ASSERT(mkfifo(q, 0600) == 0, "mkfifo");
    CHECK(of_check_target(q, &e) == -1 && strstr(e.msg, "a FIFO"), "FIFO: %s", e.msg);
    CHECK(of_check_target(tdir, &e) == -1 && strstr(e.msg, "a directory"), "directory: %s", e.msg);
    CHECK(of_check_target("/dev/null", &e) == -1 && strstr(e.msg, "a character device"), "device: %s", e.msg);
    unlink(p);
    tpath(p, sizeof p, "link");
    unlink(p);
    tpath(p, sizeof p, "fifo");
    unlink(p);
}

// build-planes --out and run --out over a symlink, a FIFO, a directory and a device node: each
// refused with its kind named, and left exactly as it was (the symlink's target unwritten).
static void test_out_refused(void) {
    char target[96], link[96], fifo[96], dir[96], dev[96], regular[96];
    tpath(target, sizeof target, "target.txt");
    tpath(link, sizeof link, "link.out");
    tpath(fifo, sizeof fifo, "fifo.out");
    tpath(dir, sizeof dir, "dir.out");
    tpath(dev, sizeof dev, "null.out");
    tpath(regular, sizeof regular, "regular.out");
    write_text(target, "keep");
    MOET_ASSERT(symlink(target, link) == 0 && mkfifo(fifo, 0600) == 0 && mkdir(dir, 0700) == 0, "fixtures");
    // a device node of our own (the null device) where we may make one (root); elsewhere only
    // the system's /dev/null, which the commands must leave alone as well
    int own_dev = mknod(dev, S_IFCHR | 0600, makedev(1, 3)) == 0;
    if (!own_dev) {
        fprintf(stderr, "test_cli: mknod not permitted (%s): the device case runs on /dev/null\n", strerror(errno));
        snprintf(dev, sizeof dev, "/dev/null");
    }
    const char *paths[4] = {link, fifo, dir, dev}, *kinds[4] = {"a symbolic link", "a FIFO", "a directory", "a character device"};
    mode_t before[4];
    for (int k = 0; k < 4; k++) before[k] = lmode(paths[k]);
    for (int k = 0; k < 4; k++) {
        char *argv_b[] = {"moet", "build-planes", "--model", "tests/fixtures/tiny/nvfp4", "--out", (char *)paths[k]};
        CHECK(CAPTURE(cmd_build_planes, argv_b) == 1 && strstr(cap_err, kinds[k]), "build-planes --out %s: %s", kinds[k], cap_err);
        char *argv_r[] = {"moet", "run", "--model", "tests/fixtures/tiny/nvfp4", "--ids", "1,2,3", "--out", (char *)paths[k]};
        CHECK(CAPTURE(cmd_run, argv_r) == 1 && strstr(cap_err, kinds[k]), "run --out %s: %s", kinds[k], cap_err);
        CHECK(lmode(paths[k]) == before[k], "%s left as it was (mode %o, was %o)", kinds[k], lmode(paths[k]), before[k]);
    }
    CHECK(holds(target, "keep"), "the symlink's target was not written");
    CHECK(tmp_files(tdir) == 0, "no temporary file left by the refusals");
    // the library writer refuses the same way when it is called directly (st_save: run --out)
    moet_err e = {{0}};
    float v[2] = {1, 2};
    st_out t = {"x", ST_F32, 1, {2}, v};
    CHECK(st_save(link, &t, 1, &e) == -1 && strstr(e.msg, "symbolic link") && holds(target, "keep"), "st_save: %s", e.msg);
    // a regular file is replaced whole
    write_text(regular, "old");
    CHECK(st_save(regular, &t, 1, &e) == 0, "%s", e.msg);
    st_set s;
    CHECK(st_open(&s, regular, &e) == 0 && s.n_tensors == 1 && st_find(&s, "x"), "the new file replaced the old: %s", e.msg);
    if (s.n_tensors) st_close(&s);
    // an error while writing leaves neither the file nor its temporary file
    stw_tensor decl = {"x", ST_F32, 1, {2}};
    stw_file w;
    char fresh[96];
    tpath(fresh, sizeof fresh, "short.safetensors");
    CHECK(stw_begin(&w, fresh, &decl, 1, &e) == 0 && stw_write(&w, v, 4, &e) == 0, "%s", e.msg);
    CHECK(stw_end(&w, &e) == -1 && access(fresh, F_OK) != 0 && tmp_files(tdir) == 0, "a short file is not put in place: %s", e.msg);
    CHECK(st_save("/nonexistent-dir/x.safetensors", &t, 1, &e) == -1 && strstr(e.msg, "cannot create"), "%s", e.msg);
    unlink(regular);
    unlink(link);
    unlink(fifo);
    rmdir(dir);
    if (own_dev) unlink(dev);
    unlink(target);
}

// synth --out DIR: checked before DIR is touched; DIR itself must be a directory (not a
// symlink); a FIFO among its files is refused and the run removes what it wrote.
static void test_synth_out(void) {
    char out[96], bad[96], link[96], fifo[160], path[160];
    tpath(out, sizeof out, "synth.out");
    tpath(bad, sizeof bad, "bad_quant.json");
    // a quantization map with an unknown algorithm: the message names the given file, and no
    // output directory is made
    write_text(bad, "{\"quantization\": {\"quant_algo\": \"INT3\"}}");
    char *argv_q[] = {"moet", "synth", "--config", "tests/fixtures/tiny/nvfp4/config.json", "--quant", bad, "--out", out};
    CHECK(CAPTURE(cmd_synth, argv_q) == 1 && strstr(cap_err, bad) && strstr(cap_err, "INT3") && !strstr(cap_err, "synth.out"),
          "synth --quant BAD names the input: %s", cap_err);
    CHECK(access(out, F_OK) != 0, "no output directory after a refused map");
    unlink(bad);
    // DIR is a symbolic link to a directory: refused, nothing written through it
    tpath(link, sizeof link, "synth.link");
    MOET_ASSERT(mkdir(out, 0700) == 0 && symlink(out, link) == 0, "fixtures");
    char *argv_l[] = {"moet", "synth", "--config", "tests/fixtures/tiny/bf16/config.json", "--out", link};
    CHECK(CAPTURE(cmd_synth, argv_l) == 1 && strstr(cap_err, "a symbolic link"), "synth --out SYMLINK: %s", cap_err);
    snprintf(path, sizeof path, "%s/config.json", out);
    CHECK(access(path, F_OK) != 0, "nothing written through the link");
    unlink(link);
    // a FIFO where a shard goes: refused; the files written before it are removed, the FIFO
    // and the directory (it existed) stay
    snprintf(fifo, sizeof fifo, "%s/model-00001-of-00001.safetensors", out);
    MOET_ASSERT(mkfifo(fifo, 0600) == 0, "mkfifo");
    char *argv_f[] = {"moet", "synth", "--config", "tests/fixtures/tiny/bf16/config.json", "--out", out};
    CHECK(CAPTURE(cmd_synth, argv_f) == 1 && strstr(cap_err, "a FIFO"), "synth with a FIFO shard: %s", cap_err);
    CHECK(S_ISFIFO(lmode(fifo)) && access(path, F_OK) != 0 && tmp_files(out) == 0, "FIFO kept, config.json removed, no temporary file");
    unlink(fifo);
    // into the existing directory, once nothing is in the way
    CHECK(CAPTURE(cmd_synth, argv_f) == 0, "synth: %s", cap_err);
    ck_model m;
    moet_err e = {{0}};
    CHECK(ck_open(&m, out, &e) == 0, "the synthetic checkpoint opens: %s", e.msg);
    if (m.layers) ck_close(&m);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    CHECK(system(cmd) == 0, "cleanup");
    char *argv_s[] = {"moet", "synth", "--config", "tests/fixtures/tiny/bf16/config.json", "--out", out, "--seed", "-5"};
    CHECK(CAPTURE(cmd_synth, argv_s) == 2 && strstr(cap_err, "--seed -5"), "synth --seed -5: %s", cap_err);
    CHECK(access(out, F_OK) != 0, "no output directory after a refused flag");
}

// ---- fatal signals during a build ---------------------------------------------------------------

// A source that takes 20 ms per expert, so the build is still running when the signal comes.
static int slow_source(void *ctx, uint32_t layer, uint32_t expert, double *w13, double *w2, moet_err *e) {
    (void)e;
    const pf_geom *g = ctx;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    size_t n13 = (size_t)2 * g->inter * g->hidden;
    for (size_t i = 0; i < n13; i++) w13[i] = (double)((layer * 31 + expert * 7 + i) % 17) - 8;
    for (size_t i = 0; i < n13 / 2; i++) w2[i] = (double)((layer + expert + i) % 5) - 2;
    return 0;
}

// Forks a build of `out` (60 slow slots, ~1.2 s) with progress lines on a pipe. Once its
// temporary file exists: with sig = SIGPIPE the pipe's reader goes away (the next progress
// line raises SIGPIPE, as with `moet build-planes ... 2>&1 | head -1`), else the signal is sent.
// ignore: the child ignores sig (as under nohup). Returns the wait status.
static int build_and_signal(const char *out, int sig, int ignore) {
    int p[2];
    MOET_ASSERT(pipe(p) == 0, "pipe");
    fflush(stderr);
    pid_t pid = fork();
    MOET_ASSERT(pid >= 0, "fork");
    if (pid == 0) {
        close(p[0]);
        dup2(p[1], 2);
        if (ignore) signal(sig, SIG_IGN);
        static pf_geom g = {4, 0, 15, 64, 64};
        pf_build_opts o;
        memset(&o, 0, sizeof o);
        o.geom = g;
        o.out_path = out;
        o.source_format = "bf16";
        o.source = slow_source;
        o.source_ctx = &g;
        o.threads = 1;
        o.progress = 1;
        moet_err e = {{0}};
        _exit(pf_build(&o, NULL, &e) ? 1 : 0);
    }
    close(p[1]);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)pid);
    for (int i = 0; i < 2000 && access(tmp, F_OK) != 0; i++) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(access(tmp, F_OK) == 0, "the build's temporary file %s appeared", tmp);
    if (sig == SIGPIPE) close(p[0]);
    else kill(pid, sig);
    int st = 0;
    waitpid(pid, &st, 0);
    if (sig != SIGPIPE) close(p[0]);
    return st;
}

static void test_build_signals(void) {
    char out[96];
    tpath(out, sizeof out, "sig.planes");
    const int sigs[] = {SIGPIPE, SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGALRM};
    for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++) {
        int st = build_and_signal(out, sigs[k], 0);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == sigs[k], "signal %d ended the build (status %#x)", sigs[k], st);
        CHECK(tmp_files(tdir) == 0 && access(out, F_OK) != 0, "signal %d: no temporary file and no output left", sigs[k]);
    }
    // an ignored signal does not end the process: the build completes
    int st = build_and_signal(out, SIGHUP, 1);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && access(out, F_OK) == 0 && tmp_files(tdir) == 0,
          "an ignored SIGHUP: the build completes (status %#x)", st);
    unlink(out);
    // the process's own handlers are back after a build
    struct sigaction sa;
    sigaction(SIGHUP, NULL, &sa);
    CHECK(sa.sa_handler == SIG_DFL, "SIGHUP handler restored after the build");
}

// ---- flags and paths refused, each by name ------------------------------------------------------

static void test_flags(void) {
    char *argv_seed[] = {"moet", "serve", "--seed", "-5"};
    CHECK(CAPTURE(cmd_serve, argv_seed) == 2 && strstr(cap_err, "--seed -5") && strstr(cap_err, "unsigned"), "serve --seed -5: %s",
          cap_err);
    char *argv_seed2[] = {"moet", "serve", "--seed", " 7"};
    CHECK(CAPTURE(cmd_serve, argv_seed2) == 2 && strstr(cap_err, "--seed  7"), "serve --seed ' 7': %s", cap_err);
    char *argv_seed3[] = {"moet", "serve", "--seed", "18446744073709551616"};
    CHECK(CAPTURE(cmd_serve, argv_seed3) == 2 && strstr(cap_err, "--seed 18446744073709551616"), "serve --seed 2^64: %s", cap_err);
    struct { const char *flag, *value; } bad[] = {{"--chunk", "0"}, {"--chunk", "x"}, {"--greedy", "-1"}, {"--greedy", "2x"},
                                                   {"--threads", "0"}, {"--threads", "100000"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *argv[] = {"moet", "run", "--model", "tests/fixtures/tiny/nvfp4", "--ids", "1", (char *)bad[k].flag, (char *)bad[k].value};
        CHECK(CAPTURE(cmd_run, argv) == 2, "run %s %s: exit 2", bad[k].flag, bad[k].value);
        char want[64];
        snprintf(want, sizeof want, "%s %s: expected an integer in", bad[k].flag, bad[k].value);
        int others = 0;   // the message names this flag only
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++)
            if (strcmp(bad[j].flag, bad[k].flag) && strstr(cap_err, bad[j].flag)) others = 1;
        CHECK(strstr(cap_err, want) && !others, "run %s %s: %s", bad[k].flag, bad[k].value, cap_err);
    }
    char *argv_info[] = {"moet", "info", tdir};
    CHECK(CAPTURE(cmd_info, argv_info) == 1 && strstr(cap_err, "not a regular file") && !strstr(cap_err, "truncated"),
          "info on a directory: %s", cap_err);
    char fifo[96];
    tpath(fifo, sizeof fifo, "info.fifo");
    MOET_ASSERT(mkfifo(fifo, 0600) == 0, "mkfifo");
    char *argv_fifo[] = {"moet", "info", fifo};
    CHECK(CAPTURE(cmd_info, argv_fifo) == 1 && strstr(cap_err, "not a regular file"), "info on a FIFO (no hang): %s", cap_err);
    unlink(fifo);
    char *argv_verify[] = {"moet", "verify", tdir};
    CHECK(CAPTURE(cmd_verify, argv_verify) == 1 && strstr(cap_err, "not a regular file"), "verify on a directory: %s", cap_err);
    // a FIFO given where a file is read is refused at once, not waited on
    MOET_ASSERT(mkfifo(fifo, 0600) == 0, "mkfifo");
    char *argv_vf[] = {"moet", "verify", fifo};
    CHECK(CAPTURE(cmd_verify, argv_vf) == 1 && strstr(cap_err, "not a regular file"), "verify on a FIFO: %s", cap_err);
    char *argv_rf[] = {"moet", "run", "--model", "tests/fixtures/tiny/nvfp4", "--ids-file", fifo};
    CHECK(CAPTURE(cmd_run, argv_rf) == 1 && strstr(cap_err, "not a regular file"), "run --ids-file FIFO: %s", cap_err);
    char *argv_tf[] = {"moet", "tokenize", "--tokenizer", fifo};
    CHECK(CAPTURE(cmd_tokenize, argv_tf) == 2 && strstr(cap_err, "not a regular file"), "tokenize --tokenizer FIFO: %s", cap_err);
    unlink(fifo);
}

// ---- the model name -----------------------------------------------------------------------------

static void test_model_name(void) {
    char name[MOET_MAX_PATH];
    const char *plain[] = {"tests/fixtures/demo", "tests/fixtures/demo/", "tests/fixtures/demo//", "./tests/fixtures/demo/.",
                           "tests/fixtures/tok/../demo"};
    for (size_t k = 0; k < sizeof plain / sizeof plain[0]; k++) {
        ck_model_name(plain[k], name, sizeof name);
        CHECK(!strcmp(name, "demo"), "model name of %s: %s", plain[k], name);
    }
    // a Hugging Face cache snapshot: ORG/NAME, not the revision
    char snap[256], cmd[MOET_MAX_PATH + 600], cwd[MOET_MAX_PATH];
    MOET_ASSERT(getcwd(cwd, sizeof cwd), "getcwd");
    snprintf(snap, sizeof snap, "%s/models--Org--Some-Model/snapshots/0123456789abcdef0123456789abcdef01234567", tdir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/models--Org--Some-Model/snapshots' && ln -s '%s/tests/fixtures/demo' '%s'", tdir, cwd, snap);
    MOET_ASSERT(system(cmd) == 0, "snapshot fixture");
    char with_slash[300];
    snprintf(with_slash, sizeof with_slash, "%s/", snap);
    ck_model_name(with_slash, name, sizeof name);
    CHECK(!strcmp(name, "Org/Some-Model"), "model name of a snapshot: %s", name);
    // the running server says it: in the ready line and in an answer
    const char *req = "{\"id\":\"n\",\"prompt\":\"def\",\"max_tokens\":1}\n";
    char inpath[96], outpath[96];
    tpath(inpath, sizeof inpath, "serve_in");
    tpath(outpath, sizeof outpath, "serve_out");
    write_text(inpath, req);
    const char *models[2] = {"tests/fixtures/demo/", with_slash}, *want[2] = {"\"model\":\"demo\"", "\"model\":\"Org/Some-Model\""};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "./moet serve --model '%s' < '%s' > '%s' 2>/dev/null", models[k], inpath, outpath);
        int rc = system(cmd);
        char text[4096] = "";
        FILE *f = fopen(outpath, "r");
        size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
        text[n] = 0;
        if (f) fclose(f);
        char *second = strchr(text, '\n');
        CHECK(rc == 0 && strstr(text, want[k]) && second && strstr(second, want[k]) && !strstr(text, tdir) && !strstr(text, "fixtures"),
              "serve --model %s: the ready line and the answer say %s: %s", models[k], want[k], text);
    }
    unlink(inpath);
    unlink(outpath);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/models--Org--Some-Model'", tdir);
    CHECK(system(cmd) == 0, "cleanup");
}

// ---- the documents ---------------------------------------------------------------------------

// Every relative link of a Markdown file (](target)), and every path-like name of a .md file in
// its text (format/PLANES.md, sass/MODEL.md), must name a file of the repository. Links resolve
// from the file's directory, names in the text from the repository root.
static void check_doc(const char *md, const char *dir) {
    size_t len;
    moet_err e = {{0}};
    char *text = arena_read_small(md, 1 << 20, &len, &e);
    CHECK(text != NULL, "%s", e.msg);
    if (!text) return;
    int links = 0;
    for (const char *p = text; (p = strstr(p, "](")) != NULL; p += 2) {
        const char *a = p + 2, *b = a;
        while (*b && *b != ')' && *b != '#' && *b != ' ') b++;
        if (b == a || !strncmp(a, "http://", 7) || !strncmp(a, "https://", 8)) continue;
        char path[512];
        snprintf(path, sizeof path, "%s%.*s", dir, (int)(b - a), a);
        CHECK(access(path, F_OK) == 0, "%s: the link %.*s does not resolve (%s)", md, (int)(b - a), a, path);
        links++;
    }
    int names = 0;
    for (const char *p = text; (p = strstr(p, ".md")) != NULL; p += 3) {
        const char *a = p;
        while (a > text && (isalnum((unsigned char)a[-1]) || a[-1] == '_' || a[-1] == '-' || a[-1] == '/' || a[-1] == '.')) a--;
        if (!memchr(a, '/', (size_t)(p - a))) continue;   // a bare name (README.md): not a path
        char path[512];
        snprintf(path, sizeof path, "%.*s", (int)(p + 3 - a), a);
        CHECK(access(path, F_OK) == 0, "%s names %s, which is not in the repository", md, path);
        names++;
    }
    fprintf(stderr, "test_cli: %s: %d links, %d document paths checked\n", md, links, names);
    arena_sys_free(text, len + 1);
}

static void test_docs(void) {
    check_doc("README.md", "");
    check_doc("format/PROTOCOL.md", "format/");
    check_doc("format/PLANES.md", "format/");
    check_doc("gpu/PERF.md", "gpu/");
}

int main(void) {
    snprintf(tdir, sizeof tdir, "/tmp/moet_test_cli.XXXXXX");
    MOET_ASSERT(mkdtemp(tdir), "mkdtemp");
    test_target_kinds();
    test_out_refused();
    test_synth_out();
    test_build_signals();
    test_flags();
    test_docs();
    if (access("./moet", X_OK) == 0) test_model_name();
    else CHECK(0, "./moet is missing: build it first (./build.sh)");
    rmdir(tdir);
    return check_report("test_cli");
}
