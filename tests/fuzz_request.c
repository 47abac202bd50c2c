// tests/fuzz_request.c — libFuzzer target for the request parser of `moet serve` (./build.sh fuzz).
//
// Any bytes as one request line: proto_parse either refuses them (with an error code and a
// message) or returns a request whose fields are within the documented ranges; a chat request
// is then rendered with the chat template into a heap buffer (ASan sees any overrun), and the
// reasoning/content splitter runs over the input as generated text, in pieces and whole, which
// must agree.
#include "../moet.c"

static void fz_split_check(const char *s, size_t n) {
    for (int thinking = 0; thinking < 2; thinking++) {
        size_t r0, r1, c0, c1;
        chat_split_all(thinking, s, n, &r0, &r1, &c0, &c1);
        MOET_ASSERT(r0 <= r1 && r1 <= n && c0 <= c1 && c1 <= n, "split ranges");
        chat_split sp;
        chat_delta d;
        chat_split_init(&sp, thinking);
        size_t rl = 0, cl = 0, step = n % 5 + 1;
        for (size_t at = 0; at < n;) {
            at = at + step < n ? at + step : n;
            chat_split_update(&sp, s, at, 0, &d);
            rl += d.r_to - d.r_from;
            cl += d.c_to - d.c_from;
        }
        chat_split_update(&sp, s, n, 1, &d);
        rl += d.r_to - d.r_from;
        cl += d.c_to - d.c_from;
        MOET_ASSERT(rl == r1 - r0 && cl == c1 - c0, "streamed split differs from the whole");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    fz_split_check(text, size);
    if (proto_bad_utf8(text, size) >= 0) return 0;
    js_doc d;
    memset(&d, 0, sizeof d);
    uint32_t nodes;
    size_t strs;
    if (js_measure(&d, text, size, &nodes, &strs)) return 0;
    d.nodes = malloc((size_t)nodes * sizeof(js_node));
    d.strs = malloc(strs + 1);
    d.cap_nodes = nodes;
    d.cap_strs = strs + 1;
    MOET_ASSERT(js_parse(&d, text, size) == 0, "parse after measure");
    proto_limits lim = {{1.0f, 0, 1.0f, 0, 0, 0, 1.0f}, 4096, 20, 1};
    proto_req q;
    proto_error pe = {0};
    if (proto_parse(&d, &lim, "req-1", &q, &pe) != 0) {
        MOET_ASSERT(pe.code && pe.e.msg[0], "an error without code or message");
    } else if (q.kind == PROTO_CHAT || q.kind == PROTO_COMPLETION) {
        MOET_ASSERT(q.sp.temperature >= 0 && q.sp.top_p > 0 && q.sp.top_p <= 1 && q.sp.top_k >= 0, "sampling ranges");
        MOET_ASSERT(q.n_stop <= MOET_MAX_STOP && q.top_logprobs <= 20 && q.max_tokens >= 0, "limits");
        if (q.kind == PROTO_CHAT) {
            chat_mem mem;
            memset(&mem, 0, sizeof mem);
            mem.scratch_cap = size + 1;
            mem.scratch = malloc(mem.scratch_cap);
            mem.args.cap_nodes = (uint32_t)size + 1;
            mem.args.nodes = malloc(sizeof(js_node) * mem.args.cap_nodes);
            mem.args.cap_strs = size + 1;
            mem.args.strs = malloc(mem.args.cap_strs);
            size_t cap = 4 * size + 4096, len;
            char *out = malloc(cap);
            moet_err e;
            if (chat_render(&d, q.messages, q.tools, &q.chat, &mem, out, cap, &len, &e) == 0) {
                MOET_ASSERT(len <= cap, "render length");
                fz_split_check(out, len);
            } else MOET_ASSERT(e.msg[0], "render error without a message");
            free(out);
            free(mem.scratch);
            free(mem.args.nodes);
            free(mem.args.strs);
        }
    }
    free(d.nodes);
    free(d.strs);
    return 0;
}
