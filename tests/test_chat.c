// tests/test_chat.c — the chat template and the reasoning/content splitter.
//
// Expected prompts are written out by hand from the model's chat_template.jinja (and were
// checked against Jinja2 rendering that template with transformers' tojson); none is
// produced by the code under test.
#include "../moet.c"
#include "check.h"

static char req_strs[1 << 16], args_strs[1 << 16], scratch[1 << 16], out[1 << 16];
static js_node req_nodes[4096], args_nodes[4096];

// Renders the request JSON `json` (messages, tools, chat_template_kwargs) into out.
static int render(const char *json, size_t *len, moet_err *e) {
    js_doc d = {0};
    d.nodes = req_nodes;
    d.cap_nodes = 4096;
    d.strs = req_strs;
    d.cap_strs = sizeof req_strs;
    MOET_ASSERT(js_parse(&d, json, strlen(json)) == 0, "test JSON: %s: %s", d.err, json);
    chat_mem mem = {scratch, sizeof scratch, {0}};
    mem.args.nodes = args_nodes;
    mem.args.cap_nodes = 4096;
    mem.args.strs = args_strs;
    mem.args.cap_strs = sizeof args_strs;
    const js_node *r = js_root(&d), *kw = js_get(&d, r, "chat_template_kwargs");
    chat_opts o = {!(js_get(&d, kw, "enable_thinking") && js_get(&d, kw, "enable_thinking")->type == JS_FALSE),
                   js_get(&d, kw, "preserve_thinking") && js_get(&d, kw, "preserve_thinking")->type == JS_TRUE};
    return chat_render(&d, js_get(&d, r, "messages"), js_get(&d, r, "tools"), &o, &mem, out, sizeof out, len, e);
}

static void expect(const char *json, const char *want) {
    size_t len = 0;
    moet_err e = {{0}};
    int rc = render(json, &len, &e);
    CHECK(rc == 0, "%s: %s", json, e.msg);
    if (rc) return;
    int same = len == strlen(want) && memcmp(out, want, len) == 0;
    CHECK(same, "%s\n  got  [%.*s]\n  want [%s]", json, (int)len, out, want);
}

static void expect_error(const char *json, const char *fragment) {
    size_t len = 0;
    moet_err e = {{0}};
    int rc = render(json, &len, &e);
    CHECK(rc == -1, "%s rendered instead of failing", json);
    CHECK(strstr(e.msg, fragment) != NULL, "%s: message [%s] lacks [%s]", json, e.msg, fragment);
}

#include "chat_tools.h"

static void test_template(void) {
    // the generation prompt, thinking on (default) and off (format/CHECKPOINT.md §C.6)
    expect("{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}",
           "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n");
    expect("{\"messages\":[{\"role\":\"user\",\"content\":\"  hello \\n\"}],"
           "\"chat_template_kwargs\":{\"enable_thinking\":false}}",
           "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    // system trimmed; system + developer merged with "\n"; a third leading one is left out
    expect("{\"messages\":[{\"role\":\"system\",\"content\":\" Be brief. \"},{\"role\":\"user\",\"content\":\"hi\"}]}",
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    expect("{\"messages\":[{\"role\":\"system\",\"content\":\"A\"},{\"role\":\"developer\",\"content\":\"B\"},"
           "{\"role\":\"user\",\"content\":\"hi\"}]}",
           "<|im_start|>system\nA\nB<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    expect("{\"messages\":[{\"role\":\"developer\",\"content\":\"B\"},{\"role\":\"system\",\"content\":\"C\"},"
           "{\"role\":\"system\",\"content\":\"D\"},{\"role\":\"user\",\"content\":\"hi\"}]}",
           "<|im_start|>system\nB\nC<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    // an empty system message makes no turn; two empty ones merge to "\n", which does
    expect("{\"messages\":[{\"role\":\"system\",\"content\":\"\"},{\"role\":\"user\",\"content\":\"hi\"}]}",
           "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    expect("{\"messages\":[{\"role\":\"system\",\"content\":\"\"},{\"role\":\"system\",\"content\":\"\"},"
           "{\"role\":\"user\",\"content\":\"hi\"}]}",
           "<|im_start|>system\n\n<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    // history before the last user query loses its reasoning, unless preserve_thinking
    expect("{\"messages\":[{\"role\":\"user\",\"content\":\"q1\"},{\"role\":\"assistant\","
           "\"content\":\"<think>\\nr1\\n</think>\\n\\na1\"},{\"role\":\"user\",\"content\":\"q2\"}]}",
           "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
           "<|im_start|>assistant\n<think>\n");
    expect("{\"messages\":[{\"role\":\"user\",\"content\":\"q1\"},{\"role\":\"assistant\","
           "\"content\":\"<think>\\nr1\\n</think>\\n\\na1\"},{\"role\":\"user\",\"content\":\"q2\"}],"
           "\"chat_template_kwargs\":{\"preserve_thinking\":true}}",
           "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>\n"
           "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\n");
    // after the last query the think block stays, from reasoning_content (trimmed)
    expect("{\"messages\":[{\"role\":\"user\",\"content\":\"q1\"},{\"role\":\"assistant\",\"content\":\"a1\","
           "\"reasoning_content\":\"  because  \"}]}",
           "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nbecause\n</think>\n\na1<|im_end|>\n"
           "<|im_start|>assistant\n<think>\n");
    // reasoning = before the first </think>, content = after the last one
    expect("{\"messages\":[{\"role\":\"user\",\"content\":\"q1\"},{\"role\":\"assistant\","
           "\"content\":\"x</think>y</think>\\n\\nz\"}]}",
           "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nx\n</think>\n\nz<|im_end|>\n"
           "<|im_start|>assistant\n<think>\n");
    // text parts are concatenated; trim removes Unicode whitespace (U+00A0 here)
    expect("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\" part1 \"},"
           "{\"type\":\"text\",\"text\":\"part2\\u00a0\"}]}]}",
           "<|im_start|>user\npart1 part2<|im_end|>\n<|im_start|>assistant\n<think>\n");
    // tools, tool calls (arguments as a JSON string and as an object), grouped tool responses
    expect("{\"messages\":[{\"role\":\"user\",\"content\":\"What is the weather?\"},{\"role\":\"assistant\","
           "\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":"
           "\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 3, \\\"x\\\": 1.5, "
           "\\\"flag\\\": true, \\\"none\\\": null, \\\"list\\\": [1, \\\"a\\\", {\\\"k\\\": 1e-7}], \\\"obj\\\": "
           "{\\\"u\\\": \\\"\\u00e9\\\\n\\\"}}\"}},{\"type\":\"function\",\"function\":{\"name\":\"b\",\"arguments\":"
           "{\"z\":1}}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"},{\"role\":\"tool\","
           "\"content\":\"  rainy  \"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
           "\"description\":\"Get the weather \\\"now\\\"\",\"parameters\":{\"type\":\"object\",\"properties\":"
           "{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]}",
           "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
           "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather "
           "\\\"now\\\"\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
           "\"required\": [\"city\"]}}}" TOOLS_RULES "<|im_end|>\n<|im_start|>user\nWhat is the weather?<|im_end|>\n"
           "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
           "Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=x>\n1.5\n</parameter>\n"
           "<parameter=flag>\nTrue\n</parameter>\n<parameter=none>\nNone\n</parameter>\n<parameter=list>\n"
           "[1, \"a\", {\"k\": 1e-07}]\n</parameter>\n<parameter=obj>\n{\"u\": \"\xc3\xa9\\n\"}\n</parameter>\n"
           "</function>\n</tool_call>\n<tool_call>\n<function=b>\n<parameter=z>\n1\n</parameter>\n</function>\n"
           "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n"
           "rainy\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n");
    // tools with a system message; content before a tool call; a tool loop after the query
    expect("{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"q\"},"
           "{\"role\":\"assistant\",\"content\":\"let me see\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
           "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"content\":\"r\"},{\"role\":\"assistant\",\"content\":"
           "\"done\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
           "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
           "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}" TOOLS_RULES "\n\nsys<|im_end|>\n"
           "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nlet me see\n\n"
           "<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
           "r\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\ndone<|im_end|>\n"
           "<|im_start|>assistant\n<think>\n");
    // three tools, two tool calls (arguments as an object and as a JSON string), two responses
    expect("{" TOOLS3_MEMBERS "}", TOOLS3_PROMPT);
    // Python's float repr and str() in tool arguments
    expect("{\"messages\":[{\"role\":\"user\",\"content\":\"n\"},{\"role\":\"assistant\",\"content\":\"\","
           "\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"b\":1e20,\"c\":100.0,\"d\":0.0001,"
           "\"e\":0.00001,\"f\":-0.0,\"g\":1e16,\"h\":1e15,\"i\":[3.14159,-2.5e-300],\"j\":false}}}]}]}",
           "<|im_start|>user\nn<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"
           "<function=f>\n<parameter=b>\n1e+20\n</parameter>\n<parameter=c>\n100.0\n</parameter>\n<parameter=d>\n"
           "0.0001\n</parameter>\n<parameter=e>\n1e-05\n</parameter>\n<parameter=f>\n-0.0\n</parameter>\n"
           "<parameter=g>\n1e+16\n</parameter>\n<parameter=h>\n1000000000000000.0\n</parameter>\n<parameter=i>\n"
           "[3.14159, -2.5e-300]\n</parameter>\n<parameter=j>\nFalse\n</parameter>\n</function>\n</tool_call>"
           "<|im_end|>\n<|im_start|>assistant\n<think>\n");

    expect_error("{\"messages\":[]}", "empty");
    expect_error("{\"messages\":{}}", "expected an array");
    expect_error("{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "unknown role \"robot\"");
    expect_error("{\"messages\":[{\"content\":\"x\"}]}", "missing \"role\"");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "content: expected a string");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
                 "not supported");
    expect_error("{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "no user message");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":"
                 "[{\"function\":{\"name\":\"f\",\"arguments\":\"{oops\"}}]}]}",
                 "not valid JSON");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":\"f\"}", "\"tools\"");

    // a prompt that does not fit the caller's buffer is an error, not a truncation
    {
        js_doc d = {0};
        const char *j = "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}";
        d.nodes = req_nodes; d.cap_nodes = 4096; d.strs = req_strs; d.cap_strs = sizeof req_strs;
        MOET_ASSERT(js_parse(&d, j, strlen(j)) == 0, "json");
        chat_mem mem = {scratch, sizeof scratch, {0}};
        chat_opts o = {1, 0};
        size_t len;
        moet_err e;
        CHECK(chat_render(&d, js_get(&d, js_root(&d), "messages"), NULL, &o, &mem, out, 20, &len, &e) == -1 &&
              strstr(e.msg, "longer than 20 bytes"), "short buffer: %s", e.msg);
    }
}

// Feeds text in pieces cut at `cuts` and returns the reassembled fields.
static void split_stream(int thinking, const char *text, size_t step, char *r, char *c) {
    chat_split s;
    chat_delta d;
    size_t n = strlen(text), rl = 0, cl = 0;
    chat_split_init(&s, thinking);
    for (size_t at = 0;;) {
        at = at + step < n ? at + step : n;
        chat_split_update(&s, text, at, 0, &d);
        memcpy(r + rl, text + d.r_from, d.r_to - d.r_from); rl += d.r_to - d.r_from;
        memcpy(c + cl, text + d.c_from, d.c_to - d.c_from); cl += d.c_to - d.c_from;
        if (at == n) break;
    }
    chat_split_update(&s, text, n, 1, &d);
    memcpy(r + rl, text + d.r_from, d.r_to - d.r_from); rl += d.r_to - d.r_from;
    memcpy(c + cl, text + d.c_from, d.c_to - d.c_from); cl += d.c_to - d.c_from;
    r[rl] = 0;
    c[cl] = 0;
}

static void split_case(int thinking, const char *text, const char *want_r, const char *want_c) {
    size_t r0, r1, c0, c1;
    chat_split_all(thinking, text, strlen(text), &r0, &r1, &c0, &c1);
    CHECK(r1 - r0 == strlen(want_r) && memcmp(text + r0, want_r, r1 - r0) == 0,
          "reasoning of [%s]: got [%.*s] want [%s]", text, (int)(r1 - r0), text + r0, want_r);
    CHECK(c1 - c0 == strlen(want_c) && memcmp(text + c0, want_c, c1 - c0) == 0,
          "content of [%s]: got [%.*s] want [%s]", text, (int)(c1 - c0), text + c0, want_c);
    for (size_t step = 1; step <= strlen(text) + 1; step++) {
        char r[256], c[256];
        split_stream(thinking, text, step, r, c);
        CHECK(!strcmp(r, want_r) && !strcmp(c, want_c), "[%s] in pieces of %zu: [%s] [%s]", text, step, r, c);
    }
}

static void test_split(void) {
    split_case(1, "Let me think.\n</think>\n\nThe answer is 4.", "Let me think.", "The answer is 4.");
    split_case(1, "\n\n  a  b \n</think>c \n", "a  b", "c \n");
    split_case(1, "no end yet </thi", "no end yet </thi", "");
    split_case(1, "</think>only content", "", "only content");
    split_case(1, "a</think></think>b", "a", "</think>b");
    split_case(1, "x <</think>y", "x <", "y");
    split_case(1, "   ", "", "");
    split_case(0, "\n plain </think> text ", "", "\n plain </think> text ");
}

int main(void) {
    test_template();
    test_split();
    return check_report("test_chat");
}
