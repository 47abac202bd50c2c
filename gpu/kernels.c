// gpu/kernels.c — the kernels of sass/, embedded in the binary and resolved once at boot.
//
// build.sh compiles sass/all.cu (every kernel) to one cubin per architecture and one PTX file;
// they are committed, and the assembler's .incbin puts their bytes into this program, so the
// binary needs no file beside it. At boot the image for the device's compute capability is
// loaded (sm_90, sm_120, sm_121 machine code; for any other capability ≥ 9.0 the compute_90
// PTX, which the driver compiles) and every kernel is looked up by name into a table indexed
// by an enum.

#define GPU_EMBED(sym, path)                                                                         \
    __asm__(".section .rodata\n.balign 64\n.hidden " #sym "\n.global " #sym "\n" #sym ":\n.incbin \"" path "\"\n" \
            ".byte 0\n.hidden " #sym "_end\n.global " #sym "_end\n" #sym "_end:\n.previous\n");       \
    extern const unsigned char sym[], sym##_end[];
GPU_EMBED(gpu_img_sm90, "sass/moet.sm_90.cubin")
GPU_EMBED(gpu_img_sm120, "sass/moet.sm_120.cubin")
GPU_EMBED(gpu_img_sm121, "sass/moet.sm_121.cubin")
GPU_EMBED(gpu_img_ptx90, "sass/moet.compute_90.ptx")   // NUL-terminated by the .byte 0 above

#define GPU_KERNELS(X)                                                                               \
    X(K_EMBED, "k_embed") X(K_ADD_RMSNORM, "k_add_rmsnorm") X(K_LINEAR, "k_linear") X(K_ROUTER, "k_router") \
    X(K_MOE_GATE_UP, "k_moe_gate_up") X(K_MOE_DOWN, "k_moe_down") X(K_MOE_COMBINE, "k_moe_combine")        \
    X(K_SILU_MUL, "k_silu_mul") X(K_GDN_CONV, "k_gdn_conv") X(K_GDN_RULE, "k_gdn_rule")                    \
    X(K_GATED_NORM, "k_gated_norm") X(K_ATTN_PREP_F32, "k_attn_prep_f32") X(K_ATTN_PREP_BF16, "k_attn_prep_bf16") \
    X(K_ATTN_PREP_FP8, "k_attn_prep_fp8") X(K_ATTENTION_F32, "k_attention_f32")                           \
    X(K_ATTENTION_BF16, "k_attention_bf16") X(K_ATTENTION_FP8, "k_attention_fp8")

#define GPU_K_ENUM(id, name) id,
enum { GPU_KERNELS(GPU_K_ENUM) K_COUNT };
#define GPU_K_NAME(id, name) name,
static const char *const gpu_kernel_names[K_COUNT] = {GPU_KERNELS(GPU_K_NAME)};

// Launch geometry constants shared with sass/ (each kernel's header states them).
#define GPU_LIN_ROWS 8      // output rows per 256-thread block of k_linear / k_moe_*
#define GPU_LIN_TT 8        // tokens per block of k_linear (LIN_TT)
#define GPU_GDN_VC 32       // value columns per block of k_gdn_rule (GDN_VC)

typedef struct {
    CUmodule mod;
    CUfunction fn[K_COUNT];
    const char *image;     // which image was loaded, for the log
} gpu_kernels;

static int gpu_kernels_load(gpu_kernels *k, const gpu_device *d, moet_err *e) {
    const unsigned char *img;
    if (d->cc_major == 9 && d->cc_minor == 0) img = gpu_img_sm90, k->image = "sm_90 cubin";
    else if (d->cc_major == 12 && d->cc_minor == 0) img = gpu_img_sm120, k->image = "sm_120 cubin";
    else if (d->cc_major == 12 && d->cc_minor == 1) img = gpu_img_sm121, k->image = "sm_121 cubin";
    else img = gpu_img_ptx90, k->image = "compute_90 PTX (compiled by the driver)";
    CUresult r = cu.cuModuleLoadData(&k->mod, img);
    if (r) {
        const char *name = "?";
        cu.cuGetErrorName(r, &name);
        return err_set(e, "cannot load the %s kernels on %s (compute capability %d.%d): %s", k->image, d->name, d->cc_major,
                       d->cc_minor, name);
    }
    for (int i = 0; i < K_COUNT; i++) CU_CHECK(cu.cuModuleGetFunction(&k->fn[i], k->mod, gpu_kernel_names[i]));
    return 0;
}

// gpu_launch(k, fn, grid, block, shared bytes, stream, args): one kernel launch, checked.
typedef struct {
    unsigned x, y, z;
} gpu_dim;

static void gpu_launch(const gpu_kernels *k, int fn, gpu_dim grid, unsigned block, unsigned smem, CUstream s, void **args) {
    MOET_ASSERT(grid.x && grid.y && grid.z, "empty grid for %s", gpu_kernel_names[fn]);
    CU_CHECK(cu.cuLaunchKernel(k->fn[fn], grid.x, grid.y, grid.z, block, 1, 1, smem, s, args, NULL));
}
#define GPU_ARGS(...) ((void *[]){__VA_ARGS__})
