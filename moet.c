// moet.c — the whole program as one translation unit (a unity build).
//
// moet serves qwen3_5_moe models (Qwen3.6-35B-A3B) with every routed expert as 2-bit planes
// read from one MOET2PF1 file. This file is the table of contents: it includes every module in
// dependency order, leaf modules first, then holds the command line. Every function is static.
// Tests `#define MOET_TEST` and include this file to call the internals directly.

#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

// defines: every fixed limit (MOET_MAX_*)
#include "arena/limits.h"
// defines: moet_err, err_set, MOET_ASSERT, moet_die, checked size arithmetic
#include "arena/base.c"
// defines: arena (measure / init / take), arena_map_file, the allocation counter
#include "arena/arena.c"
// defines: js_doc, js_measure, js_parse, js_get, js_writer (RFC 8259 JSON)
#include "format/json.c"
// defines: st_set, st_open, st_find (safetensors shards: mmap + validation)
#include "format/safetensors.c"
// defines: ck_config, ck_model, ck_open, ck_mat + ck_row_f32/ck_row_f64 (exact weight decode)
#include "format/checkpoint.c"

// ==========================================================================================
// engine backend: what the scheduler needs from a forward pass (the CPU reference, the GPU)
// ==========================================================================================
//
// A backend holds max_seqs sequence slots, each an independent token history of at most
// max_len tokens (KV pages / recurrent state live behind it). step() runs one batched
// forward: row i appends ids[off[i] .. off[i+1]) to slot slots[i] (a prefill chunk or one
// decode token; each slot appears at most once per step, off[0] = 0, every row non-empty)
// and writes the logits after that row's last token to logits[i * n_vocab ..] // [n, V] f32.
// Row results must not depend on the other rows of the step (batch invariance).
typedef struct {
    void *self;
    int n_vocab;      // logits per row
    int max_seqs;     // sequence slots
    int max_len;      // tokens per sequence (context limit)
    void (*reset)(void *self, int slot);   // slot becomes an empty sequence (position 0, zeroed state)
    // One batched step: for i in [0,n): append tokens ids[off[i] .. off[i+1]) to sequence slot slots[i]
    // and write the logits after its last appended token to logits[i * n_vocab ..]. Returns 0, or -1 with e set.
    int (*step)(void *self, int n, const int *slots, const int32_t *ids, const int *off, float *logits, moet_err *e);
} engine_backend;

// ==========================================================================================
// command line
// ==========================================================================================

static void moet_usage(FILE *f) {
    fputs("usage: moet <command> [options]\n"
          "commands:\n"
          "  run       reference forward pass of a model over token ids (see README)\n",
          f);
}

#ifndef MOET_TEST
int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        moet_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    fprintf(stderr, "moet: unknown command '%s'\n", argv[1]);
    moet_usage(stderr);
    return 2;
}
#endif
