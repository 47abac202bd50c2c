// format/chat.c — the Qwen3.6 chat template, written out in C, and the answer splitter.
//
// chat_render() turns an OpenAI `messages` array (and an optional `tools` array) into the
// prompt text the model was trained on, byte for byte what the model's chat_template.jinja
// renders with add_generation_prompt=true under Hugging Face transformers:
//
//   - The first one or two messages, when their role is system or developer, are merged
//     (each trimmed, joined with "\n") into one system turn. Later system/developer messages
//     are left out, as the template does.
//   - With tools, the system turn starts with the "# Tools" block: each tool serialized as
//     Python's json.dumps would (", " and ": " separators, non-ASCII kept), then the XML
//     tool-call instructions, then "\n\n" + the merged system text if there is one.
//   - user:      <|im_start|>user\n{content|trim}<|im_end|>\n
//   - assistant: reasoning comes from `reasoning_content` or from a <think>…</think> part of
//     the content. Turns after the last real user query (tool loops), or every turn with
//     preserve_thinking, keep it as "<think>\n{r}\n</think>\n\n{content}"; earlier turns drop
//     it. Tool calls follow in the XML form <tool_call>\n<function=NAME>\n<parameter=P>\nV
//     \n</parameter>\n</function>\n</tool_call>.
//   - tool:      consecutive tool messages share one user turn, each wrapped in
//     "\n<tool_response>\n…\n</tool_response>".
//   - generation prompt: "<|im_start|>assistant\n<think>\n" (thinking on, the default), or
//     "<|im_start|>assistant\n<think>\n\n</think>\n\n" (enable_thinking false); none from
//     chat_render_turns without gen_prompt (a finished conversation, add_generation_prompt=false).
// Content is a string, null, or an array of {"type":"text","text":…} parts (concatenated);
// image and video parts are refused (text-only model). `|trim` is Python's str.strip(): it
// removes Unicode whitespace at both ends.
//
// The splitter (chat_split_*) cuts generated text into reasoning_content and content at the
// first "</think>", incrementally, so streamed deltas add up to exactly the final fields.

enum { CHAT_MAX_SYSTEM = 2 };   // leading system/developer messages merged into one turn

typedef struct {
    int enable_thinking;     // 1: the generation prompt opens <think> (the template's default)
    int preserve_thinking;   // 1: every assistant turn keeps its reasoning
} chat_opts;

// Caller memory for one render: a scratch area for assembling one message's content, and a
// JSON document for parsing a tool call's `arguments` when it is given as a JSON string.
typedef struct {
    char *scratch;           // [scratch_cap]
    size_t scratch_cap;
    js_doc args;             // nodes / strs with capacities set by the caller
} chat_mem;

// Where each assistant turn's body lies in a render: the bytes after "<|im_start|>assistant\n"
// through its "<|im_end|>", what the model itself produces (so an evaluation can score only them).
typedef struct {
    size_t *at;              // [2 · max] start, end byte offsets into the output, in turn order
    int max, n;
} chat_turns;

typedef struct {
    char *p;
    size_t cap, len;
    int overflow;            // ran out of room: the render fails with a clear message
} chat_buf;

static void chat_put(chat_buf *b, const void *s, size_t n) {
    if (b->overflow) return;
    if (n > b->cap - b->len) { b->overflow = 1; return; }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}
static void chat_puts(chat_buf *b, const char *s) { chat_put(b, s, strlen(s)); }

// ---- Python str.strip() ----------------------------------------------------------------

// Length of the whitespace character (Python str.isspace) starting at s, else 0.
static size_t chat_ws_at(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) return ((c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20)) ? 1 : 0;
    size_t k = js_utf8_len(s, n);
    if (k < 2) return 0;
    uint32_t cp;
    if (k == 2) cp = (uint32_t)(c & 0x1f) << 6 | (s[1] & 0x3f);
    else if (k == 3) cp = (uint32_t)(c & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    else return 0;  // no whitespace above U+FFFF
    int ws = cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
             cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
    return ws ? k : 0;
}

static void chat_trim(const char **s, size_t *n) {
    const uint8_t *u = (const uint8_t *)*s;
    size_t a = 0, b = *n, k;
    while (a < b && (k = chat_ws_at(u + a, b - a)) > 0) a += k;
    while (b > a) {
        size_t st = b - 1;   // start of the last character
        while (st > a && (u[st] & 0xc0) == 0x80 && b - st < 4) st--;
        k = chat_ws_at(u + st, b - st);
        if (k != b - st) break;
        b = st;
    }
    *s += a;
    *n = b - a;
}

static int chat_starts(const char *s, size_t n, const char *p) {
    size_t k = strlen(p);
    return n >= k && memcmp(s, p, k) == 0;
}
static int chat_ends(const char *s, size_t n, const char *p) {
    size_t k = strlen(p);
    return n >= k && memcmp(s + n - k, p, k) == 0;
}

// First occurrence of needle in s[0..n), or -1.
static int64_t chat_find(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k == 0) return 0;
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, k) == 0) return (int64_t)i;
    return -1;
}
static int64_t chat_rfind(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k > n) return -1;
    for (size_t i = n - k + 1; i-- > 0;)
        if (s[i] == needle[0] && memcmp(s + i, needle, k) == 0) return (int64_t)i;
    return -1;
}

// ---- Python json.dumps (the template's tojson) ------------------------------------------

// Python's repr(float): the shortest digits that read back, in fixed notation when the
// decimal exponent is in (-4, 16], else d.ddde±XX.
static void chat_pyfloat(chat_buf *b, double v) {
    char e[40], digits[24], out[64];
    if (v == 0) { chat_puts(b, signbit(v) ? "-0.0" : "0.0"); return; }
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    // e = [-]d[.ddd]e±XX
    const char *p = e;
    int neg = *p == '-';
    if (neg) p++;
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = atoi(p + 1) + 1;   // digits d1 d2 … mean 0.d1d2… × 10^decpt
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[o++] = '0'; out[o++] = '.';
            for (int i = 0; i < -decpt; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
            for (int i = nd; i < decpt; i++) out[o++] = '0';
            out[o++] = '.'; out[o++] = '0';
        } else {
            for (int i = 0; i < nd; i++) {
                if (i == decpt) out[o++] = '.';
                out[o++] = digits[i];
            }
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%+03d", decpt - 1);
    }
    chat_puts(b, out);
}

static void chat_pyint(chat_buf *b, int64_t v) {
    char t[32];
    chat_put(b, t, (size_t)snprintf(t, sizeof t, "%" PRId64, v));
}

// A JSON string as json.dumps(ensure_ascii=False) writes it.
static void chat_pystr(chat_buf *b, const char *s, size_t n) {
    chat_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        const char *esc = NULL;
        char hex[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) { snprintf(hex, sizeof hex, "\\u%04x", c); esc = hex; }
        if (esc) {
            chat_put(b, s + run, i - run);
            chat_puts(b, esc);
            run = i + 1;
        }
    }
    chat_put(b, s + run, n - run);
    chat_put(b, "\"", 1);
}

static void chat_pyjson(chat_buf *b, const js_doc *d, const js_node *v) {
    switch (v->type) {
    case JS_NULL: chat_puts(b, "null"); break;
    case JS_TRUE: chat_puts(b, "true"); break;
    case JS_FALSE: chat_puts(b, "false"); break;
    case JS_NUM:
        if (v->is_int) chat_pyint(b, v->i64);
        else chat_pyfloat(b, v->num);
        break;
    case JS_STR: chat_pystr(b, v->str, v->len); break;
    case JS_ARR: {
        chat_put(b, "[", 1);
        const js_node *c = js_first(v);
        for (uint32_t i = 0; i < v->len; i++, c = js_next(d, c)) {
            if (i) chat_put(b, ", ", 2);
            chat_pyjson(b, d, c);
        }
        chat_put(b, "]", 1);
        break;
    }
    default: {
        chat_put(b, "{", 1);
        const js_node *k = js_first(v);
        for (uint32_t i = 0; i < v->len; i++) {
            const js_node *val = js_next(d, k);
            if (i) chat_put(b, ", ", 2);
            chat_pystr(b, k->str, k->len);
            chat_put(b, ": ", 2);
            chat_pyjson(b, d, val);
            k = js_next(d, val);
        }
        chat_put(b, "}", 1);
    }
    }
}

// Jinja's `value | string` of a JSON scalar (Python str()): True / False / None for the
// literals, repr for numbers, the text itself for strings.
static void chat_pystr_of(chat_buf *b, const js_doc *d, const js_node *v) {
    switch (v->type) {
    case JS_NULL: chat_puts(b, "None"); break;
    case JS_TRUE: chat_puts(b, "True"); break;
    case JS_FALSE: chat_puts(b, "False"); break;
    case JS_STR: chat_put(b, v->str, v->len); break;
    default: chat_pyjson(b, d, v);
    }
}

// ---- message content ---------------------------------------------------------------------

// The text of a message's content (string, null/absent, or text parts), untrimmed: either a
// pointer into the request document or the assembled parts in mem->scratch.
static int chat_content(const js_doc *d, const js_node *msg, uint32_t index, chat_mem *mem,
                        const char **s, size_t *n, moet_err *e) {
    const js_node *c = js_get(d, msg, "content");
    *s = "";
    *n = 0;
    if (!c || c->type == JS_NULL) return 0;
    if (c->type == JS_STR) { *s = c->str; *n = c->len; return 0; }
    if (c->type != JS_ARR)
        return err_set(e, "messages[%u].content: expected a string, an array of parts or null, got %s",
                       index, js_type_name(c));
    size_t len = 0;
    const js_node *part = js_first(c);
    for (uint32_t i = 0; i < c->len; i++, part = js_next(d, part)) {
        if (part->type != JS_OBJ)
            return err_set(e, "messages[%u].content[%u]: expected an object, got %s", index, i, js_type_name(part));
        const js_node *type = js_get(d, part, "type");
        if (js_get(d, part, "image") || js_get(d, part, "image_url") || js_str_is(type, "image") ||
            js_get(d, part, "video") || js_str_is(type, "video") || js_str_is(type, "image_url"))
            return err_set(e, "messages[%u].content[%u]: image and video parts are not supported (text-only model)",
                           index, i);
        const js_node *text = js_get(d, part, "text");
        if (!text)
            return err_set(e, "messages[%u].content[%u]: expected a {\"type\": \"text\", \"text\": ...} part", index, i);
        if (text->type != JS_STR)
            return err_set(e, "messages[%u].content[%u].text: expected a string, got %s", index, i, js_type_name(text));
        if (text->len > mem->scratch_cap - len)
            return err_set(e, "messages[%u].content: text parts exceed %zu bytes", index, mem->scratch_cap);
        memcpy(mem->scratch + len, text->str, text->len);
        len += text->len;
    }
    *s = mem->scratch;
    *n = len;
    return 0;
}

static const char *const chat_roles[] = {"system", "developer", "user", "assistant", "tool"};
enum { CHAT_SYSTEM, CHAT_DEVELOPER, CHAT_USER, CHAT_ASSISTANT, CHAT_TOOL };

static int chat_role(const js_doc *d, const js_node *msg, uint32_t index, moet_err *e) {
    if (msg->type != JS_OBJ)
        return err_set(e, "messages[%u]: expected an object, got %s", index, js_type_name(msg));
    const js_node *r = js_get(d, msg, "role");
    if (!r) return err_set(e, "messages[%u]: missing \"role\"", index);
    if (r->type != JS_STR) return err_set(e, "messages[%u].role: expected a string, got %s", index, js_type_name(r));
    for (int i = 0; i < 5; i++)
        if (js_str_is(r, chat_roles[i])) return i;
    return err_set(e, "messages[%u].role: unknown role \"%.64s\" (expected system, developer, user, assistant or tool)",
                   index, r->str);
}

static const char chat_tools_intro[] =
    "# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char chat_tools_rules[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and "
    "do not tell the user about function calls\n</IMPORTANT>";

// One assistant message's tool calls, in the XML form. `content` is the (trimmed) text that
// precedes them in the turn.
static int chat_tool_calls(chat_buf *b, const js_doc *d, const js_node *calls, uint32_t index,
                           size_t content_len, chat_mem *mem, moet_err *e) {
    const js_node *call = js_first(calls);
    for (uint32_t i = 0; i < calls->len; i++, call = js_next(d, call)) {
        const js_node *tc = call;
        if (tc->type != JS_OBJ)
            return err_set(e, "messages[%u].tool_calls[%u]: expected an object, got %s", index, i, js_type_name(tc));
        const js_node *fn = js_get(d, tc, "function");
        if (fn) {
            if (fn->type != JS_OBJ)
                return err_set(e, "messages[%u].tool_calls[%u].function: expected an object, got %s",
                               index, i, js_type_name(fn));
            tc = fn;   // the template reads name/arguments from .function when present
        }
        const js_node *name = js_get(d, tc, "name");
        if (!name || name->type != JS_STR)
            return err_set(e, "messages[%u].tool_calls[%u]: the function name must be a string, got %s",
                           index, i, js_type_name(name));
        if (i == 0) chat_puts(b, content_len ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=");
        else chat_puts(b, "\n<tool_call>\n<function=");
        chat_put(b, name->str, name->len);
        chat_puts(b, ">\n");
        // The template iterates `arguments|items`: absent, there are none; present, it must be
        // a mapping (anything else raises in the reference). OpenAI clients send it as a JSON
        // string, which servers parse to an object before rendering: that string must hold one.
        const js_node *args = js_get(d, tc, "arguments");
        const js_doc *ad = d;
        int was_string = args && args->type == JS_STR;
        if (was_string) {
            uint32_t nodes;
            size_t strs;
            js_doc *pd = &mem->args;
            if (js_measure(pd, args->str, args->len, &nodes, &strs) != 0)
                return err_set(e, "messages[%u].tool_calls[%u].function.arguments: expected a JSON object, got a string that "
                               "is not valid JSON: %s", index, i, pd->err);
            if (nodes > pd->cap_nodes || strs + 1 > pd->cap_strs)
                return err_set(e, "messages[%u].tool_calls[%u].function.arguments: too large", index, i);
            MOET_ASSERT(js_parse(pd, args->str, args->len) == 0, "second JSON pass: %s", pd->err);
            ad = pd;
            args = js_root(pd);
        }
        if (args && args->type != JS_OBJ)
            return err_set(e, "messages[%u].tool_calls[%u].function.arguments: expected a JSON object (or a string holding "
                           "one), got %s%s", index, i, was_string ? "a string holding " : "", js_type_name(args));
        if (args) {
            const js_node *k = js_first(args);
            for (uint32_t j = 0; j < args->len; j++) {
                const js_node *v = js_next(ad, k);
                chat_puts(b, "<parameter=");
                chat_put(b, k->str, k->len);
                chat_puts(b, ">\n");
                if (v->type == JS_OBJ || v->type == JS_ARR) chat_pyjson(b, ad, v);
                else chat_pystr_of(b, ad, v);
                chat_puts(b, "\n</parameter>\n");
                k = js_next(ad, v);
            }
        }
        chat_puts(b, "</function>\n</tool_call>");
    }
    return 0;
}

// Renders the conversation into out[0..cap) (not NUL-terminated) and sets *len, followed by the
// generation prompt when gen_prompt is set (add_generation_prompt); records the assistant turns
// in *turns unless it is NULL. Returns 0, or -1 with e set: a malformed message list, or a
// prompt longer than cap.
static int chat_render_turns(const js_doc *d, const js_node *messages, const js_node *tools, const chat_opts *opt,
                             int gen_prompt, chat_turns *turns, chat_mem *mem, char *out, size_t cap, size_t *len,
                             moet_err *e) {
    chat_buf b = {out, cap, 0, 0};
    *len = 0;
    if (turns) turns->n = 0;
    if (!messages || messages->type != JS_ARR)
        return err_set(e, "\"messages\": expected an array, got %s", js_type_name(messages));
    if (messages->len == 0) return err_set(e, "\"messages\" is empty");
    if (tools && tools->type != JS_ARR && tools->type != JS_NULL)
        return err_set(e, "\"tools\": expected an array, got %s", js_type_name(tools));

    // roles first, so every message is checked before anything is rendered
    uint32_t n = messages->len, num_sys = 0;
    const js_node *m = js_first(messages);
    for (uint32_t i = 0; i < n; i++, m = js_next(d, m)) {
        int r = chat_role(d, m, i, e);
        if (r < 0) return -1;
        if (i == num_sys && num_sys < CHAT_MAX_SYSTEM && (r == CHAT_SYSTEM || r == CHAT_DEVELOPER)) num_sys++;
    }

    // the system turn: tools block and/or the merged leading system/developer messages
    int has_tools = tools && tools->type == JS_ARR && tools->len > 0;
    if (has_tools || num_sys) {
        chat_puts(&b, "<|im_start|>system\n");
        if (has_tools) {
            chat_puts(&b, chat_tools_intro);
            const js_node *t = js_first(tools);
            for (uint32_t i = 0; i < tools->len; i++, t = js_next(d, t)) {
                chat_puts(&b, "\n");
                chat_pyjson(&b, d, t);
            }
            chat_puts(&b, chat_tools_rules);
        }
        // merged = first|trim [+ "\n" + second|trim]; the tools turn adds it only when non-empty
        size_t mark = b.len;
        if (has_tools) chat_puts(&b, "\n\n");
        size_t text_at = b.len;
        m = js_first(messages);
        for (uint32_t i = 0; i < num_sys; i++, m = js_next(d, m)) {
            const char *s;
            size_t k;
            if (chat_content(d, m, i, mem, &s, &k, e)) return -1;
            chat_trim(&s, &k);
            if (i) chat_puts(&b, "\n");
            chat_put(&b, s, k);
        }
        if (has_tools && b.len == text_at && !b.overflow) b.len = mark;
        if (!has_tools && b.len == text_at && !b.overflow) b.len = 0;   // empty merged text: no turn at all
        else chat_puts(&b, "<|im_end|>\n");
    }

    // the last real user query: later assistant turns keep their reasoning
    // (the template scans backwards for the first such message; scanning forwards for the
    // last one is the same and avoids indexing into the array)
    int64_t last_query = -1;
    m = js_first(messages);
    for (uint32_t i = 0; i < n; i++, m = js_next(d, m)) {
        if (!js_str_is(js_get(d, m, "role"), "user")) continue;
        const char *s;
        size_t k;
        if (chat_content(d, m, i, mem, &s, &k, e)) return -1;
        chat_trim(&s, &k);
        if (!(chat_starts(s, k, "<tool_response>") && chat_ends(s, k, "</tool_response>"))) last_query = i;
    }
    if (last_query < 0) return err_set(e, "\"messages\" has no user message (the template needs a user query)");

    const js_node *prev = NULL;
    m = js_first(messages);
    for (uint32_t i = 0; i < n; prev = m, m = js_next(d, m), i++) {
        int role = chat_role(d, m, i, e);
        if (i < num_sys || role == CHAT_SYSTEM || role == CHAT_DEVELOPER) continue;
        const char *s;
        size_t k;
        if (chat_content(d, m, i, mem, &s, &k, e)) return -1;
        chat_trim(&s, &k);
        if (role == CHAT_USER) {
            chat_puts(&b, "<|im_start|>user\n");
            chat_put(&b, s, k);
            chat_puts(&b, "<|im_end|>\n");
        } else if (role == CHAT_ASSISTANT) {
            const char *rs = "";
            size_t rn = 0;
            const js_node *rc = js_get(d, m, "reasoning_content");
            if (rc && rc->type == JS_STR) {
                rs = rc->str;
                rn = rc->len;
            } else if (rc && rc->type != JS_NULL) {
                return err_set(e, "messages[%u].reasoning_content: expected a string, got %s", i, js_type_name(rc));
            } else {
                int64_t end = chat_find(s, k, "</think>");
                if (end >= 0) {
                    // reasoning = before the first </think>, right-stripped of "\n", after the last <think>
                    rs = s;
                    rn = (size_t)end;
                    while (rn && rs[rn - 1] == '\n') rn--;
                    int64_t open = chat_rfind(rs, rn, "<think>");
                    if (open >= 0) { rs += open + 7; rn -= (size_t)open + 7; }
                    while (rn && rs[0] == '\n') { rs++; rn--; }
                    // content = after the last </think>, left-stripped of "\n"
                    int64_t last = chat_rfind(s, k, "</think>");
                    s += last + 8;
                    k -= (size_t)last + 8;
                    while (k && s[0] == '\n') { s++; k--; }
                }
            }
            chat_trim(&rs, &rn);
            chat_puts(&b, "<|im_start|>assistant\n");
            size_t body = b.len;
            if (opt->preserve_thinking || (int64_t)i > last_query) {
                chat_puts(&b, "<think>\n");
                chat_put(&b, rs, rn);
                chat_puts(&b, "\n</think>\n\n");
            }
            chat_put(&b, s, k);
            const js_node *calls = js_get(d, m, "tool_calls");
            if (calls && calls->type != JS_ARR && calls->type != JS_NULL)
                return err_set(e, "messages[%u].tool_calls: expected an array, got %s", i, js_type_name(calls));
            if (calls && calls->type == JS_ARR && calls->len) {
                const char *ts = s;
                size_t tk = k;
                chat_trim(&ts, &tk);
                // the text of the content may live in mem->scratch, which parsing arguments
                // does not touch, so it stays valid here
                if (chat_tool_calls(&b, d, calls, i, tk, mem, e)) return -1;
            }
            chat_puts(&b, "<|im_end|>");
            if (turns) {
                if (turns->n == turns->max) return err_set(e, "more than %d assistant turns in one conversation", turns->max);
                turns->at[2 * turns->n] = body;
                turns->at[2 * turns->n + 1] = b.len;
                turns->n++;
            }
            chat_puts(&b, "\n");
        } else {  // tool
            if (prev && !js_str_is(js_get(d, prev, "role"), "tool")) chat_puts(&b, "<|im_start|>user");
            chat_puts(&b, "\n<tool_response>\n");
            chat_put(&b, s, k);
            chat_puts(&b, "\n</tool_response>");
            const js_node *next = i + 1 < n ? js_next(d, m) : NULL;
            if (!next || !js_str_is(js_get(d, next, "role"), "tool")) chat_puts(&b, "<|im_end|>\n");
        }
    }
    if (gen_prompt)
        chat_puts(&b, opt->enable_thinking ? "<|im_start|>assistant\n<think>\n"
                                           : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    if (b.overflow) return err_set(e, "the rendered prompt is longer than %zu bytes", cap);
    *len = b.len;
    return 0;
}

// The prompt for a new assistant turn: the conversation and the generation prompt.
static int chat_render(const js_doc *d, const js_node *messages, const js_node *tools, const chat_opts *opt,
                       chat_mem *mem, char *out, size_t cap, size_t *len, moet_err *e) {
    return chat_render_turns(d, messages, tools, opt, 1, NULL, mem, out, cap, len, e);
}

// ---- the answer splitter -------------------------------------------------------------------
//
// With thinking on, the prompt already opened <think>, so generated text up to the first
// "</think>" is reasoning and the rest is content. The final fields are
//     reasoning_content = strip(text before "</think>")      (ASCII whitespace, both ends)
//     content           = lstrip(text after "</think>")
// and with thinking off, content = the whole text, untouched. Both fields are contiguous
// ranges of the text, and they only grow as text arrives, so the streaming form hands out
// deltas as ranges of the caller's text: their concatenation is exactly the final fields. What
// could still change is held back: a possible partial "</think>" at the end, and reasoning
// whitespace that may turn out to be trailing.

#define CHAT_THINK_END "</think>"
enum { CHAT_THINK_END_LEN = sizeof CHAT_THINK_END - 1 };

typedef struct {
    int thinking;
    size_t scanned;          // text[0..scanned) holds no complete "</think>"
    int64_t end_at;          // offset of the first "</think>", or -1
    int64_t r_start;         // first byte of reasoning (after leading whitespace), or -1
    size_t r_end;            // reasoning handed out: text[r_start..r_end)
    int64_t c_start;         // first byte of content, or -1
    size_t c_end;            // content handed out: text[c_start..c_end)
} chat_split;

typedef struct {
    size_t r_from, r_to;     // new reasoning bytes: text[r_from..r_to)
    size_t c_from, c_to;     // new content bytes: text[c_from..c_to)
} chat_delta;

static int chat_is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void chat_split_init(chat_split *s, int thinking) {
    memset(s, 0, sizeof *s);
    s->thinking = thinking;
    s->end_at = -1;
    s->r_start = -1;
    s->c_start = thinking ? -1 : 0;
}

// text[0..len) is all the text so far (a prefix of every later call's text). final: no more
// text will come. Fills the new ranges to hand out.
static void chat_split_update(chat_split *s, const char *text, size_t len, int final, chat_delta *d) {
    d->r_from = d->r_to = s->r_end;
    d->c_from = d->c_to = s->c_end;
    if (!s->thinking) {
        d->c_from = s->c_end;
        d->c_to = s->c_end = len;
        return;
    }
    if (s->end_at < 0) {
        size_t from = s->scanned >= CHAT_THINK_END_LEN ? s->scanned - (CHAT_THINK_END_LEN - 1) : 0;
        int64_t k = chat_find(text + from, len - from, CHAT_THINK_END);
        if (k >= 0) s->end_at = (int64_t)(from + (size_t)k);
        s->scanned = len;
    }
    // reasoning
    size_t lim;
    if (s->end_at >= 0) lim = (size_t)s->end_at;
    else if (final) lim = len;
    else {   // hold back a tail that could be the start of "</think>"
        size_t hold = 0;
        for (size_t j = CHAT_THINK_END_LEN - 1; j > 0; j--)
            if (len >= j && memcmp(text + len - j, CHAT_THINK_END, j) == 0) { hold = j; break; }
        lim = len - hold;
    }
    if (s->r_start < 0) {
        size_t a = 0;
        while (a < lim && chat_is_ws(text[a])) a++;
        if (a < lim) { s->r_start = (int64_t)a; s->r_end = a; }
    }
    if (s->r_start >= 0) {
        size_t b = lim;
        while (b > (size_t)s->r_start && chat_is_ws(text[b - 1])) b--;
        if (b > s->r_end) {
            d->r_from = s->r_end;
            d->r_to = s->r_end = b;
        } else d->r_from = d->r_to = s->r_end;
    }
    // content
    if (s->end_at >= 0) {
        if (s->c_start < 0) {
            size_t a = (size_t)s->end_at + CHAT_THINK_END_LEN;
            while (a < len && chat_is_ws(text[a])) a++;
            if (a < len) { s->c_start = (int64_t)a; s->c_end = a; }
        }
        if (s->c_start >= 0) {
            d->c_from = s->c_end;
            d->c_to = s->c_end = len;
        } else d->c_from = d->c_to = 0;
    }
}

// The final fields of a whole text (what the non-streaming response carries).
static void chat_split_all(int thinking, const char *text, size_t len,
                           size_t *r_from, size_t *r_to, size_t *c_from, size_t *c_to) {
    chat_split s;
    chat_delta d;
    chat_split_init(&s, thinking);
    chat_split_update(&s, text, len, 1, &d);
    *r_from = s.r_start >= 0 ? (size_t)s.r_start : 0;
    *r_to = s.r_start >= 0 ? s.r_end : 0;
    *c_from = s.c_start >= 0 ? (size_t)s.c_start : 0;
    *c_to = s.c_start >= 0 ? s.c_end : 0;
}
