/* The diff's per-row and per-sample loops (hsstore.compare.kernel), compiled by the host's C compiler at first use
 * and loaded through ctypes (hsstore.core.jit.native_library). Plain C99 with GCC/Clang vector extensions: the hot loop is
 * vectorized by hand, so the file compiles without fast-math: IEEE arithmetic, but for fused multiply-adds in the sums
 * (-ffp-contract=fast: one rounding instead of two); 1 - cos keeps its two roundings (a volatile product) and rounds
 * exactly as torch's float64 ops do. A row's sums add in float32 blocks of 8 terms a lane joined in float64 (within
 * 2^-21 of the terms' magnitudes with fused multiply-adds, 2^-20 on a CPU without them; torch's float32 sums are
 * looser), or in float64 products where float32's range could not hold them (sums_fit_float32); the sums are
 * written in float64, which holds the squares of every float32. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define W 16 /* lanes: one AVX-512 register of float32 (two AVX2 ones); 8-21% faster than 8 (scripts/bench_ulp.py) */
#define BLOCK 8 /* vectors per block: each lane adds 8 terms of each sum in float32, then the block joins a float64 sum */
typedef float fv __attribute__((vector_size(W * 4)));
typedef double dv __attribute__((vector_size(W * 8)));
typedef int32_t iv __attribute__((vector_size(W * 4)));

typedef int16_t hv __attribute__((vector_size(W * 2)));

#define ABS_MASK 0x7FFFFFFF
#define INF_BITS 0x7F800000

/* W values at j as float32: bf16 bit patterns (int16) widened, or float32 as they are */
static inline __attribute__((always_inline)) fv loadv(const void *row, int bf16, int64_t j) {
    fv f;
    if (bf16) {
        hv h;
        memcpy(&h, (const int16_t *)row + j, sizeof h);
        iv w = __builtin_convertvector(h, iv) << 16;
        memcpy(&f, &w, sizeof f);
    } else {
        memcpy(&f, (const float *)row + j, sizeof f);
    }
    return f;
}

static inline __attribute__((always_inline)) float load1(const void *row, int bf16, int64_t j) {
    if (bf16) {
        uint32_t w = (uint32_t)(uint16_t)((const int16_t *)row)[j] << 16;
        float f;
        memcpy(&f, &w, sizeof f);
        return f;
    }
    return ((const float *)row)[j];
}

/* bf16 bits to ints whose differences count ULPs: sign-magnitude to two's complement, +0 = -0 = 0 */
static inline int32_t ordered1(int32_t v) {
    int32_t s = v >> 15;
    return (v ^ (s & 0x7FFF)) - s;
}

static const int16_t STEPS[6] = {0, 1, 2, 4, 8, 16};

/* 32 lanes of int16: one AVX-512 register (two AVX2 ones); ~7% faster than 16 on this 2-core Xeon */
typedef int16_t hw __attribute__((vector_size(64)));
typedef uint16_t uw __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) hw orderedw(const int16_t *p) {
    hw v;
    memcpy(&v, p, sizeof v);
    hw s = v >> 15;
    return (v ^ (s & 0x7FFF)) - s; /* in [-32767, 32767] */
}

/* Counts of bf16 pairs more than 0, 1, 2, 4, 8, 16 ULPs apart, kept across rows in int16 lanes (a lane adds at most
 * one a vector) and added to the int64 counts every FLUSH vectors and at the end of a call: a flush a row was ~200
 * scalar adds, about the vector operations counting a row of 512 values takes */
#define FLUSH 16384
typedef struct {
    hw c[6];
    int64_t n; /* vectors counted since the last flush */
} ulp_lanes;

static void ulp_flush(ulp_lanes *u, int64_t *ulp) {
    for (int k = 0; k < 6; k++)
        for (int l = 0; l < (int)(sizeof(hw) / sizeof(int16_t)); l++) ulp[k] += u->c[k][l];
    memset(u->c, 0, sizeof u->c);
    u->n = 0;
}

/* Count one row's pairs into u (ulp: the int64 counts, for flushes and the tail): int16 lanes, the distance
 * |oa - ob| as uint16 (at most 65534), clamped to 17 so the signed compares hold */
static void ulp_row(const void *a, const void *b, int64_t H, ulp_lanes *u, int64_t *ulp) {
    const int16_t *pa = a, *pb = b;
    const int64_t lanes = sizeof(hw) / sizeof(int16_t), whole = H - H % lanes;
    int64_t j = 0;
    while (j < whole) {
        if (u->n == FLUSH) ulp_flush(u, ulp);
        const int64_t room = (FLUSH - u->n) * lanes, end = j + room < whole ? j + room : whole;
        hw c0 = u->c[0], c1 = u->c[1], c2 = u->c[2], c3 = u->c[3], c4 = u->c[4], c5 = u->c[5];
        for (int64_t k = j; k < end; k += lanes) {
            hw oa = orderedw(pa + k), ob = orderedw(pb + k);
            hw gt = oa > ob;
            hw hi = (oa & gt) | (ob & ~gt), lo = (ob & gt) | (oa & ~gt);
            uw dist = (uw)(hi - lo);
            hw small = dist < 17;
            hw e = ((hw)dist & small) | (17 & ~small);
            c0 -= e > STEPS[0]; /* a true compare is -1 */
            c1 -= e > STEPS[1];
            c2 -= e > STEPS[2];
            c3 -= e > STEPS[3];
            c4 -= e > STEPS[4];
            c5 -= e > STEPS[5];
        }
        u->c[0] = c0, u->c[1] = c1, u->c[2] = c2, u->c[3] = c3, u->c[4] = c4, u->c[5] = c5;
        u->n += (end - j) / lanes;
        j = end;
    }
    for (; j < H; j++) {
        int32_t e = ordered1(pa[j]) - ordered1(pb[j]);
        e = e < 0 ? -e : e;
        for (int k = 0; k < 6; k++) ulp[k] += e > STEPS[k];
    }
}

/* The lanes' sum, pairwise (halves added as vectors: four vector adds, not W - 1 dependent scalar ones) */
static inline double hsum(const dv *v) {
    double t[W];
    memcpy(t, v, sizeof t);
    for (int half = W / 2; half > 0; half /= 2)
        for (int k = 0; k < half; k++) t[k] += t[k + half];
    return t[0];
}

/* Whether a row's float sums added in float32 blocks (8 fused multiply-adds a lane: at most 8 roundings, each
 * within 2^-24 of the block's terms' magnitudes; 16 where the CPU has no fused multiply-add) hold what float64 products would: no term or block overflowed
 * (every sum finite and below 2^100) and none fell below float32's normal range, where rounding is absolute
 * (|a|^2 and |b|^2 at least 2^-100, and |d|^2 and |a.d| too unless d is 0). Residual streams are far inside; a row
 * outside is added again with float64 products. */
static inline int sums_fit_float32(double dd, double aa, double bb, double ad) {
    const double lo = 0x1p-100, hi = 0x1p100;
    if (!(aa >= lo && aa < hi && bb >= lo && bb < hi && dd < hi && fabs(ad) < hi)) return 0; /* NaN: 0 */
    return dd == 0.0 || (dd >= lo && fabs(ad) >= lo);
}

/* One row: the seven sums into out[k * ostride + r] (float64; k: sum |d|, max |d|, differing, |d|^2, |a|^2, |b|^2, a.d)
 * with d = a - b in float32; the float sums in float64, from blocks of 8 float32 terms a lane where f32 (else from
 * float64 products; 0 returned, nothing written, where f32 and the sums do not fit float32: the caller adds the row
 * again without f32); count and max |d| from d's bit patterns (NaN above infinity: a NaN d makes the max NaN and is not counted, as torch's
 * sign(NaN) is 0); with ulps, the pairs more than 0, 1, 2, 4, 8, 16 ULPs apart added to ulp. */
static inline __attribute__((always_inline)) int row_sums(const void *a, const void *b, int a16, int b16, int ulps,
                                                          int f32, int64_t H, int64_t ostride, int64_t r, double *out,
                                                          ulp_lanes *u, int64_t *ulp) {
    dv DD = {0}, AA = {0}, BB = {0}, AD = {0};
    dv S_abs = {0};
    iv nd = {0}, mx = {0};
    const int64_t whole = H - H % W;
    int64_t j = 0;
    while (j < whole) {
        fv s_abs = {0}, dd32 = {0}, aa32 = {0}, bb32 = {0}, ad32 = {0};
        const int64_t end = j + W * BLOCK < whole ? j + W * BLOCK : whole;
        for (; j < end; j += W) {
            fv x = loadv(a, a16, j), y = loadv(b, b16, j);
            fv d = x - y;
            iv bits;
            memcpy(&bits, &d, sizeof bits);
            iv v = bits & ABS_MASK;
            nd -= v != 0; /* a true compare is -1; a NaN d is counted here and taken off after the row */
            iv gt = v > mx;
            mx = (v & gt) | (mx & ~gt);
            fv dabs;
            memcpy(&dabs, &v, sizeof dabs);
            if (f32) { /* fused multiply-adds in float32, 8 a lane, then float64 (sums_fit_float32 says when) */
                s_abs += dabs; /* |d| exactly; 8 float32 terms a lane, then float64 */
                dd32 += d * d;
                aa32 += x * x;
                bb32 += y * y;
                ad32 += x * d;
            } else { /* squares and products in float64: exact for every float32 (no underflow, no overflow) */
                dv X = __builtin_convertvector(x, dv), Y = __builtin_convertvector(y, dv);
                dv D = __builtin_convertvector(d, dv);
                S_abs += __builtin_convertvector(dabs, dv); /* 8 |d| near float32's largest would overflow it */
                DD += D * D;
                AA += X * X;
                BB += Y * Y;
                AD += X * D;
            }
        }
        if (f32) {
            S_abs += __builtin_convertvector(s_abs, dv);
            DD += __builtin_convertvector(dd32, dv);
            AA += __builtin_convertvector(aa32, dv);
            BB += __builtin_convertvector(bb32, dv);
            AD += __builtin_convertvector(ad32, dv);
        }
    }
    double s_abs = hsum(&S_abs), dd = hsum(&DD), aa = hsum(&AA), bb = hsum(&BB), ad = hsum(&AD);
    if (f32 && !sums_fit_float32(dd, aa, bb, ad)) return 0;
    int64_t count = 0;
    int32_t m = 0;
    for (int k = 0; k < W; k++) {
        count += nd[k];
        m = mx[k] > m ? mx[k] : m;
    }
    if (m > INF_BITS) /* a NaN d (max |d| is NaN): count again without the NaNs, as torch's sign(NaN) is 0 */
        for (int64_t i = count = 0; i < whole; i++) {
            float d = load1(a, a16, i) - load1(b, b16, i);
            int32_t bits;
            memcpy(&bits, &d, sizeof bits);
            count += (bits & ABS_MASK) != 0 && (bits & ABS_MASK) <= INF_BITS;
        }
    for (; j < H; j++) {
        float x = load1(a, a16, j), y = load1(b, b16, j);
        float d = x - y;
        int32_t bits;
        memcpy(&bits, &d, sizeof bits);
        int32_t v = bits & ABS_MASK;
        count += (v != 0) - (v > INF_BITS);
        m = v > m ? v : m;
        double X = x, Y = y, D = d; /* squares and products in float64, as the vector loop's */
        s_abs += fabs(D);
        dd += D * D;
        aa += X * X;
        bb += Y * Y;
        ad += X * D;
    }
    float max_abs;
    memcpy(&max_abs, &m, sizeof max_abs);
    out[0 * ostride + r] = s_abs;
    out[1 * ostride + r] = max_abs;
    out[2 * ostride + r] = (double)count;
    out[3 * ostride + r] = dd; /* float64: the squares of a token of 1e-30s (or their sums at 1e18s) fit */
    out[4 * ostride + r] = aa;
    out[5 * ostride + r] = bb;
    out[6 * ostride + r] = ad;
    if (ulps) ulp_row(a, b, H, u, ulp);
    return 1;
}

#define ROWS(NAME, A16, B16, ULPS)                                                                                    \
    static void NAME(const void *a, const void *b, int64_t T, int64_t H, double *out, int64_t os, int64_t *ulp) {   \
        ulp_lanes u;                                                                                                 \
        memset(&u, 0, sizeof u);                                                                                     \
        for (int64_t r = 0; r < T; r++) {                                                                            \
            const char *ra = (const char *)a + r * H * ((A16) ? 2 : 4), *rb = (const char *)b + r * H * ((B16) ? 2 : 4); \
            if (!row_sums(ra, rb, A16, B16, ULPS, 1, H, os, r, out, &u, ulp))                                        \
                row_sums(ra, rb, A16, B16, ULPS, 0, H, os, r, out, &u, ulp);                                         \
        }                                                                                                            \
        if (ULPS) ulp_flush(&u, ulp);                                                                                \
    }
ROWS(rows_ff, 0, 0, 0)
ROWS(rows_hf, 1, 0, 0)
ROWS(rows_fh, 0, 1, 0)
ROWS(rows_hh, 1, 1, 0)
ROWS(rows_hh_ulp, 1, 1, 1)

/* Per row of a, b [T, H] (row-major; bf16 as int16 bit patterns where a16/b16, else float32): the seven sums into
 * out [7, T] (float64, its rows ostride doubles apart); where ulps (both bf16), the counts of pairs more than 0, 1, 2, 4, 8, 16 ULPs apart added to ulp [6]. */
void hsstore_fused_rows(const void *a, const void *b, int a16, int b16, int ulps, int64_t T, int64_t H, double *out,
                        int64_t ostride, int64_t *ulp) {
    if (a16 && b16)
        (ulps ? rows_hh_ulp : rows_hh)(a, b, T, H, out, ostride, ulp);
    else if (a16)
        rows_hf(a, b, T, H, out, ostride, ulp);
    else if (b16)
        rows_fh(a, b, T, H, out, ostride, ulp);
    else
        rows_ff(a, b, T, H, out, ostride, ulp);
}

/* divergence.one_minus_cos of one token: the same float64 operations in the same order, each rounded as IEEE says
 * (gap * gap rounded before the subtraction, as torch's kernels do), the clamps keeping a NaN as torch's do */
static double one_minus_cos(double d, double a2, double b2, double ad) {
    double na = sqrt(a2), nb = sqrt(b2);
    double norm_sum = na + nb;
    if (norm_sum < 1e-300) norm_sum = 1e-300;
    double gap = (2.0 * ad - d) / norm_sum;
    volatile double gap2 = gap * gap; /* rounded on its own: no fused multiply-add here (the file allows them) */
    double num = d - gap2;
    if (num < 0.0) num = 0.0;
    double den = 2.0 * na * nb;
    double v;
    if (den > 0.0)
        v = num / (den >= 1e-300 ? den : 1e-300);
    else
        v = na == nb ? 0.0 : 1.0;
    if (v < 0.0)
        v = 0.0;
    else if (v > 2.0)
        v = 2.0;
    return v;
}

/* torch.bucketize's bin of v: i with edges[i-1] < v <= edges[i]; a NaN in the last bin */
static int64_t bin(const double *edges, int64_t n, double v) {
    if (v != v) return n;
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (edges[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* One sample's per-layer sums from its per-token sums [L, T] (float64, row-major), as divergence.summarize makes them
 * with torch's ops: into sums [L, 5] the float64 sums of sum |d|, of the differing counts, of |d|^2, of |b|^2 and of
 * 1 - cos; into maxes [L, 2] max |d| and max 1 - cos (NaN if any is, as torch's amax); into hist [L, n_edges + 1] the
 * tokens per bin of 1 - cos. */
void hsstore_summary_rows(const double *dd, const double *aa, const double *bb, const double *ad, const double *sum_abs,
                          const double *differing, const double *max_abs, int64_t L, int64_t T, const double *edges,
                          int64_t n_edges, double *sums, double *maxes, int64_t *hist) {
    for (int64_t layer = 0; layer < L; layer++) {
        double s_abs = 0.0, s_diff = 0.0, s_dd = 0.0, s_bb = 0.0, s_omc = 0.0, m_abs = 0.0, m_omc = 0.0;
        for (int64_t t = 0; t < T; t++) {
            int64_t i = layer * T + t;
            double d = dd[i], b2 = bb[i];
            double v = one_minus_cos(d, aa[i], b2, ad[i]);
            s_abs += sum_abs[i];
            s_diff += differing[i];
            s_dd += d;
            s_bb += b2;
            s_omc += v;
            double m = max_abs[i];
            if (t == 0 || (m_abs == m_abs && (m > m_abs || m != m))) m_abs = m; /* a NaN stays the max */
            if (t == 0 || (m_omc == m_omc && (v > m_omc || v != v))) m_omc = v;
            hist[layer * (n_edges + 1) + bin(edges, n_edges, v)] += 1;
        }
        double *s = sums + layer * 5;
        s[0] = s_abs, s[1] = s_diff, s[2] = s_dd, s[3] = s_bb, s[4] = s_omc;
        maxes[layer * 2] = m_abs, maxes[layer * 2 + 1] = m_omc;
    }
}
