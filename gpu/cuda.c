// gpu/cuda.c — the CUDA Driver API, loaded at run time.
//
// libcuda.so.1 is opened with dlopen, so the same binary starts on a machine without a GPU (the
// CPU backend then serves). Only the entry points in the table below are used; no cudart, no
// cuda.h: the few types and constants are declared here. Every call goes through CU_CHECK,
// which names the call, its error name and string, file and line on stderr and aborts
// (arena/DESIGN.md §1: GPU failures are tier-1 errors); gpu_open is the one place that turns a missing
// driver or device into an ordinary error, so `--backend auto` can fall back.

typedef int CUresult;             // 0 = CUDA_SUCCESS
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;

enum {
    GPU_ATTR_MULTIPROCESSOR_COUNT = 16,
    GPU_ATTR_INTEGRATED = 18,
    GPU_ATTR_MEMORY_CLOCK_RATE = 36,   // kHz
    GPU_ATTR_GLOBAL_MEMORY_BUS_WIDTH = 37,
    GPU_ATTR_L2_CACHE_SIZE = 38,
    GPU_ATTR_CC_MAJOR = 75,
    GPU_ATTR_CC_MINOR = 76,
    GPU_ATTR_SMEM_OPTIN = 97,
};
#define GPU_FUNC_ATTR_MAX_DYN_SMEM 8

// cuLaunchKernelEx's configuration (cuda.h: CUlaunchConfig, CUlaunchAttribute): one attribute is
// used, programmatic stream serialisation (id 6, an int), which lets a kernel start while its
// predecessor in the stream runs (sass/common.cuh: GPU_DEP).
#define GPU_LAUNCH_ATTR_PROGRAMMATIC 6
typedef struct {
    int id;
    char pad[4];
    union {
        char bytes[64];
        long long align;
        int value;
    } v;
} gpu_launch_attr;
typedef struct {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, smem;
    CUstream stream;
    gpu_launch_attr *attrs;
    unsigned n_attrs;
} gpu_launch_config;
_Static_assert(sizeof(gpu_launch_attr) == 72 && sizeof(gpu_launch_config) == 56, "cuda.h's CUlaunchAttribute and CUlaunchConfig");
// CUDA graphs (cuda.h: CUgraph, CUgraphExec, CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v2): a decode
// step captured once and replayed (gpu/engine.c: gpu_graph); of its nodes only the kernel
// parameters are read, and the grid of some set again.
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct {
    CUfunction func;
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, smem;
    void **params;   // the node's copies of the arguments (valid while the graph lives)
    void **extra;
    void *kern;
    CUcontext ctx;
} gpu_kernel_node;
_Static_assert(sizeof(gpu_kernel_node) == 72, "cuda.h's CUDA_KERNEL_NODE_PARAMS_v2");
#define GPU_CAPTURE_RELAXED 2   // CU_STREAM_CAPTURE_MODE_RELAXED
#define GPU_NODE_KERNEL 0       // CU_GRAPH_NODE_TYPE_KERNEL
#define GPU_STREAM_NON_BLOCKING 1
#define GPU_MEMHOSTALLOC_PORTABLE 1

// The entry points used, with the exported symbol each resolves to (the _v2 names are what
// cuda.h maps the plain names to).
#define GPU_API(X)                                                                                   \
    X(cuInit, "cuInit", CUresult, (unsigned))                                                         \
    X(cuGetErrorName, "cuGetErrorName", CUresult, (CUresult, const char **))                          \
    X(cuGetErrorString, "cuGetErrorString", CUresult, (CUresult, const char **))                      \
    X(cuDeviceGetCount, "cuDeviceGetCount", CUresult, (int *))                                        \
    X(cuDeviceGet, "cuDeviceGet", CUresult, (CUdevice *, int))                                        \
    X(cuDeviceGetName, "cuDeviceGetName", CUresult, (char *, int, CUdevice))                          \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", CUresult, (int *, int, CUdevice))                 \
    X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", CUresult, (size_t *, CUdevice))                        \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult, (CUcontext *, CUdevice))        \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", CUresult, (CUdevice))                \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", CUresult, (CUcontext))                                      \
    X(cuCtxSynchronize, "cuCtxSynchronize", CUresult, (void))                                         \
    X(cuMemGetInfo, "cuMemGetInfo_v2", CUresult, (size_t *, size_t *))                                \
    X(cuMemAlloc, "cuMemAlloc_v2", CUresult, (CUdeviceptr *, size_t))                                 \
    X(cuMemFree, "cuMemFree_v2", CUresult, (CUdeviceptr))                                             \
    X(cuMemHostAlloc, "cuMemHostAlloc", CUresult, (void **, size_t, unsigned))                        \
    X(cuMemFreeHost, "cuMemFreeHost", CUresult, (void *))                                             \
    X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", CUresult, (CUdeviceptr, const void *, size_t))                 \
    X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", CUresult, (void *, CUdeviceptr, size_t))                       \
    X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", CUresult, (CUdeviceptr, const void *, size_t, CUstream)) \
    X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", CUresult, (void *, CUdeviceptr, size_t, CUstream))   \
    X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream)) \
    X(cuMemsetD8, "cuMemsetD8_v2", CUresult, (CUdeviceptr, unsigned char, size_t))                    \
    X(cuMemsetD8Async, "cuMemsetD8Async", CUresult, (CUdeviceptr, unsigned char, size_t, CUstream))   \
    X(cuModuleLoadData, "cuModuleLoadData", CUresult, (CUmodule *, const void *))                     \
    X(cuModuleUnload, "cuModuleUnload", CUresult, (CUmodule))                                         \
    X(cuModuleGetFunction, "cuModuleGetFunction", CUresult, (CUfunction *, CUmodule, const char *))   \
    X(cuFuncSetAttribute, "cuFuncSetAttribute", CUresult, (CUfunction, int, int))                     \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", CUresult, (const gpu_launch_config *, CUfunction, void **, void **)) \
    X(cuStreamCreate, "cuStreamCreate", CUresult, (CUstream *, unsigned))                             \
    X(cuStreamDestroy, "cuStreamDestroy_v2", CUresult, (CUstream))                                    \
    X(cuStreamSynchronize, "cuStreamSynchronize", CUresult, (CUstream))                               \
    X(cuStreamWaitEvent, "cuStreamWaitEvent", CUresult, (CUstream, CUevent, unsigned))                \
    X(cuEventCreate, "cuEventCreate", CUresult, (CUevent *, unsigned))                                \
    X(cuEventDestroy, "cuEventDestroy_v2", CUresult, (CUevent))                                       \
    X(cuEventRecord, "cuEventRecord", CUresult, (CUevent, CUstream))                                  \
    X(cuEventSynchronize, "cuEventSynchronize", CUresult, (CUevent))                                  \
    X(cuEventElapsedTime, "cuEventElapsedTime_v2", CUresult, (float *, CUevent, CUevent))              \
    X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", CUresult, (CUstream, int))                     \
    X(cuStreamEndCapture, "cuStreamEndCapture", CUresult, (CUstream, CUgraph *))                      \
    X(cuGraphInstantiate, "cuGraphInstantiateWithFlags", CUresult, (CUgraphExec *, CUgraph, unsigned long long)) \
    X(cuGraphUpload, "cuGraphUpload", CUresult, (CUgraphExec, CUstream))                              \
    X(cuGraphLaunch, "cuGraphLaunch", CUresult, (CUgraphExec, CUstream))                              \
    X(cuGraphGetNodes, "cuGraphGetNodes", CUresult, (CUgraph, CUgraphNode *, size_t *))               \
    X(cuGraphNodeGetType, "cuGraphNodeGetType", CUresult, (CUgraphNode, int *))                       \
    X(cuGraphKernelNodeGetParams, "cuGraphKernelNodeGetParams_v2", CUresult, (CUgraphNode, gpu_kernel_node *)) \
    X(cuGraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams_v2", CUresult, (CUgraphExec, CUgraphNode, const gpu_kernel_node *)) \
    X(cuGraphNodeSetEnabled, "cuGraphNodeSetEnabled", CUresult, (CUgraphExec, CUgraphNode, unsigned)) \
    X(cuGraphNodeGetEnabled, "cuGraphNodeGetEnabled", CUresult, (CUgraphExec, CUgraphNode, unsigned *)) \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", CUresult, (CUgraphExec))                              \
    X(cuGraphDestroy, "cuGraphDestroy", CUresult, (CUgraph))

#define GPU_API_FIELD(name, sym, ret, args) ret(*name) args;
static struct {
    void *lib;
    GPU_API(GPU_API_FIELD)
} cu;

// CU_CHECK(cuX(...)): a failed call is a broken invariant (or a dead GPU): say which, abort.
#define CU_CHECK(call) gpu_check((call), #call, __FILE__, __LINE__)
static void gpu_check(CUresult r, const char *call, const char *file, int line) {
    if (r == 0) return;
    const char *name = "?", *str = "?";
    if (cu.cuGetErrorName) cu.cuGetErrorName(r, &name);
    if (cu.cuGetErrorString) cu.cuGetErrorString(r, &str);
    moet_die_at(file, line, "%s failed: %s (%d): %s", call, name, r, str);
}

// What the device says about itself at boot.
typedef struct {
    CUdevice dev;
    CUcontext ctx;
    char name[256];
    int cc_major, cc_minor, sms, integrated, smem_optin, l2_bytes;
    size_t total_mem;
    double peak_gbs;   // from the memory clock and bus width (a datasheet figure, for the log)
} gpu_device;

// The arena's pinned and device kinds (arena/arena.c), on the Driver API.
static void *gpu_arena_alloc(int kind, size_t bytes) {
    if (kind == ARENA_PINNED) {
        void *p = NULL;
        return cu.cuMemHostAlloc(&p, bytes, GPU_MEMHOSTALLOC_PORTABLE) ? NULL : p;
    }
    CUdeviceptr d = 0;
    return cu.cuMemAlloc(&d, bytes) ? NULL : (void *)(uintptr_t)d;
}
static void gpu_arena_free(int kind, void *p) {
    if (kind == ARENA_PINNED) CU_CHECK(cu.cuMemFreeHost(p));
    else CU_CHECK(cu.cuMemFree((CUdeviceptr)(uintptr_t)p));
}
static void gpu_arena_fill(int kind, void *p, int byte, size_t bytes) {
    if (kind == ARENA_PINNED) memset(p, byte, bytes);
    else CU_CHECK(cu.cuMemsetD8((CUdeviceptr)(uintptr_t)p, (unsigned char)byte, bytes));
}

// Loads libcuda and opens device 0 with its primary context, current in this thread. Returns
// -1 with e saying why when there is no driver or no device (not an abort: `auto` falls back).
static int gpu_open(gpu_device *d, moet_err *e) {
    memset(d, 0, sizeof *d);
    if (!cu.lib) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return err_set(e, "no NVIDIA driver: cannot load libcuda.so.1 (%s)", dlerror());
#define GPU_API_LOAD(name, sym, ret, args)                                                     \
        *(void **)&cu.name = dlsym(lib, sym);                                                  \
        if (!cu.name) {                                                                        \
            dlclose(lib);                                                                      \
            memset(&cu, 0, sizeof cu);                                                         \
            return err_set(e, "libcuda.so.1 has no %s (driver too old for this program)", sym); \
        }
        GPU_API(GPU_API_LOAD)
#undef GPU_API_LOAD
        cu.lib = lib;
    }
    // every kernel of a module loaded when the module is (the driver's default is lazily, at a
    // kernel's first launch: host allocations and page faults after the ready line)
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    CUresult r = cu.cuInit(0);
    if (r) {
        const char *name = "?";
        cu.cuGetErrorName(r, &name);
        return err_set(e, "the NVIDIA driver found no usable GPU (cuInit: %s)", name);
    }
    int n = 0;
    if (cu.cuDeviceGetCount(&n) || n < 1) return err_set(e, "the NVIDIA driver reports no GPU");
    CU_CHECK(cu.cuDeviceGet(&d->dev, 0));
    CU_CHECK(cu.cuDeviceGetName(d->name, (int)sizeof d->name, d->dev));
    CU_CHECK(cu.cuDeviceGetAttribute(&d->cc_major, GPU_ATTR_CC_MAJOR, d->dev));
    CU_CHECK(cu.cuDeviceGetAttribute(&d->cc_minor, GPU_ATTR_CC_MINOR, d->dev));
    CU_CHECK(cu.cuDeviceGetAttribute(&d->sms, GPU_ATTR_MULTIPROCESSOR_COUNT, d->dev));
    CU_CHECK(cu.cuDeviceGetAttribute(&d->integrated, GPU_ATTR_INTEGRATED, d->dev));
    CU_CHECK(cu.cuDeviceGetAttribute(&d->smem_optin, GPU_ATTR_SMEM_OPTIN, d->dev));
    CU_CHECK(cu.cuDeviceGetAttribute(&d->l2_bytes, GPU_ATTR_L2_CACHE_SIZE, d->dev));
    int clk = 0, bus = 0;
    CU_CHECK(cu.cuDeviceGetAttribute(&clk, GPU_ATTR_MEMORY_CLOCK_RATE, d->dev));
    CU_CHECK(cu.cuDeviceGetAttribute(&bus, GPU_ATTR_GLOBAL_MEMORY_BUS_WIDTH, d->dev));
    d->peak_gbs = 2.0 * clk * 1e3 * (bus / 8) / 1e9;
    CU_CHECK(cu.cuDeviceTotalMem(&d->total_mem, d->dev));
    if (d->cc_major < 9)
        return err_set(e, "%s has compute capability %d.%d; moet's kernels need 9.0 or newer (H100/H200, RTX 50xx, GB10)", d->name,
                       d->cc_major, d->cc_minor);
    CU_CHECK(cu.cuDevicePrimaryCtxRetain(&d->ctx, d->dev));
    CU_CHECK(cu.cuCtxSetCurrent(d->ctx));
    arena_gpu = (arena_gpu_ops){gpu_arena_alloc, gpu_arena_free, gpu_arena_fill};
    return 0;
}

// Makes the device's context current in the calling thread (loader threads).
static void gpu_bind(const gpu_device *d) { CU_CHECK(cu.cuCtxSetCurrent(d->ctx)); }

static void gpu_close(gpu_device *d) {
    if (d->ctx) {
        CU_CHECK(cu.cuCtxSynchronize());
        CU_CHECK(cu.cuDevicePrimaryCtxRelease(d->dev));
    }
    d->ctx = NULL;
}

static void gpu_describe(const gpu_device *d, FILE *f) {
    fprintf(f, "moet: GPU 0: %s, compute capability %d.%d, %d SMs, %.1f GiB%s, L2 %d MiB\n", d->name, d->cc_major, d->cc_minor,
            d->sms, (double)d->total_mem / (1u << 30), d->integrated ? " (unified with the host)" : "", d->l2_bytes >> 20);
}
