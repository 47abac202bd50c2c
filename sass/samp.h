// sass/samp.h — the sampler's arithmetic that the host (moet.c: samp_pick, the CPU twin) and the
// device (sass/sample.cu: k_sample) both run, written once so that a pick is the same token on
// either: the generator (xoshiro256** seeded by splitmix64) and e^y from IEEE basic operations
// alone. C and CUDA alike; on the device every double product and sum is an explicit
// round-to-nearest operation (SAMP_MUL, SAMP_ADD: __dmul_rn, __dadd_rn), which the compiler may
// not fuse into an FMA, and on the host a function of its own (nothing to contract).
#ifndef MOET_SAMP_H
#define MOET_SAMP_H

#ifdef __CUDACC__
#define SAMP_HD __host__ __device__ __forceinline__
#else
#define SAMP_HD static inline
#endif
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
#define SAMP_MUL(a, b) __dmul_rn(a, b)
#define SAMP_ADD(a, b) __dadd_rn(a, b)
#define SAMP_BITS_D(u) __longlong_as_double((long long)(u))
#else
// (functions, not operators: a compiler that contracts a · b + c within one expression sees none)
SAMP_HD double samp_mul(double a, double b) { return a * b; }
SAMP_HD double samp_add(double a, double b) { return a + b; }
#define SAMP_MUL(a, b) samp_mul(a, b)
#define SAMP_ADD(a, b) samp_add(a, b)
SAMP_HD double samp_bits_d(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
#define SAMP_BITS_D(u) samp_bits_d(u)
#endif

// ---- the generator ---------------------------------------------------------------------------

typedef struct {
    uint64_t s[4];
} samp_rng;

SAMP_HD uint64_t samp_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

SAMP_HD void samp_seed(samp_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = samp_splitmix(&seed);
}

SAMP_HD uint64_t samp_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

SAMP_HD uint64_t samp_next(samp_rng *r) {
    uint64_t *s = r->s, out = samp_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = samp_rotl(s[3], 45);
    return out;
}

// Uniform in [0, 1) with 53 random bits (the conversion and the power-of-two product are exact).
SAMP_HD double samp_uniform(samp_rng *r) { return (double)(samp_next(r) >> 11) * (1.0 / 9007199254740992.0); }

// ---- e^y ---------------------------------------------------------------------------------------
//
// The sampler's probabilities relative to the most likely token, exp((x − top) / T), through
// samp_expf rather than libm's expf, whose last bit may differ between libraries, between the
// variants one library picks by processor (glibc's FMA build), and from the device's. In double:
// y = (32m + j) · ln2/32 + r with k = 32m + j the nearest integer to y · 32/ln2 (rounded by adding
// and subtracting 1.5 · 2^52), |r| ≤ ln2/64 (r from ln2/32's high 37 bits, which k multiplies
// exactly, then its low part); e^r by its Taylor series to r^5 (what it leaves out is below 2^-48
// of the result); times 2^(j/32) (the table, each entry the double nearest it) and 2^m (exponent
// bits; m ≥ −151 here, far from double's subnormals); then rounded once to float, which makes
// float subnormals where the result is one. The double result is within about 2^-48 of e^y, so
// the float is e^y correctly rounded but where e^y lies that close to a rounding boundary (2 of
// the 3 · 10^8 floats in [−104, −2^-30] round the other way from libm's exp in double).
// tests/test_sampler.c checks every float y ≤ 0: the result never falls as y grows (what the
// sampler's bound on the tokens it leaves out needs: moet.c, "the pick") and is within an ulp of
// libm's exp in double, rounded to float.
#define SAMP_EXP_TAB                                                                                                         \
    {0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0, 0x1.172b83c7d517bp+0,         \
     0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0, 0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0,         \
     0x1.3dea64c123422p+0, 0x1.44e086061892dp+0, 0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0,         \
     0x1.6247eb03a5585p+0, 0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,         \
     0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0, 0x1.ae89f995ad3adp+0,         \
     0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0, 0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0,         \
     0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0}
#ifdef __CUDACC__
__device__ __constant__ double samp_exp_tab_dev[32] = SAMP_EXP_TAB;
#endif
static const double samp_exp_tab_host[32] = SAMP_EXP_TAB;
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
#define SAMP_EXP_TABLE samp_exp_tab_dev
#else
#define SAMP_EXP_TABLE samp_exp_tab_host
#endif

SAMP_HD float samp_expf(float y) {
    if (y != y) return y;             // NaN stays NaN (no candidate: the sampler keeps f > 0)
    if (y < -104.0f) return 0.0f;     // e^-104 < 2^-150: rounds to 0
    if (y > 88.5f) return y > 88.72284f ? (float)INFINITY : (float)3.4e38;   // (not reached: y ≤ 0)
    const double x = y;
    const double z = SAMP_MUL(x, 0x1.71547652b82fep+5);   // y · 32/ln2
    const double kd = SAMP_ADD(SAMP_ADD(z, 0x1.8p52), -0x1.8p52);
    const int k = (int)kd;
    const double r0 = SAMP_ADD(x, -SAMP_MUL(kd, 0x1.62e42fefa0000p-6));   // (kd · hi exact)
    const double r = SAMP_ADD(r0, -SAMP_MUL(kd, 0x1.cf79abc9e3b3ap-45));
    // 1 + r + r²/2 + … + r⁵/120 in two independent halves (a shorter chain than Horner's):
    // (1 + r + r²/2) + r³ (1/6 + r/24 + r²/120)
    const double r2 = SAMP_MUL(r, r), r3 = SAMP_MUL(r2, r);
    const double lo = SAMP_ADD(SAMP_ADD(1.0, r), SAMP_MUL(r2, 0.5));
    const double hi = SAMP_ADD(SAMP_ADD(1.0 / 6, SAMP_MUL(r, 1.0 / 24)), SAMP_MUL(r2, 1.0 / 120));
    const double p = SAMP_ADD(lo, SAMP_MUL(r3, hi));
    const int j = k & 31, m = (k - j) / 32;   // k = 32m + j, 0 ≤ j < 32
    const double scale = SAMP_BITS_D((uint64_t)(m + 1023) << 52);
    return (float)SAMP_MUL(SAMP_MUL(p, SAMP_EXP_TABLE[j]), scale);
}

#endif
