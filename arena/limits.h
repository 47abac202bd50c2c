// arena/limits.h — every fixed limit and size of moet, in one place.
//
// A limit here is a promise checked at the boundary where untrusted input enters
// (a file, a request line, a flag); code past that boundary may rely on it.
#ifndef MOET_LIMITS_H
#define MOET_LIMITS_H

// ---- model geometry (checked when config.json is read) -------------------------------
#define MOET_MAX_LAYERS        256      // num_hidden_layers
#define MOET_MAX_EXPERTS       1024     // num_experts per layer
#define MOET_MAX_TOPK          64       // num_experts_per_tok
#define MOET_MAX_HIDDEN        16384    // hidden_size
#define MOET_MAX_HEAD_DIM      512      // head_dim, linear_{key,value}_head_dim
#define MOET_MAX_HEADS         256      // attention / GDN head counts
#define MOET_MAX_CONV_KERNEL   8        // linear_conv_kernel_dim
#define MOET_MAX_VOCAB         (1 << 20)

// ---- files ---------------------------------------------------------------------------
#define MOET_MAX_PATH          4096
#define MOET_MAX_SHARDS        256      // *.safetensors files of one checkpoint
#define MOET_MAX_TENSORS       (1 << 20)// tensors of one checkpoint (the real one has ~70k)
#define MOET_MAX_NAME          512      // bytes of a tensor name
#define MOET_MAX_DIMS          8        // rank of a tensor
#define MOET_ST_SAVE_MAX       (MOET_MAX_LAYERS + 8) // tensors of one st_save (moet run --out: hidden.0..L + 3)
#define MOET_ST_MAX_HEADER     100000000ull // safetensors header bytes (the reference loader's limit)
#define MOET_MAX_CONFIG_BYTES  (16u << 20)  // config.json, hf_quant_config.json, index.json

// ---- JSON ----------------------------------------------------------------------------
#define MOET_JSON_MAX_DEPTH    128      // nesting of arrays/objects

// ---- tokenizer (format/tokenizer.c) ----------------------------------------------------
#define MOET_MAX_TOKENIZER_BYTES (256u << 20) // tokenizer.json (Qwen3.6's is ~13 MB; JSON with
                                              // pretty-printed pair merges can be ~3x that)
#define MOET_MAX_MERGES        (1 << 22)// model.merges entries (Qwen3.6 has 247,587)
#define MOET_MAX_TOKEN_BYTES   4096     // bytes of one vocab token or added-token content
#define MOET_MAX_ADDED_TOKENS  65536    // added tokens of tokenizer.json + tokenizer_config.json
#define MOET_TOK_CLI_MAX_LINE  (4u << 20) // one stdin line of `moet tokenize`
#define MOET_TOK_CLI_MAX_TEXT  (1u << 20) // text bytes of one `moet tokenize` line (scratch size)
#define MOET_TOK_CLI_MAX_IDS   (1u << 20) // ids of one `moet tokenize` line, either direction

// ---- CPU reference engine -----------------------------------------------------------
#define MOET_MAX_THREADS       256      // workers of the reference matrix products

// ---- CLI run -------------------------------------------------------------------------
#define MOET_MAX_RUN_TOKENS    65536    // prompt + generated tokens of `moet run`

// ---- expert plane file (MOET2PF1) ---------------------------------------------------------
#define MOET_PF_MAX_INTER      65536    // moe_intermediate_size a plane file holds (slot < 4 GiB)
#define MOET_PF_MAX_THREADS    256      // quantizing / hashing threads of build-planes, verify

// ---- moet serve: the request line protocol ----------------------------------------------
#define MOET_MAX_LINE          (2u << 20) // bytes of one request line (longer: skipped, one error)
#define MOET_MAX_LINE_VALUES   (1u << 20) // JSON values in one request line
#define MOET_MAX_ID            256      // bytes of a request id / custom_id
#define MOET_MAX_STOP          16       // stop strings of one request
#define MOET_MAX_STOP_BYTES    256      // bytes of one stop string
#define MOET_MAX_STOP_IDS      16       // stop_token_ids of one request (besides the model's eos)
#define MOET_MAX_EOS_IDS       8        // eos_token_id entries of generation_config.json
#define MOET_MAX_LOGPROBS      20       // top_logprobs per position (OpenAI's limit)
#define MOET_MAX_SPEC          8        // draft tokens the MTP head proposes per verification step
#define MOET_MAX_SEQS          4096     // --max-num-seqs
#define MOET_GRAPH_ROWS        64       // GPU: decode steps of up to this many rows replay a graph captured at boot
#define MOET_GPU_CACHE_READERS 32       // GPU expert cache: most reader threads (--io-depth), one slot read each in flight
#define MOET_IO_DEPTH          8        // --io-depth default: 8 reads of ~0.9 MB in flight (the H200's disk: 1.6 GB/s at depth 1, ~2.2 at 8)
#define MOET_HOST_MARGIN_GB    4.0      // --host-margin-gb: on a GPU that shares the host's memory (GB10), what the plan leaves the host
#define MOET_MAX_QUEUE         65536    // --max-queue (requests read and waiting for a slot)
#define MOET_TEXT_PER_TOKEN    8        // planned output text bytes per token (past it: "length")
#define MOET_OUT_BUFFER        (64u << 10) // stdout buffer; a line longer than it is written in pieces
#define MOET_HEAP_CUSHION      (1u << 20) // the C library's heap made resident before the ready line:
                                           // libcuda allocates there while serving (48 KiB measured
                                           // over 3,000 GPU requests)
#define MOET_SERVE_STACK       (256u << 10) // main-thread stack made resident before the ready line: the
                                           // serve loop's deepest path (a request nested MOET_JSON_MAX_DEPTH
                                           // deep) measured 108 KiB

// ---- prefix cache (moet serve --prefix-block, --prefix-cache-gb; serve/prefix.c) -----------
#define MOET_PREFIX_BLOCK      256      // default tokens per block: a saved state after each 256 prompt
                                        // tokens (a multiple of every backend's chunk_align and of
                                        // the GPU's KV page)
#define MOET_PREFIX_BLOCKS     64       // default blocks kept when --prefix-cache-gb is not given
                                        // (the demo model: 29 MiB on the CPU; Qwen3.6: 4.2 GiB on the GPU,
                                        // 67.8 MiB a block: 62.8 MiB of GDN state + 256 tokens of bf16 KV)
#define MOET_MAX_PREFIX_BLOCKS (1 << 20)// blocks of one cache (its table's indices are int32)

// ---- moet eval ---------------------------------------------------------------------------
#define MOET_EVAL_MAX_TURNS    4096     // assistant turns of one conversation line
#define MOET_EVAL_REF_PAGE     4096     // header page of a reference file (magic, length, JSON)

_Static_assert(MOET_MAX_HEAD_DIM % 2 == 0, "rotary pairs need an even head dim");
_Static_assert(MOET_MAX_TOPK <= MOET_MAX_EXPERTS, "top-k cannot exceed the experts");

#endif
