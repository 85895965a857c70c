/* Normalizes each column of R's matrix view in place, one work-group per column: what
 * normalize_axes.cl computes (the same MODE, epsilon p0, gamma `scale` and beta `shift`) for groups
 * that are a whole column (the last axis: GROUP = m, INNER = 1; a LayerNormalization or Softmax of
 * the features), with the group's WG items sharing its elements and summing them as a tree in
 * local memory (one item walking a column of 256 floats, as normalize_axes does, left most of a
 * GPU idle: 104 us for 128 columns on an H200, against a few for the group's items together).
 *
 * MODE: 0 softmax, 1 softmax as exp(x - logsumexp x), 2 layer normalization ((x - first) -
 * (mean - first), first the column's first element: see normalize_axes.cl), 3 RMS scaling,
 * 4 unit (L2) normalization. GROUP is m (the plan sets it: the range is m / GROUP x WG by n).
 * WG (a power of two) items per column. The
 * padding is never touched. The runtime prepends MALINN_INDEX_R(row, col, prows, pcols); h, w are
 * R's padded rows and columns. OpenCL C 1.2.
 */
#ifndef GROUP
#define GROUP 1
#endif
#ifndef MODE
#define MODE 0
#endif
#ifndef CENTER
#define CENTER 0
#endif
#ifndef SCALE
#define SCALE 0
#endif
#ifndef WG
#define WG 64
#endif

#define AT(g) r[MALINN_INDEX_R((g), col, h, w)]

/* The sum (MAXIMUM 0) or the largest (MAXIMUM 1) of every item's v, as a tree in red. */
float malinn_group_reduce(__local float *red, float v, const uint lid, const int maximum)
{
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint span = WG / 2; span > 0; span >>= 1) {
        if (lid < span)
            red[lid] = maximum ? fmax(red[lid], red[lid + span]) : red[lid] + red[lid + span];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float result = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);   /* every item has read it before red is written again */
    return result;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void normalize_columns(uint m, uint n, uint h, uint w, float p0,
                       __global float *r,
                       __global const float *scale,
                       __global const float *shift)
{
    const uint lid = get_local_id(0);
    const uint col = get_group_id(1);
    __local float red[WG];
#if MODE == 0 || MODE == 1
    float top = -INFINITY;
    for (uint g = lid; g < m; g += WG)
        top = fmax(top, AT(g));
    top = malinn_group_reduce(red, top, lid, 1);
    float part = 0.0f;
    for (uint g = lid; g < m; g += WG)
        part += exp(AT(g) - top);
    const float total = malinn_group_reduce(red, part, lid, 0);
#if MODE == 0
    for (uint g = lid; g < m; g += WG)
        AT(g) = exp(AT(g) - top) / total;
#else
    const float lse = top + log(total);
    for (uint g = lid; g < m; g += WG)
        AT(g) = exp(AT(g) - lse);
#endif
#elif MODE == 2 || MODE == 3
    const float first = AT(0);
    float part = 0.0f;
    for (uint g = lid; g < m; g += WG)
        part += AT(g) - first;
    const float offset = malinn_group_reduce(red, part, lid, 0) / m;   /* mean - first */
    part = 0.0f;
    for (uint g = lid; g < m; g += WG) {
        const float d = (AT(g) - first) - offset;
        part += d * d;
    }
    const float inv0 = rsqrt(malinn_group_reduce(red, part, lid, 0) / m + p0);
    barrier(CLK_GLOBAL_MEM_FENCE);   /* every item has read the first element before item 0 rewrites it */
    for (uint g = lid; g < m; g += WG) {
#if SCALE
        const float inv = inv0 * scale[g];
#else
        const float inv = inv0;
#endif
#if MODE == 2
#if CENTER
        AT(g) = ((AT(g) - first) - offset) * inv + shift[g];
#else
        AT(g) = ((AT(g) - first) - offset) * inv;
#endif
#else
        AT(g) = AT(g) * inv;
#endif
    }
#else
    float part = 0.0f;
    for (uint g = lid; g < m; g += WG)
        part += AT(g) * AT(g);
    const float squares = malinn_group_reduce(red, part, lid, 0);
    const float inv = rsqrt(squares < p0 ? p0 : squares);   /* a NaN sum stays NaN */
    for (uint g = lid; g < m; g += WG)
        AT(g) = AT(g) * inv;
#endif
}
