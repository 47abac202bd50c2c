// tests/chat_tools.h — a conversation with several tools and several tool calls, and the prompt
// the Qwen3.6 chat template renders for it, written out by hand from chat_template.jinja (every
// tool as json.dumps gives it, one per line inside <tools>; each call as its own <tool_call>
// block; consecutive tool messages in one user turn). Used by test_chat (chat_render),
// test_serve (the server's prompt through a byte codec) and test_serve_e2e (the real binary and
// tokenizer): dropping a tool or a call after the first changes the prompt.
#ifndef MOET_CHAT_TOOLS_H
#define MOET_CHAT_TOOLS_H

#define TOOLS_RULES                                                                                        \
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n" \
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n" \
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple "  \
    "lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow " \
    "the specified format: an inner <function=...></function> block must be nested within "                 \
    "<tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional " \
    "reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If "   \
    "there is no function call available, answer the question like normal with your current knowledge and " \
    "do not tell the user about function calls\n</IMPORTANT>"

// The members "messages", "tools" and the thinking switch of a request (no braces around them).
#define TOOLS3_MEMBERS                                                                                             \
    "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"                                              \
    "{\"role\":\"user\",\"content\":\"Weather and time in Paris?\"},"                                             \
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["                                                  \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2}}}," \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":\"{\\\"zone\\\": \\\"CET\\\"}\"}}]}," \
    "{\"role\":\"tool\",\"content\":\"sunny\"},{\"role\":\"tool\",\"content\":\"12:00\"}],"                      \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather in a city\","  \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}," \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\","             \
    "\"properties\":{\"zone\":{\"type\":\"string\"}}}}},"                                                          \
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"description\":\"Search the web\"}}],"              \
    "\"chat_template_kwargs\":{\"enable_thinking\":false}"

#define TOOLS3_PROMPT                                                                                              \
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"                   \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city\", "   \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "     \
    "[\"city\"]}}}\n"                                                                                              \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", "       \
    "\"properties\": {\"zone\": {\"type\": \"string\"}}}}}\n"                                                      \
    "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \"Search the web\"}}"          \
    TOOLS_RULES "\n\nBe brief.<|im_end|>\n"                                                                        \
    "<|im_start|>user\nWeather and time in Paris?<|im_end|>\n"                                                     \
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"                                                               \
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"            \
    "</parameter>\n</function>\n</tool_call>\n"                                                                    \
    "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call><|im_end|>\n" \
    "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n</tool_response>"         \
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"

#endif
