// tests/test_commands.c — every command as a user, a careless one or a hostile one meets it,
// through ./moet itself (a child process: main, its command table, signals and file descriptors
// as they really are).
//
// Part 1, the defects one by one: each case below failed before its fix.
// Part 2, the matrix over every command (moet_commands): output paths, interruption, stdout
// failures, flag values. The commands are listed once more in this file (cmd_cases); a command
// that main knows and this table does not is a failure, so a new command cannot skip the matrix.
#include "../moet.c"
#include "check.h"
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>

#define DEMO "tests/fixtures/demo"
#define PLANES "build/demo.planes"
#define TEXT "tests/fixtures/eval/text.jsonl"

static char tdir[64];   // scratch directory of this run
static void tpath(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tdir, name); }

static void write_text(const char *p, const char *s) {
    FILE *f = fopen(p, "w");
    MOET_ASSERT(f && fputs(s, f) >= 0 && fclose(f) == 0, "%s", p);
}

static mode_t lmode(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0 ? st.st_mode : 0;
}

// Names in dir that hold ".tmp" (a temporary file or directory left behind), plus, when
// `besides` is given, every entry but those listed in it (NULL-terminated).
static int leftovers(const char *dir, const char *const *besides) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *x;
    while (d && (x = readdir(d))) {
        if (!strcmp(x->d_name, ".") || !strcmp(x->d_name, "..")) continue;
        int listed = 0;
        for (int i = 0; besides && besides[i]; i++) listed |= !strcmp(besides[i], x->d_name);
        if (strstr(x->d_name, ".tmp") || (besides && !listed)) {
            fprintf(stderr, "test_commands: left in %s: %s\n", dir, x->d_name);
            n++;
        }
    }
    if (d) closedir(d);
    return n;
}

static void rm_rf(const char *p) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    MOET_ASSERT(system(cmd) == 0, "%s", cmd);
}

// ---- running ./moet ------------------------------------------------------------------------

enum { OUT_CAPTURE, OUT_FULL, OUT_CLOSED };

static char r_out[1 << 16], r_err[1 << 16];   // what the last run wrote

static void slurp(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, cap - 1) : 0;
    buf[n > 0 ? n : 0] = 0;
    if (fd >= 0) close(fd);
    unlink(path);
}

// Runs ./moet argv (NULL-terminated) with `in` on stdin (NULL: empty), stdout captured, to
// /dev/full or closed; stderr captured. Returns the wait status.
static int moet(char *const *argv, const char *in, int out_mode) {
    char pin[96], pout[96], perr[96];
    tpath(pin, sizeof pin, ".stdin");
    tpath(pout, sizeof pout, ".stdout");
    tpath(perr, sizeof perr, ".stderr");
    write_text(pin, in ? in : "");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    MOET_ASSERT(pid >= 0, "fork");
    if (pid == 0) {
        int fi = open(pin, O_RDONLY), fe = open(perr, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fi, 0);
        dup2(fe, 2);
        if (out_mode == OUT_CLOSED) close(1);
        else dup2(out_mode == OUT_FULL ? open("/dev/full", O_WRONLY) : open(pout, O_WRONLY | O_CREAT | O_TRUNC, 0600), 1);
        for (int fd = 3; fd < 64; fd++) close(fd);
        execv("./moet", argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (out_mode == OUT_CAPTURE) slurp(pout, r_out, sizeof r_out);
    else r_out[0] = 0;
    slurp(perr, r_err, sizeof r_err);
    unlink(pin);
    return st;
}

static int exited(int st, int code) { return WIFEXITED(st) && WEXITSTATUS(st) == code; }
static int lines_of(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

// ---- a run interrupted mid-way ---------------------------------------------------------------
//
// The child's stdout and stderr are pipes of one page, filled before it starts: every write it
// makes blocks until this process frees room, one byte a millisecond, and only while nothing has
// appeared in the watched directory. Once its output (a temporary file or directory) is there,
// no more room is made, so the command cannot finish before the signal comes: the signal lands
// mid-run, deterministically. Commands that write no file are signalled once they are blocked
// on their first output. SIGPIPE is what a reader going away gives: both pipes are closed.

static int pipe_full(int fds[2]) {
    MOET_ASSERT(pipe(fds) == 0, "pipe");
    fcntl(fds[1], F_SETPIPE_SZ, 4096);
    int fl = fcntl(fds[1], F_GETFL);
    fcntl(fds[1], F_SETFL, fl | O_NONBLOCK);
    char junk[4096];
    memset(junk, '#', sizeof junk);
    int n = 0;
    for (ssize_t k; (k = write(fds[1], junk, sizeof junk)) > 0 || (k < 0 && errno == EINTR);) n += k > 0 ? (int)k : 0;
    fcntl(fds[1], F_SETFL, fl);
    return n;
}

static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *x;
    while (d && (x = readdir(d))) n += strcmp(x->d_name, ".") && strcmp(x->d_name, "..");
    if (d) closedir(d);
    return n;
}

// Runs ./moet argv with `in` on a stdin pipe kept open, interrupts it with sig once something new
// is in `watch` (NULL: once it is blocked on its first output), lets it finish, returns the wait
// status. *appeared: whether the output had appeared when the signal was sent.
static int moet_interrupted(char *const *argv, const char *in, const char *watch, int sig, int *appeared) {
    int pi[2], po[2], pe[2];
    MOET_ASSERT(pipe(pi) == 0, "pipe");
    pipe_full(po);
    pipe_full(pe);
    int before = watch ? dir_entries(watch) : 0;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    MOET_ASSERT(pid >= 0, "fork");
    if (pid == 0) {
        dup2(pi[0], 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        for (int fd = 3; fd < 64; fd++) close(fd);
        execv("./moet", argv);
        _exit(127);
    }
    close(pi[0]);
    close(po[1]);
    close(pe[1]);
    if (in) MOET_ASSERT(write(pi[1], in, strlen(in)) == (ssize_t)strlen(in), "stdin");
    *appeared = 0;
    double t0 = moet_now();
    int st = 0, gone = 0;
    for (;;) {
        if (waitpid(pid, &st, WNOHANG) == pid) { gone = 1; break; }   // finished before the signal: a failed case
        if (watch && dir_entries(watch) > before) { *appeared = 1; break; }
        if (!watch && moet_now() - t0 > 0.05) break;
        if (moet_now() - t0 > 30) break;
        char c;
        if (watch && read(pe[0], &c, 1) < 0) break;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!gone) {
        if (sig == SIGPIPE) {
            close(po[0]);
            close(pe[0]);
            po[0] = pe[0] = -1;
        } else kill(pid, sig);
        close(pi[1]);   // the end of stdin (serve and tokenize finish what they read)
        pi[1] = -1;
        // drain the pipes (a command that handles the signal finishes its output), then wait
        char buf[4096];
        for (int open_fds = 2; open_fds && po[0] >= 0;) {
            struct pollfd p[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
            if (poll(p, 2, 30000) <= 0) break;
            open_fds = 0;
            for (int i = 0; i < 2; i++) {
                if (p[i].fd < 0) continue;
                if ((p[i].revents & (POLLIN | POLLHUP)) && read(p[i].fd, buf, sizeof buf) <= 0) {
                    close(p[i].fd);
                    if (i == 0) po[0] = -1; else pe[0] = -1;
                } else open_fds++;
            }
            if (po[0] < 0 && pe[0] >= 0) {   // stdout closed first: read stderr to its end
                while (read(pe[0], buf, sizeof buf) > 0) {}
                close(pe[0]);
                pe[0] = -1;
            }
        }
        waitpid(pid, &st, 0);
    }
    if (pi[1] >= 0) close(pi[1]);
    if (po[0] >= 0) close(po[0]);
    if (pe[0] >= 0) close(pe[0]);
    return gone ? -1 : st;
}

// =============================================================================================
// part 1: the defects, one by one
// =============================================================================================

// 1. eval --save-ref over a device node, a FIFO, a symbolic link: refused, left as it was.
static void test_save_ref_special(void) {
    char dev[96], fifo[96], link[96], target[96];
    tpath(dev, sizeof dev, "null.ref");
    tpath(fifo, sizeof fifo, "fifo.ref");
    tpath(link, sizeof link, "link.ref");
    tpath(target, sizeof target, "target.txt");
    write_text(target, "keep");
    int own_dev = mknod(dev, S_IFCHR | 0666, makedev(1, 3)) == 0;
    if (!own_dev) snprintf(dev, sizeof dev, "/dev/null");
    MOET_ASSERT(mkfifo(fifo, 0600) == 0 && symlink(target, link) == 0, "fixtures");
    const char *paths[3] = {dev, fifo, link}, *kinds[3] = {"a character device", "a FIFO", "a symbolic link"};
    for (int k = 0; k < 3; k++) {
        mode_t before = lmode(paths[k]);
        char *argv[] = {"moet", "eval", "-q", "--model", DEMO, "--data", TEXT, "--limit", "1", "--save-ref", (char *)paths[k], NULL};
        int st = moet(argv, NULL, OUT_CAPTURE);
        CHECK(exited(st, 1) && strstr(r_err, kinds[k]) && strstr(r_err, "--save-ref"), "eval --save-ref %s: status %#x: %s", kinds[k],
              st, r_err);
        CHECK(lmode(paths[k]) == before, "%s left as it was", kinds[k]);
    }
    FILE *f = fopen(target, "r");
    char b[16] = "";
    CHECK(f && fgets(b, sizeof b, f) && !strcmp(b, "keep"), "the link's target was not written");
    if (f) fclose(f);
    CHECK(leftovers(tdir, NULL) == 0, "no temporary file");
    if (own_dev) unlink(dev);
    unlink(fifo);
    unlink(link);
    unlink(target);
}

// 1 (continued). Interrupted while its output is being written, nothing is left: eval --save-ref
// (SIGHUP, and SIGPIPE as `moet eval … 2>&1 | head -1` gives it), synth --out DIR (every signal).
static void test_interrupted_outputs(void) {
    char work[96], ref[160], out[160];
    tpath(work, sizeof work, "sig");
    MOET_ASSERT(mkdir(work, 0700) == 0, "mkdir");
    snprintf(ref, sizeof ref, "%s/run.ref", work);
    snprintf(out, sizeof out, "%s/synth.out", work);
    const int sigs[] = {SIGHUP, SIGPIPE, SIGTERM, SIGINT};
    for (int k = 0; k < 4; k++) {
        char *eval[] = {"moet", "eval", "--model", DEMO, "--data", TEXT, "--backend", "cpu", "--save-ref", ref, NULL};
        int appeared, st = moet_interrupted(eval, NULL, work, sigs[k], &appeared);
        CHECK(appeared && st != -1 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && dir_entries(work) == 0,
              "eval --save-ref, signal %d: status %#x, %d entries left", sigs[k], st, dir_entries(work));
        leftovers(work, (const char *[]){NULL});
        rm_rf(work);
        mkdir(work, 0700);
        char *synth[] = {"moet", "synth", "--config", DEMO "/config.json", "--quant", DEMO "/hf_quant_config.json", "--out", out, NULL};
        st = moet_interrupted(synth, NULL, work, sigs[k], &appeared);
        CHECK(appeared && st != -1 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && dir_entries(work) == 0,
              "synth --out, signal %d: status %#x, %d entries left", sigs[k], st, dir_entries(work));
        leftovers(work, (const char *[]){NULL});
        rm_rf(work);
        mkdir(work, 0700);
    }
    rmdir(work);
}

// 2. An empty output path is refused before any work, the flag named.
static void test_empty_out(void) {
    char *run[] = {"moet", "run", "--model", DEMO, "--ids", "1,2,3", "--out", "", NULL};
    char *build[] = {"moet", "build-planes", "--model", DEMO, "--out", "", NULL};
    char *eval[] = {"moet", "eval", "--model", DEMO, "--data", TEXT, "--save-ref", "", NULL};
    char *synth[] = {"moet", "synth", "--config", DEMO "/config.json", "--out", "", NULL};
    char *const *all[4] = {run, build, eval, synth};
    const char *flag[4] = {"--out", "--out", "--save-ref", "--out"};
    for (int k = 0; k < 4; k++) {
        int st = moet(all[k], NULL, OUT_CAPTURE);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0 && strstr(r_err, flag[k]) && strstr(r_err, "empty") && lines_of(r_err) == 1,
              "moet %s %s '': status %#x: %s", all[k][1], flag[k], st, r_err);
    }
    CHECK(leftovers(tdir, NULL) == 0, "nothing written");
}

// 3. A failed write to stdout is an error (exit 1), in every command that writes one.
static void test_stdout_fails(void) {
    char *tokenize[] = {"moet", "tokenize", "--tokenizer", DEMO, NULL};
    char *info[] = {"moet", "info", PLANES, NULL};
    char *eval[] = {"moet", "eval", "-q", "--model", DEMO, "--data", TEXT, "--limit", "1", "--backend", "cpu", NULL};
    char *bench[] = {"moet", "bench", "--model", DEMO, "--backend", "cpu", "--batch", "1", "--prompt", "4", "--gen", "3", NULL};
    char *const *all[4] = {tokenize, info, eval, bench};
    for (int k = 0; k < 4; k++)
        for (int mode = OUT_FULL; mode <= OUT_CLOSED; mode++) {
            int st = moet(all[k], "\"hello\"\n", mode);
            CHECK(exited(st, 1) && strstr(r_err, "stdout"), "moet %s with stdout %s: status %#x: %s", all[k][1],
                  mode == OUT_FULL ? "on /dev/full" : "closed", st, r_err);
        }
}

// 4. eval and bench name the model as serve does: the directory's name, or ORG/NAME.
static void test_model_name(void) {
    char snap[256], cmd[MOET_MAX_PATH + 1024], cwd[MOET_MAX_PATH];
    MOET_ASSERT(getcwd(cwd, sizeof cwd), "getcwd");
    snprintf(snap, sizeof snap, "%s/models--Org--Demo/snapshots/0123456789abcdef0123456789abcdef01234567", tdir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/models--Org--Demo/snapshots' && ln -s '%s/" DEMO "' '%s'", tdir, cwd, snap);
    MOET_ASSERT(system(cmd) == 0, "snapshot fixture");
    char slash[300];
    snprintf(slash, sizeof slash, "%s/", snap);
    const char *models[3] = {DEMO "/", DEMO "/.", slash}, *want[3] = {"\"model\":\"demo\"", "\"model\":\"demo\"", "\"model\":\"Org/Demo\""};
    for (int k = 0; k < 3; k++) {
        char *eval[] = {"moet", "eval", "-q", "--model", (char *)models[k], "--data", TEXT, "--limit", "1", "--backend", "cpu", NULL};
        int st = moet(eval, NULL, OUT_CAPTURE);
        CHECK(exited(st, 0) && strstr(r_out, want[k]), "eval --model %s: %s%s", models[k], r_out, r_err);
        char *bench[] = {"moet", "bench", "--model", (char *)models[k], "--backend", "cpu", "--batch", "1", "--prompt", "4", "--gen", "3", NULL};
        st = moet(bench, NULL, OUT_CAPTURE);
        CHECK(exited(st, 0) && strstr(r_out, want[k]), "bench --model %s: %s%s", models[k], r_out, r_err);
    }
    snprintf(cmd, sizeof cmd, "%s/models--Org--Demo", tdir);
    rm_rf(cmd);
}

// 5. A UTF-8 byte order mark at the start of a line is skipped by every line reader.
static void test_bom(void) {
    char *tkz[] = {"moet", "tokenize", "--tokenizer", DEMO, NULL};
    int st = moet(tkz, "\"hello\"\n\xEF\xBB\xBF\"hello\"\n", OUT_CAPTURE);
    char *nl = strchr(r_out, '\n');
    CHECK(exited(st, 0) && nl && !strncmp(r_out, nl + 1, (size_t)(nl - r_out)), "tokenize with a BOM: %s%s", r_out, r_err);
    char data[96];
    tpath(data, sizeof data, "bom.jsonl");
    write_text(data, "\xEF\xBB\xBF{\"text\": \"Return the first item of a list.\"}\n\xEF\xBB\xBF{\"text\": \"Count the words.\"}\r\n");
    char *eval[] = {"moet", "eval", "-q", "--model", DEMO, "--data", data, "--backend", "cpu", NULL};
    st = moet(eval, NULL, OUT_CAPTURE);
    CHECK(exited(st, 0) && strstr(r_out, "\"lines\":2"), "eval --data with BOMs: %s%s", r_out, r_err);
    unlink(data);
}

// 6. Numbers. Request fields (proto_parse) and flags (--ids).
static js_node pn[4096];
static char ps[1 << 16];
static int parse_req(const char *json, proto_req *q, proto_error *pe) {
    js_doc d = {0};
    d.nodes = pn;
    d.cap_nodes = 4096;
    d.strs = ps;
    d.cap_strs = sizeof ps;
    MOET_ASSERT(js_parse(&d, json, strlen(json)) == 0, "%s: %s", json, d.err);
    static js_doc keep;
    keep = d;
    proto_limits lim = {{1, 0, 1, 0, 0, 0, 1}, 4096, 20, 0};
    memset(pe, 0, sizeof *pe);
    return proto_parse(&keep, &lim, "req-1", q, pe);
}

static void test_numbers(void) {
    proto_req q;
    proto_error pe;
    // seeds: exact over the whole 64-bit range, 2^64 - 1 and 2^64 - 2 differ
    struct { const char *json; uint64_t seed; } ok[] = {
        {"{\"prompt\":\"x\",\"seed\":18446744073709551615}", UINT64_MAX},
        {"{\"prompt\":\"x\",\"seed\":18446744073709551614}", UINT64_MAX - 1},
        {"{\"prompt\":\"x\",\"seed\":9223372036854775808}", 9223372036854775808ull},
        {"{\"prompt\":\"x\",\"seed\":9223372036854775809}", 9223372036854775809ull},
        {"{\"prompt\":\"x\",\"seed\":-1}", UINT64_MAX},
        {"{\"prompt\":\"x\",\"seed\":1.8446744073709551615e19}", UINT64_MAX},
        {"{\"prompt\":\"x\",\"seed\":7}", 7},
    };
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
        int rc = parse_req(ok[k].json, &q, &pe);
        CHECK(rc == 0 && q.has_seed && q.seed == ok[k].seed, "%s: rc %d seed %" PRIu64 " (%s)", ok[k].json, rc, q.seed, pe.e.msg);
    }
    // refused: out of range or not an integer (invalid_value), not a number (invalid_type)
    struct { const char *json, *code; } bad[] = {
        {"{\"prompt\":\"x\",\"seed\":18446744073709551616}", "invalid_value"},
        {"{\"prompt\":\"x\",\"seed\":1.5}", "invalid_value"},
        {"{\"prompt\":\"x\",\"seed\":-9223372036854775809}", "invalid_value"},
        {"{\"prompt\":\"x\",\"seed\":\"7\"}", "invalid_type"},
        {"{\"prompt\":\"x\",\"max_tokens\":0}", "invalid_value"},
        {"{\"prompt\":\"x\",\"max_tokens\":10000000000000000000.5}", "invalid_value"},
        {"{\"prompt\":\"x\",\"max_tokens\":2.5}", "invalid_value"},
        {"{\"prompt\":\"x\",\"max_tokens\":-99999999999999999999}", "invalid_value"},
        {"{\"prompt\":\"x\",\"logprobs\":1e300}", "invalid_value"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":1e20}", "invalid_value"},
        {"{\"prompt\":\"x\",\"n\":\"two\"}", "invalid_type"},
        {"{\"prompt\":\"x\",\"top_k\":-2}", "invalid_value"},
        {"{\"prompt\":\"x\",\"top_k\":0.5}", "invalid_value"},
        {"{\"input_ids\":[1,5.0000000000000001]}", "invalid_value"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int rc = parse_req(bad[k].json, &q, &pe);
        CHECK(rc != 0 && pe.code && !strcmp(pe.code, bad[k].code), "%s: rc %d, code %s (want %s): %s", bad[k].json, rc,
              pe.code ? pe.code : "-", bad[k].code, pe.e.msg);
    }
    // top_k above the vocabulary keeps all, whatever its size; max_tokens above 2^31 - 1 is the context
    const char *topk[] = {"{\"prompt\":\"x\",\"top_k\":5000}", "{\"prompt\":\"x\",\"top_k\":10000000000}",
                          "{\"prompt\":\"x\",\"top_k\":18446744073709551615}", "{\"prompt\":\"x\",\"top_k\":1e30}"};
    for (size_t k = 0; k < sizeof topk / sizeof topk[0]; k++) {
        int rc = parse_req(topk[k], &q, &pe);
        CHECK(rc == 0 && q.sp.top_k == 0, "%s: rc %d top_k %d: %s", topk[k], rc, q.sp.top_k, pe.e.msg);
    }
    CHECK(parse_req("{\"prompt\":\"x\",\"max_tokens\":10000000000}", &q, &pe) == 0 && q.max_tokens == INT32_MAX, "%s", pe.e.msg);
    CHECK(parse_req("{\"prompt\":\"x\",\"max_tokens\":1e30}", &q, &pe) == 0 && q.max_tokens == INT32_MAX, "%s", pe.e.msg);
    CHECK(parse_req("{\"prompt\":\"x\",\"max_tokens\":5.0}", &q, &pe) == 0 && q.max_tokens == 5, "%s", pe.e.msg);
    // --ids with an empty item
    const char *ids[] = {"1,,2", "1,", ",1", "1, ,2", "1,2,,"};
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        char *argv[] = {"moet", "run", "--model", DEMO, "--backend", "cpu", "--ids", (char *)ids[k], NULL};
        int st = moet(argv, NULL, OUT_CAPTURE);
        CHECK(exited(st, 2) && strstr(r_err, "--ids") && strstr(r_err, "empty"), "run --ids '%s': status %#x: %s", ids[k], st, r_err);
    }
    char *good[] = {"moet", "run", "--model", DEMO, "--backend", "cpu", "--ids", "1, 2,3", NULL};
    CHECK(exited(moet(good, NULL, OUT_CAPTURE), 0), "run --ids '1, 2,3': %s", r_err);
}

// 7. Tool-call arguments: an object, or a JSON string that holds one; anything else is refused.
static void test_tool_arguments(void) {
    static char strs[1 << 14], scratch[1 << 14], aout[1 << 14], astrs[1 << 14];
    static js_node nodes[1024], anodes[1024];
    const char *bad[] = {"[1,2]", "7", "\"[1,2]\"", "\"7\"", "\"\\\"text\\\"\"", "null", "true", "\"\""};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0] + 2; k++) {
        char json[512];
        const char *args = k < sizeof bad / sizeof bad[0] ? bad[k] : k == sizeof bad / sizeof bad[0] ? "{\"a\":1}" : "\"{\\\"a\\\":1}\"";
        snprintf(json, sizeof json,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
                 "{\"name\":\"f\",\"arguments\":%s}}]}]}", args);
        js_doc d = {0};
        d.nodes = nodes;
        d.cap_nodes = 1024;
        d.strs = strs;
        d.cap_strs = sizeof strs;
        MOET_ASSERT(js_parse(&d, json, strlen(json)) == 0, "%s", d.err);
        chat_mem mem = {scratch, sizeof scratch, {0}};
        mem.args.nodes = anodes;
        mem.args.cap_nodes = 1024;
        mem.args.strs = astrs;
        mem.args.cap_strs = sizeof astrs;
        chat_opts o = {0, 0};
        size_t len;
        moet_err e = {{0}};
        int rc = chat_render(&d, js_get(&d, js_root(&d), "messages"), NULL, &o, &mem, aout, sizeof aout, &len, &e);
        if (k < sizeof bad / sizeof bad[0])
            CHECK(rc == -1 && strstr(e.msg, "arguments") && strstr(e.msg, "object"), "arguments %s: rc %d: %s", args, rc, e.msg);
        else CHECK(rc == 0 && memmem(aout, len, "<parameter=a>\n1\n</parameter>", 28), "arguments %s: %s", args, e.msg);
    }
}

// 8. Messages name the thing at fault.
static void test_messages(void) {
    char *info[] = {"moet", "info", PLANES, "--bogus", NULL};
    int st = moet(info, NULL, OUT_CAPTURE);
    CHECK(exited(st, 2) && strstr(r_err, "--bogus"), "info FILE --bogus: %s", r_err);
    char *bench[] = {"moet", "bench", "--model", DEMO, "--batch", "", NULL};
    st = moet(bench, NULL, OUT_CAPTURE);
    CHECK(exited(st, 2) && strstr(r_err, "--batch") && !strstr(r_err, "engine"), "bench --batch '': %s", r_err);
}

// =============================================================================================

int main(void) {
    snprintf(tdir, sizeof tdir, "/tmp/moet_test_commands.XXXXXX");
    MOET_ASSERT(mkdtemp(tdir), "mkdtemp");
    if (access("./moet", X_OK) != 0 || access(PLANES, R_OK) != 0) {
        CHECK(0, "./moet or " PLANES " is missing: run ./build.sh first");
        return check_report("test_commands");
    }
    test_save_ref_special();
    test_interrupted_outputs();
    test_empty_out();
    test_stdout_fails();
    test_model_name();
    test_bom();
    test_numbers();
    test_tool_arguments();
    test_messages();
    rm_rf(tdir);
    return check_report("test_commands");
}
