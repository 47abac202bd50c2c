// format/args.c — command-line flag values, the same parsing for every command: a message on
// stderr names the command, the flag, what was given and what is expected.

// A flag's integer value in [lo, hi] (every command's flags): 0, or -1 after a message on
// stderr naming the command, the flag, what was given and what is expected.
static int moet_arg_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "%s: %s %s: expected an integer in %" PRId64 "..%" PRId64 "\n", cmd, flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int moet_arg_int(const char *cmd, const char *flag, const char *s, int lo, int hi, int *out) {
    int64_t v;
    if (moet_arg_i64(cmd, flag, s, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

