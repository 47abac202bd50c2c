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

// The program under test: ./moet, or $MOET_BIN (a sanitizer build of the same source).
static const char *moet_bin = "./moet";

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
        execv(moet_bin, argv);
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
// The child's stdout and stderr are pipes of one page, filled before it starts: its first write
// to either blocks, and nothing is read until the signal is sent. Every command that writes a
// file makes its output (the temporary file or directory) before it writes a line, so the run
// is signalled once that output is in the watched directory, and it cannot have finished: the
// signal lands mid-run, deterministically. Commands that write no file are signalled once they
// are blocked on their first output. SIGPIPE is what a reader going away gives: both pipes are
// closed.

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
        execv(moet_bin, argv);
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
        if (moet_now() - t0 > 10) break;   // the output never appeared: a failed case
        struct timespec ts = {0, 200 * 1000};
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

// moet bench's line: each batch's time per output token as a median and a 99th percentile of
// the timed steps (nearest rank), p50 <= mean-consistent <= p99, on the CPU backend.
// Runs moet bench ARGV and loads its result line into d: its "results" array (d to be freed), or
// NULL (a failed check said why; nothing to free).
static const js_node *bench_results(char *const *argv, js_doc *d, const char **line) {
    int st = moet(argv, NULL, OUT_CAPTURE);
    moet_err e = {{0}};
    *line = strstr(r_out, "{\"object\":\"bench\"");
    if (!exited(st, 0) || !*line || js_load_doc(d, *line, strcspn(*line, "\n"), "bench line", &e)) {
        CHECK(0, "moet bench %s: exit %d, %s%s %s", argv[4], st, r_out, r_err, e.msg);
        return NULL;
    }
    const js_node *res = js_get(d, js_root(d), "results");
    if (res && res->type == JS_ARR) return res;
    CHECK(0, "moet bench: no results array: %s", *line);
    js_free_doc(d);
    return NULL;
}

static void test_bench_line(void) {
    char *bench[] = {"moet", "bench", "--model", DEMO, "--backend", "cpu", "--batch", "1,2", "--prompt", "4", "--gen", "12", NULL};
    js_doc d;
    const char *line;
    const js_node *res = bench_results(bench, &d, &line);
    if (!res) return;
    int n = 0, ok = 1;
    for (const js_node *r = js_first(res); ok && n < (int)res->len; r = js_next(&d, r), n++) {
        double mean = NAN, p50 = NAN, p99 = NAN, launch = NAN, dlo = NAN, dhi = NAN;
        ok &= js_num(js_get(&d, r, "step_ms"), &mean) == 0 && js_num(js_get(&d, r, "step_ms_p50"), &p50) == 0 &&
              js_num(js_get(&d, r, "step_ms_p99"), &p99) == 0 && js_num(js_get(&d, r, "launch_ms"), &launch) == 0 &&
              js_num(js_get(&d, r, "depth"), &dlo) == 0 && js_num(js_get(&d, r, "depth_max"), &dhi) == 0;
        ok &= p50 > 0 && p50 <= p99 && mean <= p99 * (1 + 1e-9) && p50 <= mean * 10;
        ok &= dlo == 4 && dhi == 4;   // the timed steps start after the prompt (no --depth)
        // queueing is part of the step (the CPU reference computes the step inside launch: most of it)
        ok &= launch >= 0 && launch <= mean * (1 + 1e-9);
    }
    CHECK(ok && n == 2, "moet bench: step_ms_p50, step_ms_p99, launch_ms and the depth 4 for each batch: %s", line);
    js_free_doc(&d);
    // two steps are the warm-up alone: nothing would be timed, so fewer than three are refused
    char *two[] = {"moet", "bench", "--model", DEMO, "--backend", "cpu", "--batch", "1", "--prompt", "4", "--gen", "2", NULL};
    int st = moet(two, NULL, OUT_CAPTURE);
    CHECK(exited(st, 2) && strstr(r_err, "--gen") && !strstr(r_out, "\"bench\""), "moet bench --gen 2: status %#x, %s", st, r_err);
}

// moet bench --speculative-tokens 3 with the demo's MTP head (--mtp, the CPU reference): each
// batch's line says the drafts of its timed steps — 3 a sequence every step (the reserve and the
// step hold them all), accepted ones fewer — and the tokens a sequence per step they make:
// 1 + accepted / (batch · steps); the decode rate counts them. With auto, the controller's choice
// and its measures. Without a head the flag is refused.
static void test_bench_spec(void) {
    char *bench[] = {"moet", "bench", "--model", DEMO, "--backend", "cpu", "--batch", "1,2", "--prompt", "8", "--gen", "12",
                     "--mtp", "tests/fixtures/demo_mtp/mtp.safetensors", "--speculative-tokens", "3", NULL};
    js_doc d;
    const char *line;
    const js_node *res = bench_results(bench, &d, &line);
    if (res) {
        int n = 0, ok = 1, timed = 12 - 2;
        double acc_all = 0;
        for (const js_node *r = js_first(res); ok && n < (int)res->len; r = js_next(&d, r), n++) {
            const js_node *sp = js_get(&d, r, "speculation");
            double B = NAN, k = NAN, dr = NAN, ac = NAN, tps = NAN, step = NAN, rate = NAN;
            ok &= sp && js_num(js_get(&d, r, "batch"), &B) == 0 && js_num(js_get(&d, sp, "draft_tokens"), &k) == 0 &&
                  js_num(js_get(&d, sp, "drafted"), &dr) == 0 && js_num(js_get(&d, sp, "accepted"), &ac) == 0 &&
                  js_num(js_get(&d, sp, "tokens_per_step"), &tps) == 0 && js_num(js_get(&d, r, "step_ms"), &step) == 0 &&
                  js_num(js_get(&d, r, "decode_tok_s"), &rate) == 0;
            ok &= k == 3 && dr == 3 * B * timed && ac >= 0 && ac <= dr && fabs(tps - (1 + ac / (B * timed))) < 1e-3;
            ok &= fabs(rate - B * tps / (step / 1e3)) <= 0.02 * rate + 0.1;   // tokens per second: batch × tokens per step / step
            acc_all += ac;
        }
        CHECK(ok && n == 2 && acc_all > 0, "moet bench --speculative-tokens 3: drafted, accepted, tokens_per_step per batch: %s", line);
        js_free_doc(&d);
    }
    // auto: the server's controller; its first probes run before the timed steps, so every k has
    // a measure, and the choice is the controller's rule over them (JSON rounds to 0.1 tok/s)
    char *aut[] = {"moet", "bench", "--model", DEMO, "--backend", "cpu", "--batch", "1,2", "--prompt", "8", "--gen", "12",
                   "--mtp", "tests/fixtures/demo_mtp/mtp.safetensors", "--speculative-tokens", "auto", NULL};
    res = bench_results(aut, &d, &line);
    if (res) {
        int n = 0, ok = 1, timed = 12 - 2;
        for (const js_node *r = js_first(res); ok && n < (int)res->len; r = js_next(&d, r), n++) {
            const js_node *sp = js_get(&d, r, "speculation"), *kt = sp ? js_get(&d, sp, "draft_tokens") : NULL,
                          *arr = sp ? js_get(&d, sp, "auto_tok_s") : NULL;
            double B = NAN, ch = NAN, dr = NAN, ac = NAN, t[5] = {NAN, NAN, NAN, NAN, NAN};
            ok &= sp && kt && js_str_is(kt, "auto") && js_num(js_get(&d, r, "batch"), &B) == 0 &&
                  js_num(js_get(&d, sp, "auto_choice"), &ch) == 0 && js_num(js_get(&d, sp, "drafted"), &dr) == 0 &&
                  js_num(js_get(&d, sp, "accepted"), &ac) == 0 && arr && arr->type == JS_ARR && arr->len == 5;
            if (!ok) break;
            int i = 0;
            for (const js_node *x = js_first(arr); i < 5; x = js_next(&d, x), i++) ok &= js_num(x, &t[i]) == 0 && t[i] > 0;
            ok &= ch >= 0 && ch <= 4 && ch == (int)ch && dr >= 0 && dr <= 4 * B * timed && ac >= 0 && ac <= dr;
            if (!ok) break;
            int c = (int)ch;
            for (int k = 0; k < 5; k++) {
                if (c == 0) ok &= t[k] <= SPEC_MARGIN * t[0] + 0.1;
                else ok &= t[c] >= t[k] - 0.1 && t[c] >= SPEC_MARGIN * t[0] - 0.1;
            }
        }
        CHECK(ok && n == 2, "moet bench --speculative-tokens auto: the choice and the tok/s measured for 0..4 drafts: %s", line);
        js_free_doc(&d);
    }
    // auto's probes (40 steps, each at least a token a sequence) come before the fill to --depth:
    // without it the timed steps start past the prompt by what the probes emitted (and say so);
    // with --depth 260 (past the 8 + 40 · 5 the probes can reach) exactly at 260, as without drafts
    for (int dp = 0; dp < 2; dp++) {
        char *ad[] = {"moet", "bench", "--model", DEMO, "--backend", "cpu", "--batch", "1,2", "--prompt", "8", "--gen", "4",
                      "--mtp", "tests/fixtures/demo_mtp/mtp.safetensors", "--speculative-tokens", "auto", dp ? "--depth" : NULL, "260", NULL};
        res = bench_results(ad, &d, &line);
        if (!res) continue;
        int n = 0, ok = 1;
        for (const js_node *r = js_first(res); ok && n < (int)res->len; r = js_next(&d, r), n++) {
            double lo = NAN, hi = NAN;
            ok &= js_num(js_get(&d, r, "depth"), &lo) == 0 && js_num(js_get(&d, r, "depth_max"), &hi) == 0;
            ok &= dp ? lo == 260 && hi == 260 : lo >= 8 + 40 && hi >= lo && hi <= 8 + 40 * 5;
        }
        CHECK(ok && n == 2, "moet bench --speculative-tokens auto%s: the depth the timed steps start at: %s", dp ? " --depth 260" : "", line);
        js_free_doc(&d);
    }
    char *nohead[] = {"moet", "bench", "--model", DEMO, "--backend", "cpu", "--batch", "1", "--prompt", "4", "--gen", "3",
                      "--speculative-tokens", "2", NULL};
    int st = moet(nohead, NULL, OUT_CAPTURE);
    CHECK(!exited(st, 0) && strstr(r_err, "multi-token-prediction head") && !strstr(r_out, "\"bench\""),
          "moet bench --speculative-tokens without a head: refused, no result line (exit %d): %s", st, r_err);
}

// moet bench --expert-cache-gb (the CPU reference reading a quarter of the demo's 64 slots): each
// batch's line holds the cache over its timed steps, and its bytes are its reads (the steps'
// misses and the prefetch thread's) times one slot's bytes, the same slot size in every batch;
// without the flag no expert_cache; the flag without --planes is a usage error (bench, serve, run);
// --profile on the CPU reference is refused (it has no kernels to time).
static void test_bench_cache(void) {
    char *bench[] = {"moet", "bench", "--model", DEMO, "--planes", PLANES, "--backend", "cpu", "--batch", "1,2", "--prompt", "4", "--gen", "6",
                     "--expert-cache-gb", "0.000428", NULL};   // 16 of the demo's 64 slots of 28,672 bytes
    js_doc d;
    const char *line;
    const js_node *res = bench_results(bench, &d, &line);
    if (!res) return;
    int n = 0, ok = 1;
    double slot = 0;
    for (const js_node *r = js_first(res); ok && n < (int)res->len; r = js_next(&d, r), n++) {
        const js_node *x = js_get(&d, r, "expert_cache");
        double pool = 0, file = 0, hits = 0, misses = 0, bytes = 0, gbs = -1, wait = -1, pre = 0;
        ok &= x && js_num(js_get(&d, x, "pool_slots"), &pool) == 0 && js_num(js_get(&d, x, "file_slots"), &file) == 0 &&
              js_num(js_get(&d, x, "hits"), &hits) == 0 && js_num(js_get(&d, x, "misses"), &misses) == 0 &&
              js_num(js_get(&d, x, "bytes_read"), &bytes) == 0 && js_num(js_get(&d, x, "read_gbs"), &gbs) == 0 &&
              js_num(js_get(&d, x, "wait_ms_per_step"), &wait) == 0 && js_num(js_get(&d, x, "prefetched"), &pre) == 0;
        ok &= pool == 16 && file == 64 && hits + misses > 0 && gbs >= 0 && wait >= 0 && (bytes > 0) == (gbs > 0);
        if (ok && misses + pre > 0) {
            double s1 = bytes / (misses + pre);
            ok &= s1 == floor(s1) && s1 > 0 && s1 <= 28672 && (slot == 0 || s1 == slot);
            slot = s1;
        }
    }
    CHECK(ok && n == 2, "moet bench --expert-cache-gb: each batch's expert_cache: %s", line);
    js_free_doc(&d);
    char *plain[] = {"moet", "bench", "--model", DEMO, "--planes", PLANES, "--backend", "cpu", "--batch", "1", "--prompt", "4", "--gen", "3", NULL};
    int st = moet(plain, NULL, OUT_CAPTURE);
    CHECK(exited(st, 0) && strstr(r_out, "\"object\":\"bench\"") && !strstr(r_out, "expert_cache"), "moet bench without a cache: %s%s", r_out,
          r_err);
    char *nb[] = {"moet", "bench", "--model", DEMO, "--backend", "cpu", "--expert-cache-gb", "1", NULL};
    char *ns[] = {"moet", "serve", "--model", DEMO, "--backend", "cpu", "--expert-cache-gb", "1", NULL};
    char *nr[] = {"moet", "run", "--model", DEMO, "--backend", "cpu", "--ids", "1,2", "--expert-cache-gb", "1", NULL};
    char *pr[] = {"moet", "bench", "--model", DEMO, "--backend", "cpu", "--profile", "--batch", "1", "--prompt", "4", "--gen", "3", NULL};
    st = moet(pr, NULL, OUT_CAPTURE);
    CHECK(exited(st, 2) && strstr(r_err, "--profile times the GPU's kernels") && !strstr(r_out, "\"object\""),
          "moet bench --profile on the CPU: %#x %s%s", st, r_out, r_err);
    char *const *no[3] = {nb, ns, nr};
    for (int k = 0; k < 3; k++) {
        st = moet(no[k], "", OUT_CAPTURE);
        CHECK(exited(st, 2) && strstr(r_err, "--expert-cache-gb needs --planes"), "moet %s --expert-cache-gb without --planes: %#x %s", no[k][1], st,
              r_err);
    }
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
    // the exact value of a JSON number, from its text
    struct { const char *text; int whole; int64_t i; uint64_t u; } nums[] = {
        {"1e3", JS_WHOLE_I64, 1000, 0}, {"1.5e1", JS_WHOLE_I64, 15, 0}, {"12.30e1", JS_WHOLE_I64, 123, 0},
        {"-0", JS_WHOLE_I64, 0, 0}, {"0.0e999999", JS_WHOLE_I64, 0, 0}, {"1.23e1", JS_FRACTION, 0, 0},
        {"5.0000000000000001", JS_FRACTION, 0, 0}, {"-9223372036854775808", JS_WHOLE_I64, INT64_MIN, 0},
        {"-9223372036854775809", JS_WHOLE_BIG, 0, 0}, {"9223372036854775808", JS_WHOLE_U64, 0, 9223372036854775808ull},
        {"1e19", JS_WHOLE_U64, 0, 10000000000000000000ull}, {"18446744073709551615", JS_WHOLE_U64, 0, UINT64_MAX},
        {"18446744073709551616", JS_WHOLE_BIG, 0, 0}, {"1e20", JS_WHOLE_BIG, 0, 0}, {"1e-999999", JS_FRACTION, 0, 0},
    };
    for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
        js_doc d = {0};
        d.nodes = pn;
        d.cap_nodes = 16;
        d.strs = ps;
        d.cap_strs = sizeof ps;
        int rc = js_parse(&d, nums[k].text, strlen(nums[k].text));
        const js_node *n = js_root(&d);
        CHECK(rc == 0 && n->whole == nums[k].whole && (n->whole != JS_WHOLE_I64 || n->i64 == nums[k].i) &&
                  (n->whole != JS_WHOLE_U64 || n->u64 == nums[k].u),
              "%s: whole %d", nums[k].text, rc == 0 ? n->whole : -1);
    }
    // two seeds near 2^64 are two generators: the server samples differently with each
    char *serve[] = {"moet", "serve", "--model", DEMO, "--backend", "cpu", NULL};
    int st = moet(serve, "{\"id\":\"a\",\"prompt\":\"def f(x):\",\"max_tokens\":24,\"temperature\":1.5,\"ignore_eos\":true,"
                         "\"return_token_ids\":true,\"seed\":18446744073709551615}\n"
                         "{\"id\":\"b\",\"prompt\":\"def f(x):\",\"max_tokens\":24,\"temperature\":1.5,\"ignore_eos\":true,"
                         "\"return_token_ids\":true,\"seed\":18446744073709551614}\n",
                   OUT_CAPTURE);
    const char *a = strstr(r_out, "\"id\":\"a\""), *b = strstr(r_out, "\"id\":\"b\"");
    const char *ta = a ? strstr(a, "\"token_ids\"") : NULL, *tb = b ? strstr(b, "\"token_ids\"") : NULL;
    CHECK(exited(st, 0) && ta && tb && strncmp(ta, tb, (size_t)(strchr(ta, ']') - ta)) != 0, "seeds 2^64-1 and 2^64-2: %s%s", r_out,
          r_err);
    // --ids with an empty item
    const char *ids[] = {"1,,2", "1,", ",1", "1, ,2", "1,2,,"};
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        char *argv[] = {"moet", "run", "--model", DEMO, "--backend", "cpu", "--ids", (char *)ids[k], NULL};
        int sti = moet(argv, NULL, OUT_CAPTURE);
        CHECK(exited(sti, 2) && strstr(r_err, "--ids") && strstr(r_err, "empty"), "run --ids '%s': status %#x: %s", ids[k], sti, r_err);
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
// part 2: the matrix over every command
// =============================================================================================
//
// Each command once more, with what the matrix needs to run it. "@W" in an argument is the
// watched scratch directory of the run. A command main knows and this table does not, or the
// other way round, is a failure: a new command cannot go untested.

#define MAXA 24
typedef struct {
    const char *name;
    const char *base[MAXA];   // a good command line after `moet NAME` (flags are varied on it)
    const char *in;           // its stdin
    const char *out[MAXA];    // a run whose result is on stdout ({NULL}: none, --help only)
    const char *sig[MAXA];    // the run interrupted mid-way
    int sig_writes;           // ... writes its output into @W (a temporary appears there first)
    int graceful;             // SIGTERM and SIGINT end it with status 0 after finishing (serve, documented)
} cmd_case;

static const cmd_case cmd_cases[] = {
    {"run", {"--model", DEMO, "--ids", "1,2,3", "--backend", "cpu"}, NULL, {NULL},
     {"--model", DEMO, "--ids", "1,2,3", "--backend", "cpu", "--greedy", "4", "--out", "@W/run.safetensors"}, 1, 0},
    {"serve", {"--model", DEMO, "--backend", "cpu"}, "{\"prompt\":\"def\",\"max_tokens\":2}\n",
     {"--model", DEMO, "--backend", "cpu"}, {"--model", DEMO, "--backend", "cpu"}, 0, 1},
    {"eval", {"--model", DEMO, "--data", TEXT, "--backend", "cpu", "-q", "--limit", "1"}, NULL,
     {"--model", DEMO, "--data", TEXT, "--backend", "cpu", "-q", "--limit", "1"},
     {"--model", DEMO, "--data", TEXT, "--backend", "cpu", "--save-ref", "@W/run.ref"}, 1, 0},
    {"build-planes", {"--model", DEMO, "--out", "@W/demo.planes"}, NULL, {"--model", DEMO, "--plan"},
     {"--model", DEMO, "--out", "@W/demo.planes", "--threads", "1"}, 1, 0},
    {"verify", {PLANES}, NULL, {NULL}, {PLANES}, 0, 0},
    {"info", {PLANES}, NULL, {PLANES}, {PLANES}, 0, 0},
    {"bench", {"--model", DEMO, "--backend", "cpu", "--batch", "1", "--prompt", "4", "--gen", "3"}, NULL,
     {"--model", DEMO, "--backend", "cpu", "--batch", "1", "--prompt", "4", "--gen", "3"},
     {"--model", DEMO, "--backend", "cpu", "--batch", "1", "--prompt", "4", "--gen", "3"}, 0, 0},
    {"synth", {"--config", DEMO "/config.json", "--out", "@W/synth"}, NULL, {NULL},
     {"--config", DEMO "/config.json", "--quant", DEMO "/hf_quant_config.json", "--out", "@W/synth"}, 1, 0},
    {"tokenize", {"--tokenizer", DEMO}, "\"hello\"\n", {"--tokenizer", DEMO}, {"--tokenizer", DEMO}, 0, 0},
};
#define N_CASES ((int)(sizeof cmd_cases / sizeof cmd_cases[0]))

static char mx_args[MAXA + 8][6000];   // the argument texts of one run
static char *mx_argv[MAXA + 10];

// argv of `moet NAME args...` with "@W" replaced by w; extra arguments appended after.
static char **mx_build(const char *name, const char *const *args, const char *w, const char *const *extra) {
    int n = 0;
    mx_argv[n++] = "moet";
    mx_argv[n++] = (char *)name;
    for (int pass = 0; pass < 2; pass++)
        for (const char *const *a = pass ? extra : args; a && *a; a++) {
            const char *at = strstr(*a, "@W");
            if (at) snprintf(mx_args[n], sizeof mx_args[n], "%.*s%s%s", (int)(at - *a), *a, w, at + 2);
            else snprintf(mx_args[n], sizeof mx_args[n], "%s", *a);
            mx_argv[n] = mx_args[n];
            n++;
        }
    mx_argv[n] = NULL;
    return mx_argv;
}

static const moet_command *find_command(const char *name) {
    for (int i = 0; i < MOET_N_COMMANDS; i++)
        if (!strcmp(moet_commands[i].name, name)) return &moet_commands[i];
    return NULL;
}

// Every command main runs has a case here, and every case is a command.
static void test_table_complete(void) {
    for (int i = 0; i < MOET_N_COMMANDS; i++) {
        int found = 0;
        for (int k = 0; k < N_CASES; k++) found |= !strcmp(cmd_cases[k].name, moet_commands[i].name);
        CHECK(found, "command '%s' is in moet_commands but not in this matrix (cmd_cases): add it", moet_commands[i].name);
    }
    for (int k = 0; k < N_CASES; k++)
        CHECK(find_command(cmd_cases[k].name), "cmd_cases names '%s', which main does not know", cmd_cases[k].name);
    CHECK(N_CASES == MOET_N_COMMANDS, "%d cases for %d commands", N_CASES, MOET_N_COMMANDS);
}

// ---- stdout: a failed write is an error ---------------------------------------------------------

static int mx_runs;   // commands run by the matrix

static void test_matrix_stdout(void) {
    for (int k = 0; k < N_CASES; k++) {
        const cmd_case *c = &cmd_cases[k];
        for (int which = 0; which < 2; which++) {
            if (which == 1 && !c->out[0]) continue;
            const char *help[] = {"--help", NULL};
            for (int mode = OUT_FULL; mode <= OUT_CLOSED; mode++) {
                char **argv = mx_build(c->name, which ? c->out : help, tdir, NULL);
                int st = moet(argv, c->in, mode);
                mx_runs++;
                CHECK(exited(st, 1) && strstr(r_err, "stdout"), "moet %s %s with stdout %s: status %#x: %s", c->name,
                      which ? "(its result)" : "--help", mode == OUT_FULL ? "on /dev/full" : "closed", st, r_err);
            }
        }
        // and with a working stdout, the same runs succeed
        const char *help[] = {"--help", NULL};
        CHECK(exited(moet(mx_build(c->name, help, tdir, NULL), NULL, OUT_CAPTURE), 0) && strstr(r_out, "usage: moet"),
              "moet %s --help: %s", c->name, r_err);
        mx_runs++;
    }
}

// ---- every flag: missing value, empty, garbage, out of range, repeated ------------------------

// base without the flag (and its value) at index skip of the command's table.
static int mx_without(const char *const *base, const moet_flag *f, const char **out) {
    int n = 0;
    for (int i = 0; base[i]; i++) {
        if (f->name && (!strcmp(base[i], f->name) || (f->alias && !strcmp(base[i], f->alias)))) {
            if (f->kind != ARG_SWITCH && base[i + 1]) i++;
            continue;
        }
        out[n++] = base[i];
    }
    out[n] = NULL;
    return n;
}

static const char *mx_valid(const moet_flag *f, char *buf, size_t cap) {
    switch (f->kind) {
    case ARG_INT: case ARG_I64: case ARG_LIST: snprintf(buf, cap, "%" PRId64, f->lo); return buf;
    case ARG_U64: return "1";
    case ARG_NUM: snprintf(buf, cap, "%g", f->dlo); return buf;
    case ARG_CHOICE: snprintf(buf, cap, "%.*s", (int)strcspn(f->choices, "|"), f->choices); return buf;
    default: return "x";
    }
}

static int mx_flag_cases;

// One case of the flag matrix: exit status `code` (0: any failure), a message that names the flag
// (and holds needle), one line only unless usage (the command's usage follows a missing flag).
static void mx_expect_u(const char *cmd, const moet_flag *f, const char *what, char **argv, int code, const char *needle, int usage) {
    int st = moet(argv, NULL, OUT_CAPTURE);
    mx_runs++;
    mx_flag_cases++;
    int ok = WIFEXITED(st) && (code ? WEXITSTATUS(st) == code : WEXITSTATUS(st) != 0);
    CHECK(ok && strstr(r_err, f->name) && (!needle || strstr(r_err, needle)) && (usage ? strstr(r_err, "usage: moet") != NULL : lines_of(r_err) == 1),
          "moet %s %s (%s): status %#x, want exit %d and one line naming %s%s%s: %s", cmd, f->name, what, st, code, f->name,
          needle ? " with " : "", needle ? needle : "", r_err);
    CHECK(leftovers(tdir, (const char *[]){NULL}) == 0, "moet %s %s (%s) left something in %s", cmd, f->name, what, tdir);
}

static void mx_expect(const char *cmd, const moet_flag *f, const char *what, char **argv, int code, const char *needle) {
    mx_expect_u(cmd, f, what, argv, code, needle, 0);
}

static void test_matrix_flags(void) {
    static char longpath[5200];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[0] = '/';
    longpath[sizeof longpath - 1] = 0;
    for (int k = 0; k < N_CASES; k++) {
        const cmd_case *c = &cmd_cases[k];
        const moet_command *mc = find_command(c->name);
        if (!mc) continue;
        for (int j = 0; j < mc->n_flags; j++) {
            const moet_flag *f = &mc->flags[j];
            if (!f->name) continue;   // the positional FILE: below
            const char *rest[MAXA + 1], *extra[8];
            char valid[64], big[64];
            mx_without(c->base, f, rest);
            // repeated (a switch too)
            const char *v = mx_valid(f, valid, sizeof valid);
            if (f->kind == ARG_SWITCH) extra[0] = f->name, extra[1] = f->name, extra[2] = NULL;
            else extra[0] = f->name, extra[1] = v, extra[2] = f->name, extra[3] = v, extra[4] = NULL;
            mx_expect(c->name, f, "repeated", mx_build(c->name, rest, tdir, extra), 2, "given twice");
            if (f->kind == ARG_SWITCH) continue;
            // missing value: the flag ends the line
            extra[0] = f->name, extra[1] = NULL;
            mx_expect(c->name, f, "missing value", mx_build(c->name, rest, tdir, extra), 2, "needs a value");
            // empty
            extra[0] = f->name, extra[1] = "", extra[2] = NULL;
            mx_expect(c->name, f, "empty", mx_build(c->name, rest, tdir, extra), 2, "empty");
            // garbage
            const char *garbage = NULL, *gneedle = NULL;
            int gcode = 2;
            switch (f->kind) {
            case ARG_INT: case ARG_I64: case ARG_U64: case ARG_NUM: case ARG_LIST: garbage = "7x"; gneedle = "expected"; break;
            case ARG_CHOICE: garbage = "bogus"; gneedle = "expected"; break;
            // a path that cannot be used: 1 (tokenize: 2, as for any refused tokenizer)
            case ARG_IN_FILE: case ARG_IN_DIR: case ARG_IN_ANY: garbage = "@W/none/garbage"; gneedle = "cannot open"; gcode = 0; break;
            case ARG_OUT_FILE: case ARG_OUT_DIR: garbage = "@W/none/garbage"; gneedle = "cannot create"; gcode = 0; break;
            default: break;   // ARG_STR: any text is a value
            }
            if (garbage) {
                extra[0] = f->name, extra[1] = garbage, extra[2] = NULL;
                mx_expect(c->name, f, "garbage", mx_build(c->name, rest, tdir, extra), gcode, gneedle);
            }
            // out of range
            const char *range = NULL;
            switch (f->kind) {
            case ARG_INT: case ARG_I64: case ARG_LIST:
                if (f->hi < INT64_MAX) snprintf(big, sizeof big, "%" PRId64, f->hi + 1);
                else snprintf(big, sizeof big, "9223372036854775808");
                range = big;
                break;
            case ARG_U64: range = "18446744073709551616"; break;
            case ARG_NUM: snprintf(big, sizeof big, "%g", f->dhi * 10); range = big; break;
            case ARG_STR:
                if (f->hi > 0 && f->hi < (int64_t)sizeof longpath - 1) range = longpath + sizeof longpath - 2 - f->hi;   // hi + 1 bytes
                break;
            case ARG_CHOICE: break;
            default: range = longpath;   // paths: longer than a path may be
            }
            if (range) {
                extra[0] = f->name, extra[1] = range, extra[2] = NULL;
                mx_expect(c->name, f, "out of range", mx_build(c->name, rest, tdir, extra), 2, NULL);
            }
            if (f->kind == ARG_INT || f->kind == ARG_I64 || f->kind == ARG_LIST) {   // below the range too
                snprintf(big, sizeof big, "%" PRId64, f->lo - 1);
                if (f->lo > INT64_MIN) {
                    extra[0] = f->name, extra[1] = big, extra[2] = NULL;
                    mx_expect(c->name, f, "below the range", mx_build(c->name, rest, tdir, extra), 2, "expected");
                }
            }
        }
    }
    // lists: an empty item, wherever it is
    const char *lists[] = {"1,,16", "1,", ",1", "1, ,2"};
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        const char *extra[] = {"--batch", lists[i], NULL};
        const cmd_case *b = NULL;
        for (int k = 0; k < N_CASES; k++) if (!strcmp(cmd_cases[k].name, "bench")) b = &cmd_cases[k];
        const char *rest[MAXA + 1];
        const moet_flag fb = {.name = "--batch", .kind = ARG_LIST};
        mx_without(b->base, &fb, rest);
        mx_expect("bench", &fb, lists[i], mx_build("bench", rest, tdir, extra), 2, "empty");
    }
    // the positional FILE of info and verify: missing, empty, a second one
    const char *cmds[2] = {"info", "verify"};
    for (int i = 0; i < 2; i++) {
        const moet_flag ff = {.name = "FILE"};
        const char *none[] = {NULL}, *empty[] = {"", NULL}, *two[] = {PLANES, PLANES, NULL}, *bogus[] = {PLANES, "--bogus", NULL};
        mx_expect_u(cmds[i], &ff, "missing", mx_build(cmds[i], none, tdir, NULL), 2, "required", 1);
        mx_expect(cmds[i], &ff, "empty", mx_build(cmds[i], empty, tdir, NULL), 2, "empty");
        mx_expect(cmds[i], &ff, "two", mx_build(cmds[i], two, tdir, NULL), 2, "one FILE only");
        const moet_flag fbog = {.name = "--bogus"};
        int st = moet(mx_build(cmds[i], bogus, tdir, NULL), NULL, OUT_CAPTURE);
        mx_runs++;
        CHECK(exited(st, 2) && strstr(r_err, "unknown option '--bogus'"), "moet %s FILE --bogus: %s", cmds[i], r_err);
        (void)fbog;
    }
}

// ---- every output path: empty, FIFO, symbolic link, dangling link, device node, directory ------

static void test_matrix_outputs(void) {
    char w[96];
    tpath(w, sizeof w, "out");
    for (int k = 0; k < N_CASES; k++) {
        const cmd_case *c = &cmd_cases[k];
        const moet_command *mc = find_command(c->name);
        for (int j = 0; mc && j < mc->n_flags; j++) {
            const moet_flag *f = &mc->flags[j];
            if (f->kind != ARG_OUT_FILE && f->kind != ARG_OUT_DIR) continue;
            int is_dir = f->kind == ARG_OUT_DIR;
            // the run that writes it: its interrupted run's command line, which writes @W/...
            const char *rest[MAXA + 1];
            mx_without(c->sig, f, rest);
            const char *kinds[] = {"empty", "a FIFO", "a symbolic link", "a dangling symbolic link", "a character device", "a directory",
                                   "absent"};
            for (int kind = 0; kind < 7; kind++) {
                rm_rf(w);
                MOET_ASSERT(mkdir(w, 0700) == 0, "mkdir");
                char target[160], keep[160];
                snprintf(target, sizeof target, "%s/target", w);
                snprintf(keep, sizeof keep, "%s/keep", w);
                write_text(keep, "keep");
                const char *fixtures[] = {"keep", "target", NULL};
                int own_dev = 1;
                switch (kind) {
                case 0: snprintf(target, sizeof target, "%s", ""); fixtures[1] = NULL; break;
                case 1: MOET_ASSERT(mkfifo(target, 0600) == 0, "mkfifo"); break;
                case 2: MOET_ASSERT(symlink(is_dir ? w : keep, target) == 0, "symlink"); break;
                case 3: MOET_ASSERT(symlink("nowhere", target) == 0, "symlink"); break;
                case 4:
                    own_dev = mknod(target, S_IFCHR | 0666, makedev(1, 3)) == 0;
                    if (!own_dev) snprintf(target, sizeof target, "/dev/null"), fixtures[1] = NULL;
                    break;
                case 5: MOET_ASSERT(mkdir(target, 0700) == 0, "mkdir"); break;
                default: fixtures[1] = NULL; break;
                }
                mode_t before = kind == 0 ? 0 : lmode(target);
                const char *extra[] = {f->name, target, NULL};
                char **argv = mx_build(c->name, rest, w, extra);
                int st = moet(argv, c->in, OUT_CAPTURE);
                mx_runs++;
                int accepted = kind == 6 || (is_dir && kind == 5);
                if (accepted) {
                    struct stat sb;
                    CHECK(exited(st, 0) && lstat(target, &sb) == 0 && (is_dir ? S_ISDIR(sb.st_mode) : S_ISREG(sb.st_mode)),
                          "moet %s %s over %s: written (status %#x): %s", c->name, f->name, kinds[kind], st, r_err);
                    const char *done[] = {"keep", "target", NULL};
                    CHECK(leftovers(w, done) == 0 && (!is_dir || leftovers(target, NULL) == 0), "moet %s %s over %s: nothing else left",
                          c->name, f->name, kinds[kind]);
                    if (is_dir) {
                        char cfg[300];
                        snprintf(cfg, sizeof cfg, "%s/config.json", target);
                        CHECK(access(cfg, F_OK) == 0, "moet %s %s over %s: the files are in it", c->name, f->name, kinds[kind]);
                    }
                } else {
                    CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0 && strstr(r_err, f->name) && lines_of(r_err) == 1 &&
                              strstr(r_err, kind == 0 ? "empty" : kind == 3 ? "a symbolic link" : kinds[kind]),
                          "moet %s %s over %s: refused before any work, naming the flag and the kind (status %#x): %s", c->name,
                          f->name, kinds[kind], st, r_err);
                    CHECK(kind == 0 || lmode(target) == before, "moet %s %s: %s left as it was", c->name, f->name, kinds[kind]);
                    CHECK(leftovers(w, fixtures) == 0, "moet %s %s over %s: nothing written", c->name, f->name, kinds[kind]);
                    FILE *kf = fopen(keep, "r");
                    char b[16] = "";
                    CHECK(kf && fgets(b, sizeof b, kf) && !strcmp(b, "keep"), "the link's target is untouched");
                    if (kf) fclose(kf);
                }
                if (kind == 4 && !own_dev) fprintf(stderr, "test_commands: mknod refused: the device case ran on /dev/null\n");
            }
        }
    }
    rm_rf(w);
}

// ---- every command interrupted: SIGHUP, SIGTERM, SIGINT, SIGPIPE -------------------------------

static void test_matrix_signals(void) {
    char w[96];
    tpath(w, sizeof w, "sig");
    const int sigs[] = {SIGHUP, SIGTERM, SIGINT, SIGPIPE};
    for (int k = 0; k < N_CASES; k++) {
        const cmd_case *c = &cmd_cases[k];
        for (int i = 0; i < 4; i++) {
            rm_rf(w);
            MOET_ASSERT(mkdir(w, 0700) == 0, "mkdir");
            int appeared = 0;
            char **argv = mx_build(c->name, c->sig, w, NULL);
            double ts = moet_now();
            int st = moet_interrupted(argv, c->in, c->sig_writes ? w : NULL, sigs[i], &appeared);
            if (getenv("MX_TIMES")) fprintf(stderr, "signal case %s %d: %.3f s\n", c->name, sigs[i], moet_now() - ts);   // MX_TIMES=1: each case's time
            mx_runs++;
            CHECK(st != -1 && (!c->sig_writes || appeared), "moet %s, signal %d: interrupted mid-run (output appeared: %d)", c->name,
                  sigs[i], appeared);
            int want_zero = c->graceful && (sigs[i] == SIGTERM || sigs[i] == SIGINT);
            if (want_zero) CHECK(exited(st, 0), "moet %s, signal %d: finishes and exits 0 (status %#x)", c->name, sigs[i], st);
            else if (c->graceful) CHECK(st != -1 && !exited(st, 0), "moet %s, signal %d: status %#x", c->name, sigs[i], st);
            else CHECK(WIFSIGNALED(st) && WTERMSIG(st) == sigs[i], "moet %s, signal %d: ended by it (status %#x)", c->name, sigs[i], st);
            CHECK(dir_entries(w) == 0, "moet %s, signal %d: nothing left behind", c->name, sigs[i]);
            leftovers(w, (const char *[]){NULL});
        }
    }
    rm_rf(w);
}

// =============================================================================================

int main(void) {
    if (getenv("MOET_BIN")) moet_bin = getenv("MOET_BIN");
    snprintf(tdir, sizeof tdir, "/tmp/moet_test_commands.XXXXXX");
    MOET_ASSERT(mkdtemp(tdir), "mkdtemp");
    if (access(moet_bin, X_OK) != 0 || access(PLANES, R_OK) != 0) {
        CHECK(0, "./moet or " PLANES " is missing: run ./build.sh first");
        return check_report("test_commands");
    }
    test_save_ref_special();
    test_interrupted_outputs();
    test_empty_out();
    test_stdout_fails();
    test_model_name();
    test_bench_line();
    test_bench_spec();
    test_bench_cache();
    test_bom();
    test_numbers();
    test_tool_arguments();
    test_messages();
    double t0 = moet_now();
    test_table_complete();
    test_matrix_stdout();
    double t1 = moet_now();
    test_matrix_flags();
    double t2 = moet_now();
    test_matrix_outputs();
    double t3 = moet_now();
    test_matrix_signals();
    fprintf(stderr, "test_commands: stdout %.1f s, flags %.1f s, outputs %.1f s, signals %.1f s\n", t1 - t0, t2 - t1, t3 - t2, moet_now() - t3);
    fprintf(stderr, "test_commands: the matrix: %d commands, %d flag cases, %d runs of ./moet in %.1f s\n", N_CASES, mx_flag_cases,
            mx_runs, moet_now() - t0);
    rm_rf(tdir);
    return check_report("test_commands");
}
